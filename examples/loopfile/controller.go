package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// CreateVolume places a volume file in the pool: new (sparse or
// preallocated), cloned from a snapshot or a volume and grown to the asked
// size. The file's name comes from the request's name, so a repeat finds
// the file of the first call instead of making a second one.
func (b *Backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	prealloc, err := b.preallocFor(req.Parameters)
	if err != nil {
		return nil, err
	}
	if prealloc, err = mutablePrealloc(req.MutableParameters, prealloc); err != nil {
		return nil, err
	}
	if !b.reachable(req.Requisite) {
		return nil, sdk.Error(abi.ResourceExhausted, "no requisite topology includes node ", strconv.Quote(b.cfg.nodeID),
			": loopfile volumes live on the node whose pool holds them")
	}
	fsType, err := b.fsTypeOf(req.Capabilities)
	if err != nil {
		return nil, err
	}
	size, err := b.sizeFor(req.RequiredBytes, req.LimitBytes, fsType)
	if err != nil {
		return nil, err
	}
	id := sdk.NameID(req.Name, "vol")
	path := joinPath(b.cfg.pool, id+volumeSuffix)

	var source string
	switch {
	case req.Source != nil && req.Source.Snapshot != nil:
		sn := req.Source.Snapshot
		if source, err = b.snapshotPath(sn); err != nil {
			return nil, err
		}
		srcFs := sn.Context[ctxFsType]
		if srcFs == "" {
			srcFs = sn.Source.Context[ctxFsType]
		}
		if err := sameFs(fsType, srcFs, "snapshot"); err != nil {
			return nil, err
		}
	case req.Source != nil && req.Source.Volume != nil:
		if source, err = b.volumePath(req.Source.Volume); err != nil {
			return nil, err
		}
		if err := sameFs(fsType, req.Source.Volume.Context[ctxFsType], "volume"); err != nil {
			return nil, err
		}
	}
	if source != "" && dirOf(source) != b.cfg.pool {
		return nil, sdk.Error(abi.InvalidArgument, "source ", source, " is not in this node's pool ", b.cfg.pool)
	}
	if !prealloc {
		if err := b.checkSparseBound(size); err != nil {
			return nil, err
		}
	}
	if source == "" {
		err = hostcall.FileCreate(&abi.FileCreateRequest{Path: path, SizeBytes: size, Prealloc: prealloc})
		if abi.CodeOf(err) == abi.AlreadyExists {
			// The file of an earlier attempt, of another size: the name
			// makes it this volume's. An expansion cut off before its
			// record grew it, or a repeat asks for another size; it is
			// grown, never shrunk, and limit_bytes is checked below.
			err = growTo(path, size, prealloc)
		}
		if err != nil {
			return nil, sdk.Wrap(err, "create "+path)
		}
	} else if err := cloneTo(source, path, size, prealloc); err != nil {
		return nil, err
	}
	st, err := hostcall.FileStat(path)
	if err != nil {
		return nil, sdk.Wrap(err, "stat "+path)
	}
	if req.LimitBytes > 0 && st.SizeBytes > req.LimitBytes {
		return nil, sdk.Error(abi.OutOfRange, "volume file ", path, " has ", sdk.FormatSize(st.SizeBytes), ", above limit_bytes ", itoa(req.LimitBytes))
	}
	ctx := map[string]string{ctxPath: path, ctxNode: b.cfg.nodeID, ctxPrealloc: strconv.FormatBool(prealloc)}
	if fsType != "" {
		ctx[ctxFsType] = fsType
	}
	return &abi.CreateVolumeResponse{LocalID: id, CapacityBytes: st.SizeBytes, Context: ctx, Topology: topology(b.cfg.nodeID)}, nil
}

