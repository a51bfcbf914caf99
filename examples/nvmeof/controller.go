package main

import (
	"strconv"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// volume is what the controller knows of one volume.
type volume struct {
	id        string
	path      string // its file in the pool
	subsystem string // its subsystem's NQN
	uuid      string // its namespace's UUID
}

// volumeOf resolves a volume reference: the file and subsystem from the
// context (so a volume keeps working after the operator changes pool or
// subsystem_prefix for new volumes), else from the configuration.
// NOT_FOUND for an ID this module cannot have made.
func (b *Backend) volumeOf(ref *abi.VolumeRef) (volume, error) {
	if !sdk.ValidNameID(ref.LocalID) {
		return volume{}, sdk.Error(abi.NotFound, "volume ", strconv.Quote(ref.LocalID), " is not an nvmeof volume ID")
	}
	v := volume{id: ref.LocalID, path: ref.Context[ctxPath], subsystem: ref.Context[ctxSubsystem]}
	name := ref.LocalID + volumeSuffix
	if v.path != "" && (v.path[0] != '/' || baseOf(v.path) != name) {
		return volume{}, sdk.Error(abi.InvalidArgument, "volume context path ", strconv.Quote(v.path), " does not name the volume's file ", name)
	}
	if v.path == "" || v.subsystem == "" {
		if err := b.controller(); err != nil {
			return volume{}, err
		}
		if v.path == "" {
			v.path = joinPath(b.cfg.pool, name)
		}
		if v.subsystem == "" {
			v.subsystem = subsystemNQN(b.cfg.prefix, ref.LocalID)
		}
	}
	v.uuid = namespaceUUID(v.subsystem)
	return v, nil
}

// snapshotPath is the file of a snapshot; NOT_FOUND for an ID this module
// cannot have made.
func (b *Backend) snapshotPath(ref *abi.SnapshotRef) (string, error) {
	if !sdk.ValidNameID(ref.LocalID) {
		return "", sdk.Error(abi.NotFound, "snapshot ", strconv.Quote(ref.LocalID), " is not an nvmeof snapshot ID")
	}
	name := ref.LocalID + snapshotSuffix
	if p := ref.Context[ctxPath]; p != "" {
		if p[0] != '/' || baseOf(p) != name {
			return "", sdk.Error(abi.InvalidArgument, "snapshot context path ", strconv.Quote(p), " does not name the snapshot's file ", name)
		}
		return p, nil
	}
	if err := b.controller(); err != nil {
		return "", err
	}
	return joinPath(b.cfg.pool, name), nil
}

// CreateVolume makes a volume: a file in the pool (new and sparse, or
// cloned from a snapshot or a volume and grown to the asked size) served
// as the namespace of its own subsystem, which allows no host before
// ControllerPublish. Everything is named after the CSI name, so a repeated
// call (after a crash before the host's record) finishes the first.
func (b *Backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if err := b.controller(); err != nil {
		return nil, err
	}
	if err := volumeParameters(req.Parameters); err != nil {
		return nil, err
	}
	fsType, err := b.fsTypeOf(req.Capabilities)
	if err != nil {
		return nil, err
	}
	size, err := sizeFor(req.RequiredBytes, req.LimitBytes, fsType)
	if err != nil {
		return nil, err
	}
	source, err := b.sourceOf(req.Source, fsType)
	if err != nil {
		return nil, err
	}
	if err := b.checkSparseBound(size); err != nil {
		return nil, err
	}
	id := sdk.NameID(req.Name, "vol")
	v := volume{id: id, path: joinPath(b.cfg.pool, id+volumeSuffix), subsystem: subsystemNQN(b.cfg.prefix, id)}
	v.uuid = namespaceUUID(v.subsystem)
	_, err = hostcall.FileStat(v.path)
	switch {
	case abi.CodeOf(err) == abi.NotFound && source == "":
		err = hostcall.FileCreate(&abi.FileCreateRequest{Path: v.path, SizeBytes: size})
	case abi.CodeOf(err) == abi.NotFound:
		err = hostcall.FileClone(source, v.path)
	}
	if err != nil {
		return nil, sdk.Wrap(err, "create "+v.path)
	}
	st, err := hostcall.FileStat(v.path)
	if err != nil {
		return nil, sdk.Wrap(err, "stat "+v.path)
	}
	if st.SizeBytes < size {
		if err := hostcall.FileResize(&abi.FileResizeRequest{Path: v.path, SizeBytes: size}); err != nil {
			return nil, sdk.Wrap(err, "grow "+v.path+" to "+itoa(size))
		}
		st.SizeBytes = size
	}
	if req.LimitBytes > 0 && st.SizeBytes > req.LimitBytes {
		return nil, sdk.Error(abi.OutOfRange, "volume file ", v.path, " has ", sdk.FormatSize(st.SizeBytes), ", above limit_bytes ", itoa(req.LimitBytes))
	}
	if st.SizeBytes%512 != 0 {
		return nil, sdk.Error(abi.FailedPrecondition, "volume file ", v.path, " has ", itoa(st.SizeBytes), " bytes, not a whole number of 512-byte blocks")
	}
	if err := b.ensureNamespace(v); err != nil {
		return nil, err
	}
	ctx := map[string]string{ctxSubsystem: v.subsystem, ctxAddress: b.cfg.address, ctxUUID: v.uuid, ctxPath: v.path}
	if fsType != "" {
		ctx[ctxFsType] = fsType
	}
	return &abi.CreateVolumeResponse{LocalID: id, CapacityBytes: st.SizeBytes, Context: ctx}, nil
}

// ensureNamespace serves the volume's file as the namespace of its
// subsystem on the configured addresses; an existing one serving the
// file is success (nvmet_namespace_create is idempotent), which also
// restores an export that a reboot of the storage host took away.
func (b *Backend) ensureNamespace(v volume) error {
	err := hostcall.NvmetNamespaceCreate(&abi.NvmetNamespaceCreateRequest{Subsystem: v.subsystem, NSID: nsid, Path: v.path,
		UUID: v.uuid, Ports: b.cfg.listen, BufferedIO: b.cfg.bufferedIO})
	return sdk.Wrap(err, "serve "+v.path+" as the namespace of "+v.subsystem)
}

// sourceOf is the file a new volume is cloned from, or "" for a new one.
func (b *Backend) sourceOf(src *abi.VolumeSource, fsType string) (string, error) {
	var path, have, what string
	var err error
	switch {
	case src == nil:
		return "", nil
	case src.Snapshot != nil:
		if path, err = b.snapshotPath(src.Snapshot); err != nil {
			return "", err
		}
		have, what = src.Snapshot.Context[ctxFsType], "snapshot"
		if have == "" {
			have = src.Snapshot.Source.Context[ctxFsType]
		}
	case src.Volume != nil:
		v, err := b.volumeOf(src.Volume)
		if err != nil {
			return "", err
		}
		path, have, what = v.path, src.Volume.Context[ctxFsType], "volume"
	default:
		return "", nil
	}
	if dirOf(path) != b.cfg.pool {
		return "", sdk.Error(abi.InvalidArgument, "source ", what, " ", path, " is not in the pool ", b.cfg.pool)
	}
	if _, err := hostcall.FileStat(path); err != nil {
		if abi.CodeOf(err) == abi.NotFound {
			return "", sdk.Error(abi.NotFound, "source ", what, " ", path, " does not exist")
		}
		return "", sdk.Wrap(err, "stat "+path)
	}
	// The host would refuse to mount another filesystem at stage time,
	// after the CO believed the volume ready.
	if fsType != "" && have != "" && fsType != have {
		return "", sdk.Error(abi.InvalidArgument, "source ", what, " holds ", have, ", not the requested ", fsType)
	}
	return path, nil
}

// fsTypeOf is the filesystem the volume's mount capabilities ask for (the
// configured default when they name none), or "" for block-only volumes.
func (b *Backend) fsTypeOf(caps []abi.Capability) (string, error) {
	fs := ""
	for _, c := range caps {
		if c.Block {
			continue
		}
		want := c.FsType
		if want == "" {
			want = b.cfg.fsType
		}
		if !isFsType(want) {
			return "", sdk.Error(abi.InvalidArgument, "fs_type ", strconv.Quote(want), " is not one of ext4, xfs, btrfs")
		}
		if fs != "" && fs != want {
			return "", sdk.Error(abi.InvalidArgument, "capabilities ask for both ", fs, " and ", want, ": a volume holds one filesystem")
		}
		fs = want
	}
	return fs, nil
}

// sizeFor is the size of a new volume: the host's rounded request (or the
// default), at least the filesystem's minimum for mount volumes, rounded
// to the granularity, and within limit_bytes.
func sizeFor(required, limit int64, fsType string) (int64, error) {
	size := required
	if size <= 0 {
		size = defaultSizeBytes
	}
	size = max(size, minSizeBytes)
	if fsType != "" {
		size = max(size, fsMinimum(fsType))
	}
	size = sdk.RoundUp(size, granularity)
	if limit > 0 && size > limit {
		if fsType != "" && fsMinimum(fsType) > limit {
			return 0, sdk.Error(abi.OutOfRange, fsType, " needs at least ", sdk.FormatSize(fsMinimum(fsType)), ", above limit_bytes ", itoa(limit))
		}
		return 0, sdk.Error(abi.OutOfRange, "no size in units of ", sdk.FormatSize(granularity), " fits ", itoa(required), "..", itoa(limit))
	}
	return size, nil
}

// checkSparseBound refuses a volume larger than the pool's whole
// filesystem: volume files are sparse, so together they may exceed the
// pool (thin provisioning), but one alone could never be filled.
func (b *Backend) checkSparseBound(size int64) error {
	fs, err := hostcall.FileStatfs(b.cfg.pool)
	if err != nil {
		return sdk.Wrap(err, "statfs "+b.cfg.pool)
	}
	if size > fs.TotalBytes {
		return sdk.Error(abi.OutOfRange, "a volume of ", sdk.FormatSize(size), " is larger than the pool's filesystem (", sdk.FormatSize(fs.TotalBytes), ")")
	}
	return nil
}

// DeleteVolume removes the volume's namespace (the subsystem goes with it,
// with its allowed hosts, ending every controller), then its file. The
// namespace goes only while it still serves this volume's file. A volume
// already gone is success. Snapshots are files of their own and survive
// their source.
func (b *Backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	v, err := b.volumeOf(&req.Volume)
	if abi.CodeOf(err) == abi.NotFound {
		return nil // never one of ours: nothing to delete
	}
	if err != nil {
		return err
	}
	if err := hostcall.NvmetNamespaceDelete(&abi.NvmetNamespaceRequest{Subsystem: v.subsystem, NSID: nsid, Path: v.path}); err != nil {
		return sdk.Wrap(err, "delete the namespace of "+v.subsystem)
	}
	return sdk.Wrap(hostcall.FileRemove(v.path), "delete "+v.path)
}

// ExpandVolume grows the volume's file and makes its namespace report the
// new size; the node then rescans and the host grows the filesystem. Both
// steps run on every call, so a call that failed between them is finished
// by the CO's retry.
func (b *Backend) ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	v, err := b.volumeOf(&req.Volume)
	if err != nil {
		return nil, err
	}
	size := sdk.RoundUp(req.RequiredBytes, granularity)
	if req.LimitBytes > 0 && size > req.LimitBytes {
		return nil, sdk.Error(abi.OutOfRange, "no size in units of ", sdk.FormatSize(granularity), " fits ", itoa(req.RequiredBytes), "..", itoa(req.LimitBytes))
	}
	st, err := hostcall.FileStat(v.path)
	if abi.CodeOf(err) == abi.NotFound {
		return nil, sdk.Error(abi.NotFound, "volume ", req.Volume.LocalID, " does not exist: its file ", v.path, " is gone")
	}
	if err != nil {
		return nil, sdk.Wrap(err, "stat "+v.path)
	}
	if st.SizeBytes < size {
		fs, err := hostcall.FileStatfs(dirOf(v.path))
		if err != nil {
			return nil, sdk.Wrap(err, "statfs "+dirOf(v.path))
		}
		if size > fs.TotalBytes {
			return nil, sdk.Error(abi.OutOfRange, "a volume of ", sdk.FormatSize(size), " is larger than the pool's filesystem (", sdk.FormatSize(fs.TotalBytes), ")")
		}
		if err := hostcall.FileResize(&abi.FileResizeRequest{Path: v.path, SizeBytes: size}); err != nil {
			return nil, sdk.Wrap(err, "grow "+v.path+" to "+itoa(size))
		}
		st.SizeBytes = size
	}
	if err := b.ensureNamespace(v); err != nil {
		return nil, err
	}
	if _, err := hostcall.NvmetNamespaceResize(&abi.NvmetNamespaceRequest{Subsystem: v.subsystem, NSID: nsid}); err != nil {
		return nil, sdk.Wrap(err, "resize the namespace of "+v.subsystem)
	}
	return &abi.ExpandVolumeResponse{CapacityBytes: st.SizeBytes, NodeExpansionRequired: true}, nil
}

