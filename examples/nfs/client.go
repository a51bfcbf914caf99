package main

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// Client mode: folders of an export the operator names, made through the
// controller's own mount of it.

// share is an operator's export.
type share struct{ server, path string }

// shareOf reads server and share from parameters or a context.
func shareOf(m map[string]string, serverKey, shareKey string) (share, error) {
	s := share{server: m[serverKey], path: m[shareKey]}
	if s.server == "" || s.path == "" {
		return s, sdk.Error(abi.InvalidArgument, "mode client needs the parameters ", paramServer, " and ", paramShare, ": the NFS server and the export that holds the volumes")
	}
	if !strings.HasPrefix(s.path, "/") || strings.Contains(s.path, "/../") || strings.HasSuffix(s.path, "/..") || strings.ContainsAny(s.path, " ,\t\n") {
		return s, sdk.Error(abi.InvalidArgument, "parameter ", paramShare, " = ", s.path, ": want an absolute path on the server")
	}
	if len(s.path) > 1 {
		s.path = strings.TrimSuffix(s.path, "/")
	}
	return s, nil
}

// mountShare mounts the share on the controller (once; later calls find
// it) and answers the folder it is mounted at. A server or export not
// granted to this module is INVALID_ARGUMENT: the StorageClass names it.
func (b *Backend) mountShare(s share) (string, error) {
	if err := b.ready(); err != nil {
		return "", err
	}
	if b.cfg.mounts == "" {
		return "", sdk.Error(abi.FailedPrecondition, "nfs: mode client needs config mounts on the controller: the granted folder it mounts shares in")
	}
	target := b.cfg.mounts + "/share-" + sdk.NameID(s.server+":"+s.path, "share")
	_, err := hostcall.NfsMount(&abi.NfsMountRequest{Server: s.server, Export: s.path, Target: target, Version: b.cfg.version})
	switch abi.CodeOf(err) {
	case abi.OK:
		return target, nil
	case abi.PermissionDenied:
		return "", sdk.Error(abi.InvalidArgument, "server ", s.server, ":", s.path, " is not granted to this module: ", err.Error())
	case abi.InvalidArgument:
		return "", err
	}
	return "", sdk.Wrap(err, "mount "+s.server+":"+s.path)
}

func (b *Backend) createClient(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	s, err := shareOf(req.Parameters, paramServer, paramShare)
	if err != nil {
		return nil, err
	}
	onDelete := req.Parameters[paramOnDelete]
	if onDelete == "" {
		onDelete = onDeleteDelete
	}
	var src string
	if req.Source != nil {
		var ctx map[string]string
		switch {
		case req.Source.Snapshot != nil:
			src, ctx = req.Source.Snapshot.LocalID, req.Source.Snapshot.Context
		case req.Source.Volume != nil:
			src, ctx = req.Source.Volume.LocalID, req.Source.Volume.Context
		}
		if ctx[ctxMode] != modeClient || ctx[ctxServer] != s.server || ctx[ctxShare] != s.path {
			return nil, sdk.Error(abi.InvalidArgument, "source ", src, " is not a folder of ", s.server, ":", s.path, ": client mode copies within one share")
		}
	}
	target, err := b.mountShare(s)
	if err != nil {
		return nil, err
	}
	id := prefixClientVolume + sdk.NameID(req.Name, "vol")
	u, err := hostcall.NfsDirUsage(&abi.NfsDirRequest{Target: target, Name: id})
	if err != nil {
		return nil, err
	}
	if !u.Exists {
		if src == "" {
			err = hostcall.NfsDirCreate(&abi.NfsDirRequest{Target: target, Name: id})
		} else {
			err = hostcall.NfsDirCopy(&abi.NfsDirRequest{Target: target, Name: src, NewName: id})
		}
		if err != nil {
			return nil, err
		}
	}
	return &abi.CreateVolumeResponse{LocalID: id, CapacityBytes: req.RequiredBytes, Context: map[string]string{
		ctxMode: modeClient, ctxServer: s.server, ctxShare: s.path, ctxFolder: id, ctxExport: joinExport(s.path, id),
		ctxOnDelete: onDelete, ctxCapacity: "advisory",
	}}, nil
}

