package main

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// isClient tells the mode of a volume or snapshot from its local ID.
func isClient(localID string) bool {
	return strings.HasPrefix(localID, prefixClientVolume) || strings.HasPrefix(localID, prefixClientSnapshot)
}

// checkID refuses a local ID this module never made.
func checkID(localID string, prefixes ...string) error {
	for _, p := range prefixes {
		if strings.HasPrefix(localID, p) && sdk.ValidNameID(strings.TrimPrefix(localID, p)) {
			return nil
		}
	}
	return sdk.Error(abi.NotFound, "no nfs volume or snapshot has the ID ", localID)
}

// CreateVolume makes a volume in the StorageClass's mode. Block access is
// refused by the host (the backend offers mount access only).
func (b *Backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	for _, c := range req.Capabilities {
		if c.Block {
			return nil, sdk.Error(abi.InvalidArgument, "nfs volumes are shared filesystems: block access is not offered")
		}
	}
	switch m := mode(req.Parameters); m {
	case modeServer:
		return b.createServer(req)
	case modeClient:
		return b.createClient(req)
	default:
		return nil, sdk.Error(abi.InvalidArgument, "parameter mode = ", m, ": want server or client")
	}
}

// DeleteVolume removes the volume; one already gone is success.
func (b *Backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	if err := checkID(req.Volume.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil
	}
	if isClient(req.Volume.LocalID) {
		return b.deleteClient(&req.Volume)
	}
	return b.deleteServer(&req.Volume)
}

// ExpandVolume raises the quota (server mode) or records the advisory
// capacity (client mode). Nodes need nothing: they see the new size.
func (b *Backend) ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	if err := checkID(req.Volume.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil, err
	}
	if isClient(req.Volume.LocalID) {
		return &abi.ExpandVolumeResponse{CapacityBytes: req.RequiredBytes}, nil
	}
	return b.expandServer(req)
}

// CreateSnapshot copies the volume's folder beside it.
func (b *Backend) CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	if err := checkID(req.Source.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil, err
	}
	if len(req.Parameters) > 0 {
		for k := range req.Parameters {
			if !strings.HasPrefix(k, abi.COParameterPrefix) {
				return nil, sdk.Error(abi.InvalidArgument, "nfs snapshots take no parameter ", k)
			}
		}
	}
	if isClient(req.Source.LocalID) {
		return b.snapshotClient(req)
	}
	return b.snapshotServer(req)
}

// DeleteSnapshot removes the snapshot's folder.
func (b *Backend) DeleteSnapshot(req *abi.DeleteSnapshotRequest) error {
	if err := checkID(req.Snapshot.LocalID, prefixSnapshot, prefixClientSnapshot); err != nil {
		return nil
	}
	if isClient(req.Snapshot.LocalID) {
		return b.deleteSnapshotClient(&req.Snapshot)
	}
	if err := b.serverReady(); err != nil {
		return err
	}
	return hostcall.DirRemove(b.poolPath(req.Snapshot.LocalID))
}

// GetCapacity reports the pool's free bytes (server mode) or the share's
// (client mode, from the controller's mount of it).
func (b *Backend) GetCapacity(req *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if mode(req.Parameters) == modeClient {
		s, err := shareOf(req.Parameters, paramServer, paramShare)
		if err != nil {
			return nil, err
		}
		target, err := b.mountShare(s)
		if err != nil {
			return nil, err
		}
		st, err := hostcall.NfsStat(&abi.NfsTargetRequest{Target: target})
		if err != nil || !st.Reachable {
			return &abi.GetCapacityResponse{}, nil
		}
		return &abi.GetCapacityResponse{AvailableBytes: st.AvailableBytes, MaximumVolumeSize: st.AvailableBytes, MinimumVolumeSize: minSizeBytes}, nil
	}
	if err := b.serverReady(); err != nil {
		return nil, err
	}
	st, err := hostcall.DirStatfs(b.cfg.pool)
	if err != nil {
		return nil, err
	}
	return &abi.GetCapacityResponse{AvailableBytes: st.AvailableBytes, MaximumVolumeSize: st.AvailableBytes, MinimumVolumeSize: minSizeBytes}, nil
}

// ControllerPublish adds the node to a server-mode export (a client-mode
// share's access is the operator's server's to decide) and tells the node
// what to mount.
func (b *Backend) ControllerPublish(req *abi.ControllerPublishRequest) (*abi.ControllerPublishResponse, error) {
	if err := checkID(req.Volume.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil, err
	}
	if isClient(req.Volume.LocalID) {
		return &abi.ControllerPublishResponse{PublishContext: map[string]string{
			pubServer: req.Volume.Context[ctxServer], pubExport: req.Volume.Context[ctxExport]}}, nil
	}
	return b.publishServer(req)
}

// ControllerUnpublish takes the node off a server-mode export: fencing.
func (b *Backend) ControllerUnpublish(req *abi.ControllerUnpublishRequest) error {
	if err := checkID(req.Volume.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil
	}
	if isClient(req.Volume.LocalID) {
		return nil
	}
	return b.unpublishServer(req)
}

// VolumeHealth on the controller checks the storage and the export; on a
// node, that the node's mount answers.
func (b *Backend) VolumeHealth(req *abi.VolumeHealthRequest) (*abi.HealthResponse, error) {
	if err := checkID(req.Volume.LocalID, prefixVolume, prefixClientVolume); err != nil {
		return nil, err
	}
	if req.OnNode {
		return b.nodeHealth(&req.Volume)
	}
	if isClient(req.Volume.LocalID) {
		return b.healthClient(&req.Volume)
	}
	return b.healthServer(&req.Volume)
}

// StorageHealth: on a controller, the pool and the NFS server; on a node,
// nothing of its own to check (each volume's mount is checked alone).
func (b *Backend) StorageHealth() (*abi.HealthResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if b.cfg.role == "node" || b.cfg.pool == "" {
		return &abi.HealthResponse{}, nil
	}
	if _, err := hostcall.DirStatfs(b.cfg.pool); err != nil {
		return unhealthy(abi.HealthInaccessible, "PoolUnreadable", err.Error()), nil
	}
	l, err := hostcall.NfsdList(&abi.NfsdListRequest{Root: b.cfg.pool})
	if err != nil {
		return unhealthy(abi.HealthInaccessible, "ServerStopped", err.Error()), nil
	}
	if !l.Running {
		return unhealthy(abi.HealthInaccessible, "ServerStopped", "the NFS server is not running: "+l.Reason), nil
	}
	return &abi.HealthResponse{}, nil
}