// CreateSnapshot clones the volume's file to "<snapshot ID>.snap" beside
// it: a reflink where the pool's filesystem has them (instant, shares
// blocks), else a copy that keeps holes. A snapshot of a volume in use is
// crash-consistent. The snapshot is no namespace; restoring it makes a new
// volume.
func (b *Backend) CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	if err := checkSnapshotParameters(req.Parameters); err != nil {
		return nil, err
	}
	v, err := b.volumeOf(&req.Source)
	if err != nil {
		return nil, err
	}
	id := sdk.NameID(req.Name, "snap")
	path := joinPath(dirOf(v.path), id+snapshotSuffix)
	if err := hostcall.FileClone(v.path, path); err != nil && abi.CodeOf(err) != abi.AlreadyExists {
		return nil, sdk.Wrap(err, "snapshot "+v.path+" to "+path)
	}
	st, err := hostcall.FileStat(path)
	if err != nil {
		return nil, sdk.Wrap(err, "stat "+path)
	}
	ctx := map[string]string{ctxPath: path}
	if fs := req.Source.Context[ctxFsType]; fs != "" {
		ctx[ctxFsType] = fs
	}
	return &abi.CreateSnapshotResponse{LocalID: id, SizeBytes: st.SizeBytes, Context: ctx, ReadyToUse: true}, nil
}

