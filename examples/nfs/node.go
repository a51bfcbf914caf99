package main

import (
	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// NodeInfo reports the node's address as the NFS server sees it: config
// client_address, else the source address of the node's route to the
// configured server. The CO hands it back to the controller in the node
// ID, and ControllerPublish exports to it. NFS volumes are reachable from
// every node, so there is no topology: a volume without accessible
// topology is accessible everywhere.
func (b *Backend) NodeInfo() (*abi.NodeInfoResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	addr := b.cfg.client
	if addr == "" && b.cfg.server != "" && isAddress(b.cfg.server) {
		r, err := hostcall.NetRouteTo(&abi.NetRouteToRequest{IP: b.cfg.server})
		if err != nil {
			hostcall.Logf(abi.LogWarn, "nfs: no route to ", b.cfg.server, ": this node cannot be published server-mode volumes: ", err.Error())
		} else {
			addr = r.Src
		}
	}
	if addr == "" {
		return &abi.NodeInfoResponse{}, nil
	}
	return &abi.NodeInfoResponse{Context: map[string]string{NodeContextClient: addr}}, nil
}

// mountFolder is where this node mounts a volume.
func (b *Backend) mountFolder(localID string) (string, error) {
	if b.cfg.mounts == "" {
		return "", sdk.Error(abi.FailedPrecondition, "nfs: this node has no config mounts: the granted folder NFS mounts go in")
	}
	return b.cfg.mounts + "/" + localID, nil
}

// readOnlyMode is an access mode that never writes.
func readOnlyMode(m abi.AccessMode) bool {
	return m == abi.AccessSingleNodeReadOnly || m == abi.AccessMultiNodeReadOnly
}

// NodeStage mounts the volume's own export (the volume's folder: the node
// never sees its neighbours) in the node's mounts folder with the
// StorageClass's mountOptions; the host binds it at the staging path.
func (b *Backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if err := checkID(req.Volume.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil, err
	}
	if req.Capability.Block {
		return nil, sdk.Error(abi.InvalidArgument, "nfs volumes are shared filesystems: block access is not offered")
	}
	server, export := req.PublishContext[pubServer], req.PublishContext[pubExport]
	if server == "" || export == "" {
		server, export = req.Volume.Context[ctxServer], req.Volume.Context[ctxExport]
	}
	if server == "" || export == "" {
		return nil, sdk.Error(abi.InvalidArgument, "volume ", req.Volume.LocalID, " has no server and export in its publish or volume context")
	}
	target, err := b.mountFolder(req.Volume.LocalID)
	if err != nil {
		return nil, err
	}
	m, err := hostcall.NfsMount(&abi.NfsMountRequest{Server: server, Export: export, Target: target, Version: b.cfg.version,
		Options: req.Capability.MountFlags, ReadOnly: readOnlyMode(req.Capability.AccessMode)})
	if err != nil {
		return nil, sdk.Wrap(err, "mount "+server+":"+export)
	}
	return &abi.NodeStageResponse{Directory: target, Context: map[string]string{"version": m.Version}}, nil
}

// NodeUnstage unmounts the volume's export after the host unmounted the
// staging path; a dead server's mount is detached lazily.
func (b *Backend) NodeUnstage(req *abi.NodeUnstageRequest) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := checkID(req.Volume.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil
	}
	target, err := b.mountFolder(req.Volume.LocalID)
	if err != nil {
		return err
	}
	return hostcall.NfsUnmount(&abi.NfsTargetRequest{Target: target})
}

// nodeHealth: the node's mount of the volume answers, within bounds.
func (b *Backend) nodeHealth(ref *abi.VolumeRef) (*abi.HealthResponse, error) {
	target, err := b.mountFolder(ref.LocalID)
	if err != nil {
		return nil, err
	}
	st, err := hostcall.NfsStat(&abi.NfsTargetRequest{Target: target})
	switch {
	case abi.CodeOf(err) == abi.NotFound:
		return unhealthy(abi.HealthInaccessible, "NotMounted", "the volume's export is not mounted on this node"), nil
	case err != nil:
		return nil, err
	case !st.Reachable:
		return unhealthy(abi.HealthInaccessible, "ServerUnreachable", "the NFS server "+st.Server+" does not answer: "+st.Error), nil
	case ref.CapacityBytes > 0 && st.AvailableBytes == 0 && st.TotalBytes > 0:
		return unhealthy(abi.HealthDegraded, "QuotaExceeded", "the volume is full ("+sdk.FormatSize(st.UsedBytes)+" used)"), nil
	}
	return &abi.HealthResponse{}, nil
}
