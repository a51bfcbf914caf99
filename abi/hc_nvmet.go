package abi

// Messages of the "nvmet" host calls: serving block devices and files as
// NVMe namespaces over TCP with the kernel's NVMe target (nvmet, driven
// through configfs). The family's roots are of three kinds, told apart by
// their form: subsystem NQN prefixes ("nqn.2024-01.dev.example:node1.";
// every subsystem must start with one), folders or device paths
// ("/dev/mapper", "/dev/vg0", "/var/lib/pool") that backing stores must lie
// in (a block device is then also checked by its device number: it must be
// the node the path names, not a link elsewhere), and TCP listen addresses
// ("0.0.0.0:4420", "[::]:4420", "192.0.2.5:4420"). Every subsystem the
// calls make refuses any host not allowed by nvmet_host_allow
// (attr_allow_any_host is always 0). Every call is idempotent.
// The codec is generated into hc_nvmet_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "nvmet" family.
const (
	// HostCallNvmetNamespaceCreate serves a block device or file as a
	// namespace of a subsystem, creating the subsystem and its ports.
	HostCallNvmetNamespaceCreate = "nvmet_namespace_create" // NvmetNamespaceCreateRequest -> Empty
	// HostCallNvmetNamespaceDelete removes a namespace; the subsystem
	// goes with its last namespace.
	HostCallNvmetNamespaceDelete = "nvmet_namespace_delete" // NvmetNamespaceRequest -> Empty
	// HostCallNvmetNamespaceResize makes the namespace report its backing
	// store's current size.
	HostCallNvmetNamespaceResize = "nvmet_namespace_resize" // NvmetNamespaceRequest -> NvmetNamespaceResizeResponse
	// HostCallNvmetHostAllow lets a host NQN connect to a subsystem.
	HostCallNvmetHostAllow = "nvmet_host_allow" // NvmetHostRequest -> Empty
	// HostCallNvmetHostDeny takes a host's access away and ends its
	// controllers (fencing).
	HostCallNvmetHostDeny = "nvmet_host_deny" // NvmetHostRequest -> Empty
)

// NvmetNamespaceCreateRequest makes Path namespace NSID of Subsystem,
// creating the subsystem (no host allowed) when missing and linking it to
// a TCP port for each of Ports. The same request again is success and
// also re-creates what a reboot of the target host took away (configfs
// keeps nothing). An NSID already serving another backing store, or a
// UUID already used by another namespace of the subsystem, is
// ALREADY_EXISTS. NOT_FOUND for a missing Path; FAILED_PRECONDITION when
// nvmet or nvmet_tcp is not loaded or a port's address is in use by
// another program; PERMISSION_DENIED for a subsystem, path or address
// outside the roots.
type NvmetNamespaceCreateRequest struct {
	Subsystem string `wire:"1"` // subsystem NQN, inside a granted prefix
	NSID      int32  `wire:"2"` // 1 to 1024
	// Path is a block device or a regular file (nvmet serves both).
	Path string `wire:"3"`
	// UUID is the namespace's UUID ("8-4-4-4-12" hex digits), by which
	// initiators find its block device; its NGUID is derived from it.
	UUID string `wire:"4"`
	// Ports are the TCP addresses ("ip:port", "[ipv6]:port") the
	// subsystem is reachable at; at least one, each granted.
	Ports []string `wire:"5"`
	// BufferedIO serves a file through the page cache (the file backend's
	// buffered_io); ignored for block devices.
	BufferedIO bool `wire:"6"`
}

// NvmetNamespaceRequest names a namespace of a subsystem.
//
//   - nvmet_namespace_delete: disables and removes the namespace, and
//     when none is left the subsystem too (its allowed hosts and port
//     links first, which ends every controller). A missing namespace is
//     success. With Path set, only a namespace backed by Path is removed;
//     one backed by anything else is left alone (success).
//   - nvmet_namespace_resize: makes the namespace report its backing
//     store's current size (revalidate_size); initiators see it after
//     nvme_rescan. NOT_FOUND when the namespace does not exist.
type NvmetNamespaceRequest struct {
	Subsystem string `wire:"1"`
	NSID      int32  `wire:"2"`
	Path      string `wire:"3"` // optional: the backing store the namespace must have
}

// NvmetNamespaceResizeResponse answers the size the namespace reports.
type NvmetNamespaceResizeResponse struct {
	SizeBytes int64 `wire:"1"`
}

// NvmetHostRequest names a host's access to a subsystem.
//
//   - nvmet_host_allow: links Host into the subsystem's allowed hosts.
//     NOT_FOUND when the subsystem does not exist.
//   - nvmet_host_deny: unlinks Host and ends the subsystem's controllers
//     on every port (nvmet checks hosts only when they connect): the
//     denied host cannot reconnect, hosts still allowed reconnect by
//     themselves within their reconnect delay. What was never allowed,
//     or a missing subsystem, is success.
type NvmetHostRequest struct {
	Subsystem string `wire:"1"`
	Host      string `wire:"2"` // the host's NQN
	// DHChapKey, when set, is the host's DH-HMAC-CHAP secret
	// ("DHHC-1:..."); reserved for in-band authentication, which this
	// version refuses (UNIMPLEMENTED) rather than ignores.
	DHChapKey string `wire:"3"`
	// Ports, for nvmet_host_deny, are the TCP addresses the subsystem
	// listens on: each is unlinked from the subsystem and linked again,
	// which ends its controllers; a repeated call (after a crash between
	// the two) links them again. Empty takes the ports linked now.
	Ports []string `wire:"4"`
}