// DeleteSnapshot removes the snapshot's file; a missing one is success.
func (b *Backend) DeleteSnapshot(req *abi.DeleteSnapshotRequest) error {
	path, err := b.snapshotPath(&req.Snapshot)
	if abi.CodeOf(err) == abi.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	return sdk.Wrap(hostcall.FileRemove(path), "delete snapshot "+path)
}

// GetCapacity reports the pool's free bytes. Volumes are sparse files, so
// the largest volume CreateVolume accepts is the size of the pool's whole
// filesystem, not its free space.
func (b *Backend) GetCapacity(req *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error) {
	if err := b.controller(); err != nil {
		return nil, err
	}
	if err := volumeParameters(req.Parameters); err != nil {
		return nil, err
	}
	minSize := int64(minSizeBytes)
	if req.Capability != nil && !req.Capability.Block {
		fs := req.Capability.FsType
		if fs == "" {
			fs = b.cfg.fsType
		}
		minSize = sdk.RoundUp(fsMinimum(fs), granularity)
	}
	fs, err := hostcall.FileStatfs(b.cfg.pool)
	if err != nil {
		return nil, sdk.Wrap(err, "statfs "+b.cfg.pool)
	}
	avail := sdk.RoundDown(fs.AvailableBytes, granularity)
	maxSize := sdk.RoundDown(fs.TotalBytes, granularity)
	if maxSize < minSize {
		return &abi.GetCapacityResponse{AvailableBytes: avail}, nil
	}
	return &abi.GetCapacityResponse{AvailableBytes: avail, MaximumVolumeSize: maxSize, MinimumVolumeSize: minSize}, nil
}

