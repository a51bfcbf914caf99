package abi

// Messages of the "net" host calls: read-only facts about the node's
// network, to pick the interface for storage traffic and to report
// topology. The family has no roots.
// The codec is generated into hc_net_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "net" family.
const (
	// HostCallNetRouteTo answers the interface and source address the node uses to
	// reach an address.
	HostCallNetRouteTo = "net_route_to" // NetRouteToRequest -> NetRoute
	// HostCallNetInterfaces lists the node's interfaces and addresses.
	HostCallNetInterfaces = "net_interfaces" // Empty -> NetInterfaces
)

// NetRouteToRequest asks how the node reaches IP (an IPv4 or IPv6 address).
// NOT_FOUND when no route leads there.
type NetRouteToRequest struct {
	IP string `wire:"1"`
}

// NetRoute is the kernel's answer: the outgoing interface, the source
// address it would use, and the gateway ("" when on link or local).
type NetRoute struct {
	Interface string `wire:"1"`
	Src       string `wire:"2"`
	Gateway   string `wire:"3"`
}

// NetInterfaces lists the node's network interfaces.
type NetInterfaces struct {
	Interfaces []NetInterface `wire:"1"`
}

// NetInterface is one network interface.
type NetInterface struct {
	Name  string `wire:"1"`
	Index int32  `wire:"2"`
	Up    bool   `wire:"3"` // administratively up
	// Running says the link can carry traffic (carrier and operational
	// state up).
	Running      bool     `wire:"4"`
	Loopback     bool     `wire:"5"`
	MTU          int32    `wire:"6"`
	HardwareAddr string   `wire:"7"`
	Addrs        []string `wire:"8"` // "address/prefix-length"
}