// reachable reports whether this node satisfies one of the requisite
// topologies. Keys other than TopologyKey belong to other backends or to
// the cluster and do not constrain where a loopfile volume lives.
func (b *Backend) reachable(requisite []abi.Topology) bool {
	if len(requisite) == 0 {
		return true
	}
	for _, t := range requisite {
		if n, ok := t.Segments[TopologyKey]; !ok || n == b.cfg.nodeID {
			return true
		}
	}
	return false
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

// sameFs refuses a clone or restore whose source holds another filesystem
// than the one asked for: the host would refuse to mount it at stage time,
// after the CO believed the volume ready.
func sameFs(want, have, what string) error {
	if want == "" || have == "" || want == have {
		return nil
	}
	return sdk.Error(abi.InvalidArgument, "source ", what, " holds ", have, ", not the requested ", want)
}

// sizeFor is the size of a new volume: the host's rounded request (or the
// default), at least the filesystem's minimum for mount volumes, rounded to
// the granularity, and within limit_bytes.
func (b *Backend) sizeFor(required, limit int64, fsType string) (int64, error) {
	g := b.cfg.granularity
	size := required
	if size <= 0 {
		size = sdk.RoundUp(defaultSizeBytes, g)
	}
	size = max(size, minSizeBytes)
	if fsType != "" {
		size = max(size, fsMinimum(fsType))
	}
	size = sdk.RoundUp(size, g)
	if limit > 0 && size > limit {
		if fsType != "" && fsMinimum(fsType) > limit {
			return 0, sdk.Error(abi.OutOfRange, fsType, " needs at least ", sdk.FormatSize(sdk.RoundUp(fsMinimum(fsType), g)),
				", above limit_bytes ", itoa(limit))
		}
		return 0, sdk.Error(abi.OutOfRange, "no size in units of ", sdk.FormatSize(g), " fits ", itoa(required), "..", itoa(limit))
	}
	return size, nil
}

// checkSparseBound refuses a sparse volume larger than the whole filesystem
// of the pool: such a volume could never be filled, and writes to it would
// fail with I/O errors long before. Sparse volumes together may exceed the
// pool (thin provisioning); one alone may not.
func (b *Backend) checkSparseBound(size int64) error {
	fs, err := hostcall.FileStatfs(b.cfg.pool)
	if err != nil {
		return sdk.Wrap(err, "statfs "+b.cfg.pool)
	}
	if size > fs.TotalBytes {
		return sdk.Error(abi.OutOfRange, "a volume of ", sdk.FormatSize(size), " is larger than the pool's filesystem (",
			sdk.FormatSize(fs.TotalBytes), ")")
	}
	return nil
}

// growTo grows the existing volume file path to size bytes when it is
// smaller (allocating every block when prealloc); a larger one stays as
// it is.
func growTo(path string, size int64, prealloc bool) error {
	st, err := hostcall.FileStat(path)
	if err != nil {
		return err
	}
	if st.SizeBytes >= size {
		return nil
	}
	return hostcall.FileResize(&abi.FileResizeRequest{Path: path, SizeBytes: size, Prealloc: prealloc})
}

// cloneTo makes target a copy of source of at least size bytes, with
// every block allocated when prealloc (a clone shares or copies its
// source's blocks and keeps its holes). A target already there is the work
// of an earlier attempt (files appear only when complete), which needs its
// source no more: start-up's replay of a clone or restore may come after
// the source was deleted. A target that cannot be grown or allocated is
// removed again, so a failed attempt leaves nothing behind.
func cloneTo(source, target string, size int64, prealloc bool) error {
	st, err := hostcall.FileStat(target)
	if abi.CodeOf(err) == abi.NotFound {
		if err := hostcall.FileClone(source, target); err != nil && abi.CodeOf(err) != abi.AlreadyExists {
			return sdk.Wrap(err, "clone "+source+" to "+target)
		}
		st, err = hostcall.FileStat(target)
	}
	if err != nil {
		return sdk.Wrap(err, "stat "+target)
	}
	if st.SizeBytes >= size && !prealloc {
		return nil
	}
	size = max(size, st.SizeBytes)
	if err := hostcall.FileResize(&abi.FileResizeRequest{Path: target, SizeBytes: size, Prealloc: prealloc}); err != nil {
		if rmErr := hostcall.FileRemove(target); rmErr != nil {
			hostcall.Logf(abi.LogWarn, "remove ", target, " after failed resize: ", rmErr.Error())
		}
		return sdk.Wrap(err, "grow "+target+" to "+itoa(size))
	}
	return nil
}

// DeleteVolume removes the volume's file; a missing file is success, an
// attached one FAILED_PRECONDITION (from the host call). Snapshots are
// files of their own and survive their source.
func (b *Backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	path, err := b.volumePath(&req.Volume)
	if err != nil {
		if abi.CodeOf(err) == abi.NotFound {
			return nil // never one of ours: nothing to delete
		}
		return err
	}
	return sdk.Wrap(hostcall.FileRemove(path), "delete "+path)
}

// ExpandVolume grows the volume's file; the node then makes its loop device
// show the new size and the host grows the filesystem.
func (b *Backend) ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	path, err := b.volumePath(&req.Volume)
	if err != nil {
		return nil, err
	}
	prealloc := req.Volume.Context[ctxPrealloc] == "true" || (req.Volume.Context[ctxPrealloc] == "" && b.cfg.prealloc)
	size := req.RequiredBytes
	if b.configured {
		size = sdk.RoundUp(size, b.cfg.granularity)
	}
	size = sdk.RoundUp(size, blockUnit)
	if req.LimitBytes > 0 && size > req.LimitBytes {
		return nil, sdk.Error(abi.OutOfRange, "no size in units of ", sdk.FormatSize(b.cfg.granularity), " fits ", itoa(req.RequiredBytes), "..", itoa(req.LimitBytes))
	}
	st, err := hostcall.FileStat(path)
	if err != nil {
		return nil, sdk.Wrap(err, "stat "+path)
	}
	if st.SizeBytes < size {
		if !prealloc {
			fs, err := hostcall.FileStatfs(dirOf(path))
			if err != nil {
				return nil, sdk.Wrap(err, "statfs "+dirOf(path))
			}
			if size > fs.TotalBytes {
				return nil, sdk.Error(abi.OutOfRange, "a volume of ", sdk.FormatSize(size), " is larger than the pool's filesystem (", sdk.FormatSize(fs.TotalBytes), ")")
			}
		}
		if err := hostcall.FileResize(&abi.FileResizeRequest{Path: path, SizeBytes: size, Prealloc: prealloc}); err != nil {
			return nil, sdk.Wrap(err, "grow "+path+" to "+itoa(size))
		}
		if st, err = hostcall.FileStat(path); err != nil {
			return nil, sdk.Wrap(err, "stat "+path)
		}
	}
	return &abi.ExpandVolumeResponse{CapacityBytes: st.SizeBytes, NodeExpansionRequired: true}, nil
}