// ControllerPublish allows the node's host NQN on the volume's subsystem
// and tells the node where to connect. It first makes sure the namespace
// is served (nvmet's configuration does not survive a reboot of the
// storage host; the file does). The node ID carries the host NQN its
// node_info reported.
//
// A read-only publication is enforced by the node's read-only mounts:
// nvmet has no per-host write protection.
func (b *Backend) ControllerPublish(req *abi.ControllerPublishRequest) (*abi.ControllerPublishResponse, error) {
	v, err := b.volumeOf(&req.Volume)
	if err != nil {
		return nil, err
	}
	if _, err := hostcall.FileStat(v.path); err != nil {
		if abi.CodeOf(err) == abi.NotFound {
			return nil, sdk.Error(abi.NotFound, "volume ", req.Volume.LocalID, " does not exist: its file ", v.path, " is gone")
		}
		return nil, sdk.Wrap(err, "stat "+v.path)
	}
	host := req.NodeContext[NodeContextHostNQN]
	if host == "" {
		return nil, sdk.Error(abi.FailedPrecondition, "node ", strconv.Quote(req.NodeID), " reported no NVMe host NQN: ",
			"load the nvmeof module on it with the nvme grant")
	}
	if err := b.ensureNamespace(v); err != nil {
		return nil, err
	}
	if err := hostcall.NvmetHostAllow(&abi.NvmetHostRequest{Subsystem: v.subsystem, Host: host}); err != nil {
		return nil, sdk.Wrap(err, "allow "+host+" on "+v.subsystem)
	}
	address := req.Volume.Context[ctxAddress]
	if address == "" {
		address = b.cfg.address
	}
	return &abi.ControllerPublishResponse{PublishContext: map[string]string{
		pubAddress: address, pubSubsystem: v.subsystem, pubUUID: v.uuid,
	}}, nil
}