func joinExport(share, name string) string {
	if share == "/" {
		return "/" + name
	}
	return share + "/" + name
}

// deleteClient does what onDelete says with the folder.
func (b *Backend) deleteClient(ref *abi.VolumeRef) error {
	s, err := shareOf(ref.Context, ctxServer, ctxShare)
	if err != nil {
		return err
	}
	if ref.Context[ctxOnDelete] == onDeleteRetain {
		return nil
	}
	target, err := b.mountShare(s)
	if err != nil {
		return err
	}
	if ref.Context[ctxOnDelete] == onDeleteArchive {
		err := hostcall.NfsDirRename(&abi.NfsDirRequest{Target: target, Name: ref.LocalID, NewName: prefixArchived + ref.LocalID})
		if abi.CodeOf(err) == abi.NotFound {
			return nil
		}
		return err
	}
	return hostcall.NfsDirRemove(&abi.NfsDirRequest{Target: target, Name: ref.LocalID})
}

// snapshotClient copies the folder within the share: over NFSv4.2 the
// server clones or copies the data itself.
func (b *Backend) snapshotClient(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	s, err := shareOf(req.Source.Context, ctxServer, ctxShare)
	if err != nil {
		return nil, err
	}
	target, err := b.mountShare(s)
	if err != nil {
		return nil, err
	}
	id := prefixClientSnapshot + sdk.NameID(req.Name, "snap")
	u, err := hostcall.NfsDirUsage(&abi.NfsDirRequest{Target: target, Name: id})
	if err != nil {
		return nil, err
	}
	if !u.Exists {
		if err := hostcall.NfsDirCopy(&abi.NfsDirRequest{Target: target, Name: req.Source.LocalID, NewName: id}); err != nil {
			return nil, err
		}
	}
	return &abi.CreateSnapshotResponse{LocalID: id, SizeBytes: req.Source.CapacityBytes, ReadyToUse: true,
		Context: map[string]string{ctxMode: modeClient, ctxServer: s.server, ctxShare: s.path}}, nil
}

func (b *Backend) deleteSnapshotClient(ref *abi.SnapshotRef) error {
	s, err := shareOf(ref.Context, ctxServer, ctxShare)
	if err != nil {
		return err
	}
	target, err := b.mountShare(s)
	if err != nil {
		return err
	}
	return hostcall.NfsDirRemove(&abi.NfsDirRequest{Target: target, Name: ref.LocalID})
}

// healthClient: the folder in the share, and the server answering.
func (b *Backend) healthClient(ref *abi.VolumeRef) (*abi.HealthResponse, error) {
	s, err := shareOf(ref.Context, ctxServer, ctxShare)
	if err != nil {
		return nil, err
	}
	target, err := b.mountShare(s)
	if abi.CodeOf(err) == abi.Unavailable {
		return unhealthy(abi.HealthInaccessible, "ServerUnreachable", err.Error()), nil
	}
	if err != nil {
		return nil, err
	}
	st, err := hostcall.NfsStat(&abi.NfsTargetRequest{Target: target})
	if err != nil {
		return nil, err
	}
	if !st.Reachable {
		return unhealthy(abi.HealthInaccessible, "ServerUnreachable", s.server+" does not answer: "+st.Error), nil
	}
	u, err := hostcall.NfsDirUsage(&abi.NfsDirRequest{Target: target, Name: ref.LocalID})
	if abi.CodeOf(err) == abi.Unavailable {
		return unhealthy(abi.HealthInaccessible, "ServerUnreachable", err.Error()), nil
	}
	if err != nil {
		return nil, err
	}
	if !u.Exists {
		return unhealthy(abi.HealthInaccessible, "ExportMissing", "the volume's folder "+ref.LocalID+" is gone from "+s.server+":"+s.path), nil
	}
	if ref.CapacityBytes > 0 && u.UsedBytes >= ref.CapacityBytes {
		return unhealthy(abi.HealthDegraded, "QuotaExceeded", "the volume uses "+sdk.FormatSize(u.UsedBytes)+" of its advisory "+
			sdk.FormatSize(ref.CapacityBytes)+" (client mode enforces no capacity)"), nil
	}
	return &abi.HealthResponse{}, nil
}
