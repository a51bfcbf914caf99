package main

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// Server mode: folders of the pool, each exported on its own.

func (b *Backend) serverReady() error {
	if err := b.ready(); err != nil {
		return err
	}
	if b.cfg.pool == "" {
		return sdk.Error(abi.FailedPrecondition, "nfs: server mode needs a pool: grant a folder root (config pool) to this controller")
	}
	if b.cfg.server == "" {
		return sdk.Error(abi.FailedPrecondition, "nfs: server mode needs config server: the address nodes mount this host's exports from")
	}
	return nil
}

func (b *Backend) poolPath(id string) string { return b.cfg.pool + "/" + id }

func (b *Backend) capacityWord() string {
	if b.enforced {
		return "enforced"
	}
	return "advisory"
}

// serverContext is a server-mode volume's context.
func (b *Backend) serverContext(id string) map[string]string {
	return map[string]string{ctxMode: modeServer, ctxServer: b.cfg.server, ctxExport: b.poolPath(id), ctxCapacity: b.capacityWord()}
}

// createServer makes the folder (filled from the source), sets its quota
// and records its export with no client: nobody reaches it until a
// ControllerPublish names a node. Each step is idempotent, so a repeat
// after a crash finishes what an earlier attempt began.
func (b *Backend) createServer(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if err := b.serverReady(); err != nil {
		return nil, err
	}
	for _, k := range []string{paramServer, paramShare, paramOnDelete} {
		if _, ok := req.Parameters[k]; ok {
			return nil, sdk.Error(abi.InvalidArgument, "parameter ", k, " belongs to mode client: mode server exports folders of this host's pool")
		}
	}
	id := prefixVolume + sdk.NameID(req.Name, "vol")
	path := b.poolPath(id)
	exists, err := hostcall.DirExists(path)
	if err != nil {
		return nil, err
	}
	if !exists {
		var src string
		switch {
		case req.Source == nil:
		case req.Source.Snapshot != nil:
			if !strings.HasPrefix(req.Source.Snapshot.LocalID, prefixSnapshot) {
				return nil, sdk.Error(abi.InvalidArgument, "snapshot ", req.Source.Snapshot.LocalID, " is not a server-mode snapshot: restore it with its own mode")
			}
			src = b.poolPath(req.Source.Snapshot.LocalID)
		case req.Source.Volume != nil:
			if !strings.HasPrefix(req.Source.Volume.LocalID, prefixVolume) {
				return nil, sdk.Error(abi.InvalidArgument, "volume ", req.Source.Volume.LocalID, " is not a server-mode volume: clone it with its own mode")
			}
			src = b.poolPath(req.Source.Volume.LocalID)
		}
		if src == "" {
			err = hostcall.DirCreate(&abi.DirCreateRequest{Path: path})
		} else if ok, serr := hostcall.DirExists(src); serr != nil {
			err = serr
		} else if !ok {
			err = sdk.Error(abi.NotFound, "source "+src+" is gone")
		} else {
			err = hostcall.DirCopy(src, path)
		}
		if err != nil {
			return nil, err
		}
	}
	if b.enforced {
		if err := hostcall.DirSetQuota(path, req.RequiredBytes); err != nil {
			return nil, err
		}
	}
	if err := b.ensureExport(path); err != nil {
		return nil, err
	}
	return &abi.CreateVolumeResponse{LocalID: id, CapacityBytes: req.RequiredBytes, Context: b.serverContext(id)}, nil
}

// ensureExport records the folder's export, keeping the clients it has.
func (b *Backend) ensureExport(path string) error {
	l, err := hostcall.NfsdList(&abi.NfsdListRequest{Root: b.cfg.pool})
	if err != nil {
		return sdk.Wrap(err, "list exports")
	}
	for _, e := range l.Exports {
		if e.Path == path {
			return nil
		}
	}
	_, err = hostcall.NfsdExport(&abi.NfsdExportRequest{Path: path})
	return sdk.Wrap(err, "export "+path)
}

// deleteServer withdraws the export first (no export is ever left naming a
// folder that is gone), then removes the folder.
func (b *Backend) deleteServer(ref *abi.VolumeRef) error {
	if err := b.serverReady(); err != nil {
		return err
	}
	path := b.poolPath(ref.LocalID)
	if err := hostcall.NfsdUnexport(path); err != nil {
		return sdk.Wrap(err, "unexport "+path)
	}
	return hostcall.DirRemove(path)
}

func (b *Backend) expandServer(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	if err := b.serverReady(); err != nil {
		return nil, err
	}
	path := b.poolPath(req.Volume.LocalID)
	if !b.enforced {
		ok, err := hostcall.DirExists(path)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, sdk.Error(abi.NotFound, "volume folder "+path+" does not exist")
		}
		return &abi.ExpandVolumeResponse{CapacityBytes: req.RequiredBytes}, nil
	}
	// The quota rises under the clients' feet: statfs over NFS shows the
	// new size, and writes that failed EDQUOT go on, without a remount.
	if err := hostcall.DirSetQuota(path, req.RequiredBytes); err != nil {
		return nil, err
	}
	return &abi.ExpandVolumeResponse{CapacityBytes: req.RequiredBytes}, nil
}

