package abi

// Messages of the "nvme" host calls: the node's NVMe over TCP initiator,
// driven through /dev/nvme-fabrics and sysfs (no nvme-cli). The family's
// roots are the target addresses a module may connect to: "ip:port" or
// "[ipv6]:port" (port 4420 when omitted), or an address prefix such as
// "192.0.2.0/24" that allows every address in it. One controller per
// (address, subsystem) is shared by the namespaces in use on it and is
// disconnected with the last of them.
// The codec is generated into hc_nvme_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "nvme" family.
const (
	// HostCallNvmeConnect connects to a granted address's subsystem (or
	// reuses the controller that is connected) and answers the
	// namespace's block device.
	HostCallNvmeConnect = "nvme_connect" // NvmeNamespace -> NvmeConnectResponse
	// HostCallNvmeDisconnect releases a namespace; the controller is
	// disconnected with its last namespace.
	HostCallNvmeDisconnect = "nvme_disconnect" // NvmeNamespace -> Empty
	// HostCallNvmeRescan makes the node see a grown namespace's size.
	HostCallNvmeRescan = "nvme_rescan" // NvmeNamespace -> NvmeRescanResponse
	// HostCallNvmeHostNqn answers the node's host NQN, which a module
	// reports in node_info so its controller can allow the node. It needs
	// no root.
	HostCallNvmeHostNqn = "nvme_host_nqn" // Empty -> NvmeHostNQN.NQN
)

// NvmeNamespace names one namespace behind a subsystem and where to
// connect to it.
//
//   - nvme_connect: connects (transport tcp) when no live controller to
//     (Address, Subsystem) exists, waits for the namespace's block device
//     and answers it; the same namespace again is success.
//     PERMISSION_DENIED when the address is not granted or the target
//     refuses this host, UNAVAILABLE when the address does not answer,
//     NOT_FOUND when the subsystem does not show the namespace to this
//     host.
//   - nvme_disconnect: disconnects the controller when this namespace is
//     the last it shows; idempotent. FAILED_PRECONDITION while the
//     namespace's device is mounted or held.
//   - nvme_rescan: rescans the controller and answers the namespace's
//     size. NOT_FOUND when no controller shows the namespace (the
//     controller was lost), UNAVAILABLE while the controller is not live
//     (the path is down and the kernel reconnects).
type NvmeNamespace struct {
	Address   string `wire:"1"` // "ip[:port]" or "[ipv6][:port]"
	Subsystem string `wire:"2"` // subsystem NQN
	// UUID is the namespace's UUID, as given to nvmet_namespace_create.
	UUID string `wire:"3"`
	// DHChapKey is reserved for in-band authentication (UNIMPLEMENTED
	// when set in this version).
	DHChapKey string `wire:"4"`
	// MinSizeBytes, for nvme_rescan, is the size the caller expects after
	// the target grew the namespace: the rescan waits a few seconds for
	// it (the kernel rescans in the background) and answers what it has.
	MinSizeBytes int64 `wire:"5"`
}

// NvmeConnectResponse answers the namespace's block device, /dev/nvmeXnY,
// and the controller that shows it ("nvme3").
type NvmeConnectResponse struct {
	Device     string `wire:"1"`
	Controller string `wire:"2"`
}

// NvmeRescanResponse answers the namespace's size after the rescan.
type NvmeRescanResponse struct {
	SizeBytes int64 `wire:"1"`
}

// NvmeHostNQN is the node's host NQN: /etc/nvme/hostnqn when it exists,
// else "nqn.2014-08.org.nvmexpress:uuid:<uuid>" with the machine's DMI
// product UUID (what nvme-cli's gen-hostnqn writes), else with a UUID
// derived from /etc/machine-id, so a node without nvme-cli still has a
// stable name. FAILED_PRECONDITION when none of them gives one.
type NvmeHostNQN struct {
	NQN string `wire:"1"`
}
