// Package netinfo answers two questions about the node's network over
// rtnetlink: which interfaces it has (name, state, addresses), and which
// interface and source address the kernel would use to reach a given IP.
// The iSCSI initiator uses the second to pick its interface, and the node
// service uses both to report topology.
//
// It only reads: it must never change links, addresses or routes, and never
// run ip(8) or any other program.
package netinfo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// socketTimeout bounds each netlink request; rtnetlink answers from kernel
// memory, so a request that takes this long will not answer.
const socketTimeout = 5 * time.Second

// Namespace reads one network namespace. It is safe for concurrent use.
type Namespace struct {
	h *netlink.Handle
}

// Open returns a Namespace for the caller's current network namespace.
func Open() (*Namespace, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netinfo: open rtnetlink: %w", err)
	}
	return newNamespace(h)
}

// OpenIn returns a Namespace for the network namespace ns (as from
// netns.GetFromPath), without moving the calling thread into it.
func OpenIn(ns netns.NsHandle) (*Namespace, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netinfo: open rtnetlink in namespace %s: %w", ns, err)
	}
	return newNamespace(h)
}

func newNamespace(h *netlink.Handle) (*Namespace, error) {
	if err := h.SetSocketTimeout(socketTimeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("netinfo: socket timeout: %w", err)
	}
	return &Namespace{h: h}, nil
}

// Close releases the netlink socket.
func (n *Namespace) Close() { n.h.Close() }

// Interface is one network interface.
type Interface struct {
	Name  string
	Index int
	// Up is the administrative state (IFF_UP).
	Up bool
	// Running says the link can carry traffic (IFF_RUNNING: carrier and
	// operational state up).
	Running      bool
	Loopback     bool
	MTU          int
	HardwareAddr string // "" when the link has none
	// Addrs are the interface's addresses with their prefix lengths.
	Addrs []netip.Prefix
}

// Interfaces lists the namespace's interfaces by index, each with its
// addresses (IPv4 and IPv6, link-local included).
func (n *Namespace) Interfaces(ctx context.Context) ([]Interface, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	links, err := n.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netinfo: list links: %w", err)
	}
	// One dump of every address, grouped by link, instead of one per link.
	addrs, err := n.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("netinfo: list addresses: %w", err)
	}
	byLink := map[int][]netip.Prefix{}
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok {
			byLink[a.LinkIndex] = append(byLink[a.LinkIndex], p)
		}
	}
	out := make([]Interface, 0, len(links))
	for _, l := range links {
		at := l.Attrs()
		ifc := Interface{
			Name:     at.Name,
			Index:    at.Index,
			Up:       at.Flags&net.FlagUp != 0,
			Running:  at.RawFlags&unix.IFF_RUNNING != 0,
			Loopback: at.Flags&net.FlagLoopback != 0,
			MTU:      at.MTU,
			Addrs:    byLink[at.Index],
		}
		if len(at.HardwareAddr) > 0 {
			ifc.HardwareAddr = at.HardwareAddr.String()
		}
		out = append(out, ifc)
	}
	slices.SortFunc(out, func(a, b Interface) int { return a.Index - b.Index })
	return out, nil
}

// Route is how the kernel reaches one destination.
type Route struct {
	// Interface is the outgoing interface's name.
	Interface string
	// Src is the source address the kernel picks for the destination.
	Src netip.Addr
	// Gateway is the next hop; invalid (zero) when the destination is on
	// link or local.
	Gateway netip.Addr
}

// RouteTo asks the kernel's routing table (RTM_GETROUTE, as `ip route get`)
// how it would reach ip. NotFound when no route leads there.
func (n *Namespace) RouteTo(ctx context.Context, ip netip.Addr) (Route, error) {
	if err := ctx.Err(); err != nil {
		return Route{}, err
	}
	if !ip.IsValid() || ip.Zone() != "" || ip.IsUnspecified() {
		return Route{}, abi.Errorf(abi.InvalidArgument, "netinfo: route to %s: need a unicast address without zone", ip.String())
	}
	ip = ip.Unmap()
	routes, err := n.h.RouteGet(ip.AsSlice())
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EINVAL) {
		return Route{}, abi.Errorf(abi.NotFound, "netinfo: no route to %s: %v", ip.String(), err)
	}
	if err != nil {
		return Route{}, fmt.Errorf("netinfo: route to %s: %w", ip, err)
	}
	if len(routes) == 0 {
		return Route{}, abi.Errorf(abi.NotFound, "netinfo: no route to %s", ip.String())
	}
	r := routes[0]
	link, err := n.h.LinkByIndex(r.LinkIndex)
	if err != nil {
		return Route{}, fmt.Errorf("netinfo: route to %s: interface %d: %w", ip, r.LinkIndex, err)
	}
	out := Route{Interface: link.Attrs().Name}
	if a, ok := netip.AddrFromSlice(r.Gw); ok {
		out.Gateway = a.Unmap()
	}
	if a, ok := netip.AddrFromSlice(r.Src); ok {
		out.Src = a.Unmap()
	} else if out.Src, err = n.firstAddr(link, ip.Is4()); err != nil {
		return Route{}, fmt.Errorf("netinfo: route to %s: %w", ip, err)
	}
	return out, nil
}

// firstAddr picks a source for a route the kernel gave none for: the
// link's first address of the destination's family, global scope first.
func (n *Namespace) firstAddr(link netlink.Link, v4 bool) (netip.Addr, error) {
	fam := netlink.FAMILY_V6
	if v4 {
		fam = netlink.FAMILY_V4
	}
	addrs, err := n.h.AddrList(link, fam)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
	}
	var fallback netip.Addr
	for _, a := range addrs {
		p, ok := prefixOf(a.IPNet)
		if !ok {
			continue
		}
		if a.Scope == int(netlink.SCOPE_UNIVERSE) {
			return p.Addr(), nil
		}
		if !fallback.IsValid() {
			fallback = p.Addr()
		}
	}
	if !fallback.IsValid() {
		return netip.Addr{}, abi.Errorf(abi.NotFound, "%s has no address to send from", link.Attrs().Name)
	}
	return fallback, nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	a = a.Unmap()
	if a.Is4() && bits == 128 {
		ones -= 96
	}
	return netip.PrefixFrom(a, ones), true
}