func (b *Backend) snapshotServer(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	if err := b.serverReady(); err != nil {
		return nil, err
	}
	id := prefixSnapshot + sdk.NameID(req.Name, "snap")
	path := b.poolPath(id)
	exists, err := hostcall.DirExists(path)
	if err != nil {
		return nil, err
	}
	if !exists {
		// dir_copy reflinks file data where the pool's filesystem shares
		// extents (xfs, btrfs) and copies it at disk speed elsewhere; the
		// copy is named only when whole.
		if err := hostcall.DirCopy(b.poolPath(req.Source.LocalID), path); err != nil {
			return nil, err
		}
	}
	size := req.Source.CapacityBytes
	if u, err := hostcall.DirUsage(path); err == nil && !b.enforced && u.UsedBytes > 0 {
		size = u.UsedBytes
	}
	return &abi.CreateSnapshotResponse{LocalID: id, SizeBytes: size, ReadyToUse: true,
		Context: map[string]string{ctxMode: modeServer}}, nil
}

// publishServer adds the node to the export's clients.
func (b *Backend) publishServer(req *abi.ControllerPublishRequest) (*abi.ControllerPublishResponse, error) {
	if err := b.serverReady(); err != nil {
		return nil, err
	}
	client := req.NodeContext[NodeContextClient]
	if client == "" {
		return nil, sdk.Error(abi.FailedPrecondition, "node ", req.NodeID, " reported no NFS client address: load the nfs module on it with the net grant and config server, or set config client_address")
	}
	path := b.poolPath(req.Volume.LocalID)
	ok, err := hostcall.DirExists(path)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, sdk.Error(abi.NotFound, "volume ", req.Volume.LocalID, " does not exist: its folder ", path, " is gone")
	}
	c := abi.NfsdClient{Address: client, ReadOnly: req.ReadOnly}
	_, err = hostcall.NfsdClientAdd(&abi.NfsdClientRequest{Path: path, Client: c})
	if abi.CodeOf(err) == abi.NotFound {
		// The record went (an operator removed the file): export anew.
		_, err = hostcall.NfsdExport(&abi.NfsdExportRequest{Path: path, Clients: []abi.NfsdClient{c}})
	}
	if err != nil {
		return nil, sdk.Wrap(err, "export "+path+" to "+client)
	}
	server := req.Volume.Context[ctxServer]
	if server == "" {
		server = b.cfg.server
	}
	return &abi.ControllerPublishResponse{PublishContext: map[string]string{pubServer: server, pubExport: path}}, nil
}

// unpublishServer takes the node off the export's clients: from then on
// the server refuses its requests, also through a mount it still has.
func (b *Backend) unpublishServer(req *abi.ControllerUnpublishRequest) error {
	if err := b.serverReady(); err != nil {
		return err
	}
	client := req.NodeContext[NodeContextClient]
	if client == "" {
		return nil // such a node was never added
	}
	path := b.poolPath(req.Volume.LocalID)
	_, err := hostcall.NfsdClientRemove(&abi.NfsdClientRequest{Path: path, Client: abi.NfsdClient{Address: client}})
	return sdk.Wrap(err, "take "+client+" off the export of "+path)
}

// healthServer: the folder, its export, the server, the quota.
func (b *Backend) healthServer(ref *abi.VolumeRef) (*abi.HealthResponse, error) {
	if err := b.serverReady(); err != nil {
		return nil, err
	}
	path := b.poolPath(ref.LocalID)
	ok, err := hostcall.DirExists(path)
	if err != nil {
		return nil, err
	}
	if !ok {
		return unhealthy(abi.HealthInaccessible, "VolumeFolderMissing", "the volume's folder "+path+" is gone from the pool"), nil
	}
	l, err := hostcall.NfsdList(&abi.NfsdListRequest{Root: b.cfg.pool})
	if err != nil {
		return nil, sdk.Wrap(err, "list exports")
	}
	if !l.Running {
		return unhealthy(abi.HealthInaccessible, "ServerStopped", "the NFS server on the storage host is not running: "+l.Reason), nil
	}
	var exp *abi.NfsdExport
	for i := range l.Exports {
		if l.Exports[i].Path == path {
			exp = &l.Exports[i]
		}
	}
	switch {
	case exp == nil:
		return unhealthy(abi.HealthInaccessible, "ExportMissing", "the volume's folder has no export record: the next ControllerPublish makes one"), nil
	case !exp.Active:
		return unhealthy(abi.HealthInaccessible, "ExportMissing", "the NFS server does not serve the volume's export to every published node"), nil
	}
	if b.enforced && ref.CapacityBytes > 0 {
		if u, err := hostcall.DirUsage(path); err == nil && u.UsedBytes >= ref.CapacityBytes {
			return unhealthy(abi.HealthDegraded, "QuotaExceeded", "the volume uses "+sdk.FormatSize(u.UsedBytes)+" of its "+
				sdk.FormatSize(ref.CapacityBytes)+": writes fail with EDQUOT until it is expanded or cleaned"), nil
		}
	}
	return &abi.HealthResponse{}, nil
}
