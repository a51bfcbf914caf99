package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// NetRouteTo answers the interface and source address the node uses to
// reach an address (net_route_to).
func NetRouteTo(req *abi.NetRouteToRequest) (*abi.NetRoute, error) {
	resp := new(abi.NetRoute)
	return resp, call(netRouteTo, abi.HostCallNetRouteTo, req, resp)
}

// NetInterfaces lists the node's interfaces and addresses (net_interfaces).
func NetInterfaces() (*abi.NetInterfaces, error) {
	resp := new(abi.NetInterfaces)
	return resp, call(netInterfaces, abi.HostCallNetInterfaces, &abi.Empty{}, resp)
}
