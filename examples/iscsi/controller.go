package main

import (
	"strconv"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// volume is what the controller knows of one volume.
type volume struct {
	nameID     string
	lun        int
	path       string // its file in the pool
	target     string // its target's IQN
	writeCache bool   // its LUN reports a write-back cache
}

// volumeOf resolves a volume reference: the LUN from the local ID, the file
// and target from the context (so a volume keeps working after the
// operator changes pool or target_iqn for new volumes), else from the
// configuration. NOT_FOUND for an ID this module cannot have made.
func (b *Backend) volumeOf(ref *abi.VolumeRef) (volume, error) {
	nameID, lun, ok := parseVolumeID(ref.LocalID)
	if !ok {
		return volume{}, sdk.Error(abi.NotFound, "volume ", strconv.Quote(ref.LocalID), " is not an iscsi volume ID")
	}
	v := volume{nameID: nameID, lun: lun, path: ref.Context[ctxPath], target: ref.Context[ctxTarget], writeCache: ref.Context[ctxWriteCache] == "true"}
	name := ref.LocalID + volumeSuffix
	if v.path != "" && (v.path[0] != '/' || baseOf(v.path) != name) {
		return volume{}, sdk.Error(abi.InvalidArgument, "volume context path ", strconv.Quote(v.path), " does not name the volume's file ", name)
	}
	if v.path == "" || v.target == "" {
		if err := b.controller(); err != nil {
			return volume{}, err
		}
		if v.path == "" {
			v.path = joinPath(b.cfg.pool, name)
		}
		if v.target == "" {
			v.target = b.cfg.target
		}
	}
	return v, nil
}

// snapshotPath is the file of a snapshot; NOT_FOUND for an ID this module
// cannot have made.
func (b *Backend) snapshotPath(ref *abi.SnapshotRef) (string, error) {
	if !sdk.ValidNameID(ref.LocalID) {
		return "", sdk.Error(abi.NotFound, "snapshot ", strconv.Quote(ref.LocalID), " is not an iscsi snapshot ID")
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
// as a LUN of the shared target. No node sees the LUN before
// ControllerPublish grants it.
//
// LUN numbers are tried in the name's own order; a LUN that serves another
// volume's file answers ALREADY_EXISTS and the next one is tried. The
// LUN is part of the file's name, so a repeated call (after a crash before
// the host's record) first looks for a file of an earlier attempt under
// every LUN and finishes that one instead of making a second.
func (b *Backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if err := b.controller(); err != nil {
		return nil, err
	}
	writeCache, err := volumeParameters(req.Parameters, req.MutableParameters)
	if err != nil {
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
	nameID := sdk.NameID(req.Name, "vol")
	order := lunOrder(nameID)
	for _, lun := range order {
		path := joinPath(b.cfg.pool, volumeID(nameID, lun)+volumeSuffix)
		_, err := hostcall.FileStat(path)
		if abi.CodeOf(err) == abi.NotFound {
			continue
		}
		if err != nil {
			return nil, sdk.Wrap(err, "stat "+path)
		}
		resp, err := b.finishVolume(nameID, lun, path, size, req.LimitBytes, fsType, writeCache)
		if abi.CodeOf(err) != abi.AlreadyExists {
			return resp, err
		}
		// The LUN went to another volume since: start over elsewhere.
		if err := hostcall.FileRemove(path); err != nil {
			return nil, sdk.Wrap(err, "remove "+path+" whose LUN serves another volume")
		}
		break
	}
	for _, lun := range order {
		path := joinPath(b.cfg.pool, volumeID(nameID, lun)+volumeSuffix)
		if source == "" {
			err = hostcall.FileCreate(&abi.FileCreateRequest{Path: path, SizeBytes: size})
		} else {
			err = hostcall.FileClone(source, path)
		}
		if err != nil {
			return nil, sdk.Wrap(err, "create "+path)
		}
		resp, err := b.finishVolume(nameID, lun, path, size, req.LimitBytes, fsType, writeCache)
		if err == nil {
			return resp, nil
		}
		if rmErr := hostcall.FileRemove(path); rmErr != nil {
			hostcall.Logf(abi.LogWarn, "remove ", path, " after a failed create: ", rmErr.Error())
		}
		if abi.CodeOf(err) != abi.AlreadyExists {
			return nil, err
		}
	}
	return nil, sdk.Error(abi.ResourceExhausted, "target ", b.cfg.target, " has no free LUN: it serves ", itoa(maxLUN+1), " volumes")
}

// finishVolume grows the volume's file to size when it is smaller and
// makes it LUN lun of the target. ALREADY_EXISTS when the LUN serves
// another file.
func (b *Backend) finishVolume(nameID string, lun int, path string, size, limit int64, fsType string, writeCache bool) (*abi.CreateVolumeResponse, error) {
	st, err := hostcall.FileStat(path)
	if err != nil {
		return nil, sdk.Wrap(err, "stat "+path)
	}
	if st.SizeBytes < size {
		if err := hostcall.FileResize(&abi.FileResizeRequest{Path: path, SizeBytes: size}); err != nil {
			return nil, sdk.Wrap(err, "grow "+path+" to "+itoa(size))
		}
		st.SizeBytes = size
	}
	if limit > 0 && st.SizeBytes > limit {
		return nil, sdk.Error(abi.OutOfRange, "volume file ", path, " has ", sdk.FormatSize(st.SizeBytes), ", above limit_bytes ", itoa(limit))
	}
	if st.SizeBytes%512 != 0 {
		return nil, sdk.Error(abi.FailedPrecondition, "volume file ", path, " has ", itoa(st.SizeBytes), " bytes, not a whole number of 512-byte blocks")
	}
	if err := b.ensureLUN(volume{lun: lun, path: path, target: b.cfg.target, writeCache: writeCache}); err != nil {
		return nil, err
	}
	ctx := map[string]string{ctxTarget: b.cfg.target, ctxPortal: b.cfg.portal, ctxLUN: strconv.Itoa(lun), ctxPath: path,
		ctxWriteCache: strconv.FormatBool(writeCache)}
	if fsType != "" {
		ctx[ctxFsType] = fsType
	}
	return &abi.CreateVolumeResponse{LocalID: volumeID(nameID, lun), CapacityBytes: st.SizeBytes, Context: ctx}, nil
}

// ensureLUN makes the volume's file its LUN of its target, listening on
// the configured portals and reporting the volume's write cache; an
// existing LUN serving the file is success (lio_lun_create is idempotent
// and sets the write cache again), which also restores a LUN that a
// reboot of the target host took away.
func (b *Backend) ensureLUN(v volume) error {
	err := hostcall.LioLunCreate(&abi.LioLunCreateRequest{Target: v.target, LUN: int32(v.lun), Kind: "fileio", Path: v.path,
		Portals: b.cfg.listen, WriteCache: v.writeCache})
	return sdk.Wrap(err, "serve "+v.path+" as LUN "+strconv.Itoa(v.lun)+" of "+v.target)
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

// DeleteVolume removes the volume's LUN (with its grants), then its file.
// The LUN goes only while it still serves this volume's file, so a repeated
// delete never takes a LUN number that meanwhile serves another volume. A
// volume already gone is success. Snapshots are files of their own and
// survive their source.
func (b *Backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	v, err := b.volumeOf(&req.Volume)
	if abi.CodeOf(err) == abi.NotFound {
		return nil // never one of ours: nothing to delete
	}
	if err != nil {
		return err
	}
	if err := hostcall.LioLunDelete(&abi.LioLunRequest{Target: v.target, LUN: int32(v.lun), Path: v.path}); err != nil {
		return sdk.Wrap(err, "delete LUN "+strconv.Itoa(v.lun)+" of "+v.target)
	}
	return sdk.Wrap(hostcall.FileRemove(v.path), "delete "+v.path)
}

// ExpandVolume grows the volume's file and the size its LUN reports; the
// node then rescans the LUN and the host grows the filesystem. Both steps
// run on every call, so a call that failed between them is finished by the
// CO's retry.
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
	if err := b.ensureLUN(v); err != nil {
		return nil, err
	}
	if err := hostcall.LioLunResize(&abi.LioLunResizeRequest{Target: v.target, LUN: int32(v.lun), SizeBytes: st.SizeBytes}); err != nil {
		return nil, sdk.Wrap(err, "resize LUN "+strconv.Itoa(v.lun)+" of "+v.target)
	}
	return &abi.ExpandVolumeResponse{CapacityBytes: st.SizeBytes, NodeExpansionRequired: true}, nil
}

// ModifyVolume changes the volume's mutable parameter writeCache: the LUN
// reports a write-back cache (initiators then send SYNCHRONIZE CACHE,
// which the target turns into an fsync of the file) or write-through, at
// once and also while nodes use it; their kernels see the new mode at
// their next rescan (an expansion's node step, or a new login). The value
// is kept in the volume's context, so a LUN that ControllerPublish or an
// expansion has to re-create after a reboot of the target host gets it
// too.
func (b *Backend) ModifyVolume(req *abi.ModifyVolumeRequest) (*abi.ModifyVolumeResponse, error) {
	v, err := b.volumeOf(&req.Volume)
	if err != nil {
		return nil, err
	}
	if v.writeCache, err = mutableWriteCache(req.MutableParameters, v.writeCache); err != nil {
		return nil, err
	}
	if _, err := hostcall.FileStat(v.path); err != nil {
		if abi.CodeOf(err) == abi.NotFound {
			return nil, sdk.Error(abi.NotFound, "volume ", req.Volume.LocalID, " does not exist: its file ", v.path, " is gone")
		}
		return nil, sdk.Wrap(err, "stat "+v.path)
	}
	if err := b.ensureLUN(v); err != nil {
		return nil, err
	}
	ctx := make(map[string]string, len(req.Volume.Context)+1)
	for k, val := range req.Volume.Context {
		ctx[k] = val
	}
	ctx[ctxWriteCache] = strconv.FormatBool(v.writeCache)
	return &abi.ModifyVolumeResponse{Context: ctx}, nil
}

// CreateSnapshot clones the volume's file to "<snapshot ID>.snap" beside
// it: a reflink where the pool's filesystem has them (instant, shares
// blocks), else a copy that keeps holes. A snapshot of a volume in use is
// crash-consistent: it holds what LIO had written to the file, as after a
// power cut. The snapshot is no LUN; restoring it makes a new volume.
func (b *Backend) CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	if err := checkParameters(req.Parameters); err != nil {
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
	if _, err := volumeParameters(req.Parameters, nil); err != nil {
		return nil, err
	}
	minSize := minSizeBytes
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

// ControllerPublish lets the node's initiator reach the volume's LUN, with
// the configured CHAP credentials, and tells the node where to log in. It
// first makes sure the LUN exists (LIO's configuration does not survive a
// reboot of the target host; the file does). The node ID carries the
// initiator name its node_info reported.
//
// A read-only publication is enforced by the node's read-only mounts: LIO
// grants have no write protection per initiator here.
func (b *Backend) ControllerPublish(req *abi.ControllerPublishRequest) (*abi.ControllerPublishResponse, error) {
	v, err := b.volumeOf(&req.Volume)
	if err != nil {
		return nil, err
	}
	initiator := req.NodeContext[NodeContextInitiator]
	if initiator == "" {
		return nil, sdk.Error(abi.FailedPrecondition, "node ", strconv.Quote(req.NodeID), " reported no iSCSI initiator name: ",
			"load the iscsi module on it with the iscsi grant and open-iscsi installed")
	}
	if _, err := hostcall.FileStat(v.path); err != nil {
		if abi.CodeOf(err) == abi.NotFound {
			return nil, sdk.Error(abi.NotFound, "volume ", req.Volume.LocalID, " does not exist: its file ", v.path, " is gone")
		}
		return nil, sdk.Wrap(err, "stat "+v.path)
	}
	if err := b.ensureLUN(v); err != nil {
		return nil, err
	}
	grant := &abi.LioGrantRequest{Target: v.target, LUN: int32(v.lun), Initiator: initiator}
	if c := b.cfg.chap; c != nil {
		grant.ChapUser, grant.ChapSecret = c.user, c.secret
	}
	if err := hostcall.LioGrant(grant); err != nil {
		return nil, sdk.Wrap(err, "grant LUN "+strconv.Itoa(v.lun)+" of "+v.target+" to "+initiator)
	}
	portal := req.Volume.Context[ctxPortal]
	if portal == "" {
		portal = b.cfg.portal
	}
	return &abi.ControllerPublishResponse{PublishContext: map[string]string{
		pubPortal: portal, pubTarget: v.target, pubLUN: strconv.Itoa(v.lun),
	}}, nil
}

// ControllerUnpublish takes the LUN away from the node's initiator; the
// target ends the initiator's session when it has no LUN left there (the
// node has logged out by then: the CO unstages before it unpublishes).
func (b *Backend) ControllerUnpublish(req *abi.ControllerUnpublishRequest) error {
	v, err := b.volumeOf(&req.Volume)
	if abi.CodeOf(err) == abi.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	initiator := req.NodeContext[NodeContextInitiator]
	if initiator == "" {
		return nil // such a node was never granted anything
	}
	return sdk.Wrap(hostcall.LioRevoke(&abi.LioGrantRequest{Target: v.target, LUN: int32(v.lun), Initiator: initiator}),
		"revoke LUN "+strconv.Itoa(v.lun)+" of "+v.target+" from "+initiator)
}

// VolumeHealth on the controller checks that the volume's file is there
// and whole; on a node, that the node still reaches the LUN.
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
	return &abi.HealthResponse{}, nil
}

// StorageHealth reports what this daemon needs of its storage: on a node,
// an initiator name; on a controller, a pool with free space.
func (b *Backend) StorageHealth() (*abi.HealthResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if b.cfg.role != "controller" {
		if _, err := hostcall.IscsiInitiatorName(); err != nil {
			return unhealthy(abi.HealthInaccessible, "NoInitiatorName", "this node has no iSCSI initiator name: "+err.Error()), nil
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
