package main

import (
	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// NodeInfo pins this node's volumes to it.
func (b *Backend) NodeInfo() (*abi.NodeInfoResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	return &abi.NodeInfoResponse{Topology: &topology(b.cfg.nodeID)[0]}, nil
}

// readOnlyMode reports whether an access mode lets nobody write.
func readOnlyMode(m abi.AccessMode) bool {
	return m == abi.AccessSingleNodeReadOnly || m == abi.AccessMultiNodeReadOnly
}

// NodeStage attaches the volume's file to a loop device (read-only for
// reader-only modes, with direct I/O as configured) and names the device;
// the host formats a blank one and mounts it, or publishes it raw. A file
// that is already attached, after a daemon restart for instance, answers
// its existing device.
func (b *Backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	path, err := b.volumePath(&req.Volume)
	if err != nil {
		return nil, err
	}
	if n := req.Volume.Context[ctxNode]; n != "" && b.configured && n != b.cfg.nodeID {
		return nil, sdk.Error(abi.FailedPrecondition, "volume file ", path, " lives on node ", n, ", not on ", b.cfg.nodeID)
	}
	dev, err := hostcall.LoopAttach(&abi.LoopAttachRequest{
		File: path, ReadOnly: readOnlyMode(req.Capability.AccessMode), DirectIO: b.cfg.directIO,
	})
	if err != nil {
		return nil, sdk.Wrap(err, "attach "+path)
	}
	if dev.Deleted {
		return nil, sdk.Error(abi.FailedPrecondition, "loop device ", dev.Path, " backs a deleted file that was ", path)
	}
	return &abi.NodeStageResponse{Device: dev.Path, Context: map[string]string{stageDevice: dev.Path}}, nil
}

// NodeUnstage detaches the loop device that backs the volume's file, found
// by the file's identity: after a reboot the recorded device number may
// belong to another file, which must not be detached. A file attached
// nowhere is success.
func (b *Backend) NodeUnstage(req *abi.NodeUnstageRequest) error {
	path, err := b.volumePath(&req.Volume)
	if err != nil {
		return err
	}
	found, err := hostcall.LoopFind(path)
	if err != nil {
		return sdk.Wrap(err, "find the loop device of "+path)
	}
	if !found.Found {
		return nil
	}
	return sdk.Wrap(hostcall.LoopDetach(found.Device.Path), "detach "+found.Device.Path+" from "+path)
}

// NodeExpand makes the loop device pick up its file's new size.
func (b *Backend) NodeExpand(req *abi.NodeExpandRequest) (*abi.NodeExpandResponse, error) {
	path, err := b.volumePath(&req.Volume)
	if err != nil {
		return nil, err
	}
	found, err := hostcall.LoopFind(path)
	if err != nil {
		return nil, sdk.Wrap(err, "find the loop device of "+path)
	}
	if !found.Found {
		return nil, sdk.Error(abi.NotFound, "volume file ", path, " is not attached on this node")
	}
	size, err := hostcall.LoopResize(found.Device.Path)
	if err != nil {
		return nil, sdk.Wrap(err, "resize "+found.Device.Path)
	}
	if size < req.RequiredBytes {
		return nil, sdk.Error(abi.FailedPrecondition, "volume file ", path, " has ", sdk.FormatSize(size), ", below the ",
			itoa(req.RequiredBytes), " asked: expand the volume on the controller first")
	}
	return &abi.NodeExpandResponse{CapacityBytes: size}, nil
}

// nodeHealth checks that a loop device still backs the volume's file and
// that it is the device the volume was staged on.
func nodeHealth(path, staged string) (*abi.HealthResponse, error) {
	found, err := hostcall.LoopFind(path)
	if err != nil {
		return nil, sdk.Wrap(err, "find the loop device of "+path)
	}
	switch {
	case !found.Found:
		return unhealthy(abi.HealthInaccessible, "LoopDeviceDetached", "no loop device backs "+path), nil
	case found.Device.Deleted:
		return unhealthy(abi.HealthInaccessible, "VolumeFileDeleted", found.Device.Path+" backs a deleted file"), nil
	case staged != "" && found.Device.Path != staged:
		return unhealthy(abi.HealthInaccessible, "LoopDeviceChanged", path+" is attached to "+found.Device.Path+
			", not to the staged "+staged), nil
	}
	return &abi.HealthResponse{}, nil
}
