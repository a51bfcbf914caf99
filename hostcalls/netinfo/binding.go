package netinfo

import (
	"context"
	"net/netip"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the net host calls.
const Family = "net"

// Bindings returns the "net" host calls (see abi/hc_net.go). They read the
// daemon's own network namespace and take no roots. Each call opens its own
// rtnetlink socket (tens of microseconds), so the bindings hold no state.
func Bindings() []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallNetRouteTo, routeToCall),
		hostcalls.Typed(Family, abi.HostCallNetInterfaces, interfacesCall),
	}
}

func routeToCall(ctx context.Context, env *hostcalls.Env, req *abi.NetRouteToRequest) (*abi.NetRoute, error) {
	ip, err := netip.ParseAddr(req.IP)
	if err != nil {
		return nil, abi.Errorf(abi.InvalidArgument, "net_route_to: %q is not an IP address", req.IP)
	}
	n, err := Open()
	if err != nil {
		return nil, err
	}
	defer n.Close()
	r, err := n.RouteTo(ctx, ip)
	if err != nil {
		return nil, err
	}
	out := &abi.NetRoute{Interface: r.Interface}
	if r.Src.IsValid() {
		out.Src = r.Src.String()
	}
	if r.Gateway.IsValid() {
		out.Gateway = r.Gateway.String()
	}
	return out, nil
}

func interfacesCall(ctx context.Context, env *hostcalls.Env, req *abi.Empty) (*abi.NetInterfaces, error) {
	n, err := Open()
	if err != nil {
		return nil, err
	}
	defer n.Close()
	ifs, err := n.Interfaces(ctx)
	if err != nil {
		return nil, err
	}
	out := &abi.NetInterfaces{Interfaces: make([]abi.NetInterface, 0, len(ifs))}
	for _, i := range ifs {
		w := abi.NetInterface{Name: i.Name, Index: int32(i.Index), Up: i.Up, Running: i.Running,
			Loopback: i.Loopback, MTU: int32(i.MTU), HardwareAddr: i.HardwareAddr}
		for _, a := range i.Addrs {
			w.Addrs = append(w.Addrs, a.String())
		}
		out.Interfaces = append(out.Interfaces, w)
	}
	return out, nil
}