// ModifyVolume changes the volume's mutable parameter prealloc. Turned on,
// every hole of the volume's file is allocated at once (file_resize with
// Prealloc at the file's size), so no later write to the volume can fail
// for lack of space in the pool, and expansions allocate their new part
// too; RESOURCE_EXHAUSTED when the pool has no room, with the volume left
// sparse. Turned off, expansions stay sparse from now on; blocks already
// allocated stay allocated, because the daemon cannot tell blocks
// preallocated but never written from a workload's data without racing
// the workload's writes. The new value is kept in the volume's context.
func (b *Backend) ModifyVolume(req *abi.ModifyVolumeRequest) (*abi.ModifyVolumeResponse, error) {
	path, err := b.volumePath(&req.Volume)
	if err != nil {
		return nil, err
	}
	prealloc, err := mutablePrealloc(req.MutableParameters, req.Volume.Context[ctxPrealloc] == "true")
	if err != nil {
		return nil, err
	}
	if prealloc {
		st, err := hostcall.FileStat(path)
		if err != nil {
			return nil, sdk.Wrap(err, "stat "+path)
		}
		if err := hostcall.FileResize(&abi.FileResizeRequest{Path: path, SizeBytes: st.SizeBytes, Prealloc: true}); err != nil {
			return nil, sdk.Wrap(err, "allocate "+path)
		}
	}
	ctx := make(map[string]string, len(req.Volume.Context)+1)
	for k, v := range req.Volume.Context {
		ctx[k] = v
	}
	ctx[ctxPrealloc] = strconv.FormatBool(prealloc)
	return &abi.ModifyVolumeResponse{Context: ctx}, nil
}

// CreateSnapshot clones the volume's file to "<snapshot ID>.snap" beside
// it: a reflink where the pool's filesystem has them (instant, shares
// blocks), else a copy that keeps holes. A reflink of a volume in use
// holds one moment of its file. A copy does only because the host freezes
// a mount volume's filesystem on this node around this call
// (host/RATIONALE.md, "Snapshots of volumes in use"); a block volume in
// use is copied while it is written.
func (b *Backend) CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	for k := range req.Parameters {
		if !strings.HasPrefix(k, kubernetesPrefix) {
			return nil, sdk.Error(abi.InvalidArgument, "unknown snapshot parameter ", strconv.Quote(k), " (loopfile takes none)")
		}
	}
	source, err := b.volumePath(&req.Source)
	if err != nil {
		return nil, err
	}
	id := sdk.NameID(req.Name, "snap")
	path := joinPath(dirOf(source), id+snapshotSuffix)
	if err := hostcall.FileClone(source, path); err != nil && abi.CodeOf(err) != abi.AlreadyExists {
		return nil, sdk.Wrap(err, "snapshot "+source+" to "+path)
	}
	st, err := hostcall.FileStat(path)
	if err != nil {
		return nil, sdk.Wrap(err, "stat "+path)
	}
	node := b.nodeOf(req.Source.Context)
	ctx := map[string]string{ctxPath: path}
	if node != "" {
		ctx[ctxNode] = node
	}
	if fs := req.Source.Context[ctxFsType]; fs != "" {
		ctx[ctxFsType] = fs
	}
	resp := &abi.CreateSnapshotResponse{LocalID: id, SizeBytes: st.SizeBytes, Context: ctx, ReadyToUse: true}
	if node != "" {
		resp.Topology = topology(node)
	}
	return resp, nil
}