// ControllerUnpublish denies the node's host NQN on the volume's
// subsystem, which also ends its controller: the node cannot write to the
// volume any more, even if it never unstaged (fencing).
func (b *Backend) ControllerUnpublish(req *abi.ControllerUnpublishRequest) error {
	v, err := b.volumeOf(&req.Volume)
	if abi.CodeOf(err) == abi.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	host := req.NodeContext[NodeContextHostNQN]
	if host == "" {
		return nil // such a node was never allowed anything
	}
	ports := b.cfg.listen
	if b.cfg.prefix == "" {
		ports = nil
	}
	return sdk.Wrap(hostcall.NvmetHostDeny(&abi.NvmetHostRequest{Subsystem: v.subsystem, Host: host, Ports: ports}),
		"deny "+host+" on "+v.subsystem)
}

// VolumeHealth on the controller checks that the volume's file is there
// and whole and that it is served; on a node, that the node still reaches
// the namespace.
func (b *Backend) VolumeHealth(req *abi.VolumeHealthRequest) (*abi.HealthResponse, error) {
	if req.OnNode {
		return b.nodeHealth(&req.Volume)
	}
	v, err := b.volumeOf(&req.Volume)
	if err != nil {
		return nil, err
	}
	st, err := hostcall.FileStat(v.path)
	switch {
	case abi.CodeOf(err) == abi.NotFound:
		return unhealthy(abi.HealthInaccessible, "VolumeFileMissing", "volume file "+v.path+" is missing"), nil
	case err != nil:
		return nil, sdk.Wrap(err, "stat "+v.path)
	case req.Volume.CapacityBytes > 0 && st.SizeBytes < req.Volume.CapacityBytes:
		return unhealthy(abi.HealthDataLoss, "VolumeFileTruncated", "volume file "+v.path+" has "+sdk.FormatSize(st.SizeBytes)+
			", the volume "+sdk.FormatSize(req.Volume.CapacityBytes)), nil
	}
	_, err = hostcall.NvmetNamespaceResize(&abi.NvmetNamespaceRequest{Subsystem: v.subsystem, NSID: nsid})
	switch {
	case abi.CodeOf(err) == abi.NotFound:
		return unhealthy(abi.HealthInaccessible, "NotExported", "the namespace of "+v.subsystem+
			" is not served (the storage host restarted?): the next ControllerPublish serves it again"), nil
	case err != nil:
		return unhealthy(abi.HealthInaccessible, "TargetUnavailable", "nvmet: "+err.Error()), nil
	}
	return &abi.HealthResponse{}, nil
}

// StorageHealth reports what this daemon needs of its storage: on a node,
// a host NQN; on a controller, a pool with free space.
func (b *Backend) StorageHealth() (*abi.HealthResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if b.cfg.role != "controller" {
		if _, err := hostcall.NvmeHostNqn(); err != nil {
			return unhealthy(abi.HealthInaccessible, "NoHostNQN", "this node has no NVMe host NQN: "+err.Error()), nil
		}
	}
	if b.cfg.role != "node" && b.cfg.pool != "" {
		fs, err := hostcall.FileStatfs(b.cfg.pool)
		if err != nil {
			return unhealthy(abi.HealthInaccessible, "PoolUnreachable", "pool "+b.cfg.pool+": "+err.Error()), nil
		}
		if fs.AvailableBytes <= 0 {
			return unhealthy(abi.HealthDegraded, "PoolFull", "pool "+b.cfg.pool+" has no free space: writes to sparse volumes fail"), nil
		}
	}
	return &abi.HealthResponse{}, nil
}

func unhealthy(status abi.HealthStatus, reason, msg string) *abi.HealthResponse {
	return &abi.HealthResponse{Entries: []abi.HealthEntry{{Status: status, Reason: reason, Message: msg}}}
}
