package main

import (
	"strconv"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// NodeInfo reports the node's host NQN, which the CO hands back to the
// controller in the node ID so ControllerPublish can allow this node.
// NVMe/TCP volumes are reachable from every node, so there is no topology.
// A node without a host NQN still answers; ControllerPublish then says
// what is missing.
func (b *Backend) NodeInfo() (*abi.NodeInfoResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	nqn, err := hostcall.NvmeHostNqn()
	if err != nil {
		hostcall.Logf(abi.LogWarn, "no NVMe host NQN: this node cannot be given nvmeof volumes: ", err.Error())
		return &abi.NodeInfoResponse{}, nil
	}
	return &abi.NodeInfoResponse{Context: map[string]string{NodeContextHostNQN: nqn}}, nil
}

// namespaceOf is where a node finds a volume's namespace: from ctx (the
// publish or stage context), else from the volume context.
func namespaceOf(ref *abi.VolumeRef, ctx map[string]string) (*abi.NvmeNamespace, error) {
	if !sdk.ValidNameID(ref.LocalID) {
		return nil, sdk.Error(abi.NotFound, "volume ", strconv.Quote(ref.LocalID), " is not an nvmeof volume ID")
	}
	pick := func(key, volKey string) string {
		if v := ctx[key]; v != "" {
			return v
		}
		return ref.Context[volKey]
	}
	n := &abi.NvmeNamespace{Address: pick(pubAddress, ctxAddress), Subsystem: pick(pubSubsystem, ctxSubsystem)}
	if n.Address == "" || n.Subsystem == "" {
		return nil, sdk.Error(abi.InvalidArgument, "volume ", ref.LocalID, " has no address and subsystem in its publish or volume context")
	}
	n.UUID = namespaceUUID(n.Subsystem)
	if u := pick(pubUUID, ctxUUID); u != "" && u != n.UUID {
		return nil, sdk.Error(abi.InvalidArgument, "context names namespace ", strconv.Quote(u), ", the subsystem's is ", n.UUID)
	}
	return n, nil
}

// stageContext is what node_unstage and node_expand need, kept in the
// node's stage record.
func stageContext(n *abi.NvmeNamespace) map[string]string {
	return map[string]string{pubAddress: n.Address, pubSubsystem: n.Subsystem, pubUUID: n.UUID}
}

// NodeStage connects to the volume's subsystem (a controller already
// there is reused) and names the namespace's disk; the host formats a
// blank one and mounts it, or publishes it raw.
func (b *Backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	n, err := namespaceOf(&req.Volume, req.PublishContext)
	if err != nil {
		return nil, err
	}
	c, err := hostcall.NvmeConnect(n)
	if err != nil {
		return nil, sdk.Wrap(err, "connect to "+n.Subsystem+" at "+n.Address)
	}
	return &abi.NodeStageResponse{Device: c.Device, Context: stageContext(n)}, nil
}

// NodeUnstage releases the namespace after the host unmounted it: the
// controller goes with it (it shows no other namespace). A namespace not
// connected is success.
func (b *Backend) NodeUnstage(req *abi.NodeUnstageRequest) error {
	n, err := namespaceOf(&req.Volume, req.StageContext)
	if abi.CodeOf(err) == abi.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	return sdk.Wrap(hostcall.NvmeDisconnect(n), "disconnect from "+n.Subsystem+" at "+n.Address)
}

// NodeExpand makes the node's disk show the size the controller gave the
// namespace; the host then grows the filesystem.
func (b *Backend) NodeExpand(req *abi.NodeExpandRequest) (*abi.NodeExpandResponse, error) {
	n, err := namespaceOf(&req.Volume, req.StageContext)
	if err != nil {
		return nil, err
	}
	n.MinSizeBytes = req.RequiredBytes
	r, err := hostcall.NvmeRescan(n)
	if err != nil {
		return nil, sdk.Wrap(err, "rescan "+n.Subsystem)
	}
	if r.SizeBytes < req.RequiredBytes {
		return nil, sdk.Error(abi.FailedPrecondition, "the namespace of ", n.Subsystem, " shows ", sdk.FormatSize(r.SizeBytes),
			", below the ", itoa(req.RequiredBytes), " asked: expand the volume on the controller first")
	}
	return &abi.NodeExpandResponse{CapacityBytes: r.SizeBytes}, nil
}

// nodeHealth checks that the node still reaches the volume's namespace:
// a rescan answers its size, NOT_FOUND when the controller or the disk is
// gone (controller lost), UNAVAILABLE while the connection is down and
// the kernel reconnects (path down).
func (b *Backend) nodeHealth(ref *abi.VolumeRef) (*abi.HealthResponse, error) {
	n, err := namespaceOf(ref, nil)
	if err != nil {
		return nil, err
	}
	r, err := hostcall.NvmeRescan(n)
	switch {
	case abi.CodeOf(err) == abi.NotFound:
		return unhealthy(abi.HealthInaccessible, "ControllerLost", "no controller on this node shows the namespace of "+n.Subsystem+": "+err.Error()), nil
	case abi.CodeOf(err) == abi.Unavailable:
		return unhealthy(abi.HealthInaccessible, "PathDown", "the connection to "+n.Address+" is down, the kernel reconnects: "+err.Error()), nil
	case err != nil:
		return nil, sdk.Wrap(err, "rescan "+n.Subsystem)
	case ref.CapacityBytes > 0 && r.SizeBytes < ref.CapacityBytes:
		return unhealthy(abi.HealthDegraded, "NamespaceSmallerThanVolume", "the namespace shows "+
			sdk.FormatSize(r.SizeBytes)+", the volume "+sdk.FormatSize(ref.CapacityBytes)+": expansion is not finished"), nil
	}
	return &abi.HealthResponse{}, nil
}