// DeleteSnapshot removes the snapshot's file; a missing one is success.
func (b *Backend) DeleteSnapshot(req *abi.DeleteSnapshotRequest) error {
	path, err := b.snapshotPath(&req.Snapshot)
	if err != nil {
		if abi.CodeOf(err) == abi.NotFound {
			return nil
		}
		return err
	}
	return sdk.Wrap(hostcall.FileRemove(path), "delete snapshot "+path)
}

// SnapshotData names the snapshot's file for the SnapshotMetadata service.
func (b *Backend) SnapshotData(req *abi.SnapshotDataRequest) (*abi.SnapshotDataResponse, error) {
	path, err := b.snapshotPath(&req.Snapshot)
	if err != nil {
		return nil, err
	}
	st, err := hostcall.FileStat(path)
	if err != nil {
		return nil, sdk.Wrap(err, "stat snapshot "+path)
	}
	return &abi.SnapshotDataResponse{Path: path, SizeBytes: st.SizeBytes, BlockSize: snapshotBlockSize}, nil
}

// GetCapacity reports the pool's free bytes. AvailableBytes is what can
// still be written; MaximumVolumeSize is that too for preallocated volumes,
// and the size of the pool's whole filesystem for sparse ones (the largest
// volume CreateVolume accepts: volumes are thin, so a sparse volume may be
// larger than the free space, but never larger than the filesystem). A
// topology of another node has no capacity here.
func (b *Backend) GetCapacity(req *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	prealloc, err := b.preallocFor(req.Parameters)
	if err != nil {
		return nil, err
	}
	if req.Topology != nil {
		if n, ok := req.Topology.Segments[TopologyKey]; ok && n != b.cfg.nodeID {
			return &abi.GetCapacityResponse{}, nil
		}
	}
	g := b.cfg.granularity
	minSize := sdk.RoundUp(minSizeBytes, g)
	if req.Capability != nil && !req.Capability.Block {
		fs := req.Capability.FsType
		if fs == "" {
			fs = b.cfg.fsType
		}
		minSize = sdk.RoundUp(fsMinimum(fs), g)
	}
	fs, err := hostcall.FileStatfs(b.cfg.pool)
	if err != nil {
		return nil, sdk.Wrap(err, "statfs "+b.cfg.pool)
	}
	avail := sdk.RoundDown(fs.AvailableBytes, g)
	maxSize := sdk.RoundDown(fs.TotalBytes, g)
	if prealloc {
		maxSize = avail
	}
	if maxSize < minSize {
		return &abi.GetCapacityResponse{AvailableBytes: avail}, nil
	}
	return &abi.GetCapacityResponse{AvailableBytes: avail, MaximumVolumeSize: maxSize, MinimumVolumeSize: minSize}, nil
}

// VolumeHealth on the controller checks that the volume's file is there
// and whole; on a node, that a loop device still backs it.
func (b *Backend) VolumeHealth(req *abi.VolumeHealthRequest) (*abi.HealthResponse, error) {
	path, err := b.volumePath(&req.Volume)
	if err != nil {
		return nil, err
	}
	if req.OnNode {
		return nodeHealth(path, req.Device)
	}
	st, err := hostcall.FileStat(path)
	switch {
	case abi.CodeOf(err) == abi.NotFound:
		return unhealthy(abi.HealthInaccessible, "VolumeFileMissing", "volume file "+path+" is missing"), nil
	case err != nil:
		return nil, sdk.Wrap(err, "stat "+path)
	case req.Volume.CapacityBytes > 0 && st.SizeBytes < req.Volume.CapacityBytes:
		return unhealthy(abi.HealthDataLoss, "VolumeFileTruncated", "volume file "+path+" has "+sdk.FormatSize(st.SizeBytes)+
			", the volume "+sdk.FormatSize(req.Volume.CapacityBytes)), nil
	}
	return &abi.HealthResponse{}, nil
}

// StorageHealth reports a pool that cannot be read or has no free byte.
func (b *Backend) StorageHealth() (*abi.HealthResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	fs, err := hostcall.FileStatfs(b.cfg.pool)
	if err != nil {
		return unhealthy(abi.HealthInaccessible, "PoolUnreachable", "pool "+b.cfg.pool+": "+err.Error()), nil
	}
	if fs.AvailableBytes <= 0 {
		return unhealthy(abi.HealthDegraded, "PoolFull", "pool "+b.cfg.pool+" has no free space: writes to sparse volumes fail"), nil
	}
	return &abi.HealthResponse{}, nil
}

func unhealthy(status abi.HealthStatus, reason, msg string) *abi.HealthResponse {
	return &abi.HealthResponse{Entries: []abi.HealthEntry{{Status: status, Reason: reason, Message: msg}}}
}
