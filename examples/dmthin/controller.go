package main

import (
	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// CreateVolume claims a thin id for the name (see records.go), records the
// volume's size and creates the thin device: empty, or as a thin snapshot of
// the source volume or snapshot, which shares every block with it. A
// repeated call finds the same id and whatever of its steps already
// happened. Sizes are rounded up to the pool's block size; mount volumes
// are raised to their filesystem's minimum, which costs nothing in a thin
// pool.
func (b *Backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if !b.reachable(req.Requisite) {
		return nil, errorf(abi.ResourceExhausted, "dmthin volumes live on node ", b.cfg.node, ", which the requisite topology excludes")
	}
	if err := checkParameters(req.Parameters); err != nil {
		return nil, err
	}
	origin, sourceSize, err := b.source(req.Source)
	if err != nil {
		return nil, err
	}
	size, err := b.volumeSize(req, sourceSize)
	if err != nil {
		return nil, err
	}
	id, err := b.claim(ownerOf(kindVolume, req.Name))
	if err != nil {
		return nil, err
	}
	if err := b.admit(id); err != nil {
		return nil, err
	}
	if err := b.recordSize(id, size, "volume "+req.Name); err != nil {
		return nil, err
	}
	if origin == 0 {
		err = b.createThin(id, size)
	} else {
		err = b.snapshotThin(origin, id)
	}
	if err != nil {
		b.rollback(id)
		return nil, err
	}
	return &abi.CreateVolumeResponse{
		LocalID:       localID(kindVolume, id),
		CapacityBytes: size,
		Context:       b.context(id, size),
		Topology:      []abi.Topology{{Segments: map[string]string{TopologyKey: b.cfg.node}}},
	}, nil
}

// checkParameters refuses StorageClass parameters: dmthin has none of its
// own. Keys the CO's sidecars add (csi.storage.k8s.io/...) are accepted.
func checkParameters(params map[string]string) error {
	for k := range params {
		if len(k) >= len(kubernetesPrefix) && k[:len(kubernetesPrefix)] == kubernetesPrefix {
			continue
		}
		return errorf(abi.InvalidArgument, "unknown parameter \"", k, "\": dmthin takes no StorageClass parameters")
	}
	return nil
}

const kubernetesPrefix = "csi.storage.k8s.io/"

// source resolves a content source to the thin id to snapshot and its
// size; origin 0 means no source.
func (b *Backend) source(src *abi.VolumeSource) (origin uint32, size int64, err error) {
	switch {
	case src == nil:
		return 0, 0, nil
	case src.Snapshot != nil:
		s := src.Snapshot
		id, ok := parseLocalID(kindSnapshot, s.LocalID)
		if !ok {
			return 0, 0, errorf(abi.NotFound, "snapshot ", s.LocalID, " is not a dmthin snapshot")
		}
		if err := b.inPool(s.Context, "snapshot", s.LocalID); err != nil {
			return 0, 0, err
		}
		return id, b.sizeOf(id, s.Context, s.SizeBytes), nil
	case src.Volume != nil:
		v := src.Volume
		id, ok := parseLocalID(kindVolume, v.LocalID)
		if !ok {
			return 0, 0, errorf(abi.NotFound, "volume ", v.LocalID, " is not a dmthin volume")
		}
		if err := b.inPool(v.Context, "volume", v.LocalID); err != nil {
			return 0, 0, err
		}
		return id, b.sizeOf(id, v.Context, v.CapacityBytes), nil
	}
	return 0, 0, errorf(abi.InvalidArgument, "volume source names neither a snapshot nor a volume")
}

// volumeSize is the size to provision: the request (never below the
// source's size), raised to the minimum of every requested filesystem and
// rounded up to the block size, within the request's limit.
func (b *Backend) volumeSize(req *abi.CreateVolumeRequest, sourceSize int64) (int64, error) {
	size := req.RequiredBytes
	if size <= 0 {
		size = defaultSizeBytes
	}
	size = max(size, sourceSize, minVolumeBytes)
	for _, c := range req.Capabilities {
		if c.Block {
			continue
		}
		fs := c.FsType
		if fs == "" {
			fs = b.cfg.fsType
		}
		size = max(size, fsMinimum(fs))
	}
	size = sdk.RoundUp(size, b.blockBytes)
	if req.LimitBytes > 0 && size > req.LimitBytes {
		return 0, errorf(abi.OutOfRange, "volume needs ", i64(size), " bytes (source, filesystem minimum and block size of ",
			i64(b.blockBytes), "), above the limit of ", i64(req.LimitBytes))
	}
	return size, nil
}

// admit refuses a new thin device when the pool can take no more data
// (see capacity). A claimed id that already has its size record is a
// repeat of an earlier call, which is answered whatever the pool's state;
// a fresh claim is released again.
func (b *Backend) admit(id uint32) error {
	if _, repeat := b.recordedSize(id); repeat {
		return nil
	}
	st, err := b.status()
	if err == nil {
		if avail, why := capacity(st); avail == 0 {
			err = errorf(abi.ResourceExhausted, "thin pool ", b.cfg.pool, " takes no new volume: ", why)
		}
	}
	if err != nil {
		b.rollback(id)
	}
	return err
}

// createThin creates thin id, or finds it made by an earlier attempt, and
// leaves it inactive: nodes activate volumes when they stage them.
func (b *Backend) createThin(id uint32, size int64) error {
	_, err := hostcall.DmThinCreate(&abi.DmThinRequest{Pool: b.cfg.pool, ID: id, SizeBytes: size})
	if err != nil && abi.CodeOf(err) != abi.AlreadyExists {
		return wrap(err, "create thin ", u64(uint64(id)), " of ", i64(size), " bytes in pool ", b.cfg.pool)
	}
	if err := hostcall.DmThinDeactivate(&abi.DmThinRequest{Pool: b.cfg.pool, ID: id}); err != nil {
		// Harmless: the device stays active until its volume is staged,
		// unstaged or deleted.
		hostcall.Logf(abi.LogWarn, "dmthin: deactivate new thin ", u64(uint64(id)), ": ", message(err))
	}
	return nil
}

// snapshotThin makes thin id a snapshot of origin, or finds it made by an
// earlier attempt (the claim says the id is ours).
func (b *Backend) snapshotThin(origin, id uint32) error {
	err := hostcall.DmThinSnapshot(&abi.DmThinSnapshotRequest{Pool: b.cfg.pool, OriginID: origin, SnapshotID: id})
	if err != nil && abi.CodeOf(err) != abi.AlreadyExists {
		return wrap(err, "snapshot thin ", u64(uint64(origin)), " as ", u64(uint64(id)), " in pool ", b.cfg.pool)
	}
	return nil
}

// rollback releases the records of an id whose thin device could not be
// made, so that the id does not stay reserved. The device does not exist:
// an earlier attempt's device would have made the step succeed.
func (b *Backend) rollback(id uint32) {
	if err := b.dropRecords(id); err != nil {
		hostcall.Logf(abi.LogWarn, "dmthin: ", message(err))
	}
}

// DeleteVolume deletes the thin device, which frees the blocks no snapshot
// shares, then its records. A volume already gone is success; one still
// active and open (staged and mounted) is FAILED_PRECONDITION.
func (b *Backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	return b.deleteThin(kindVolume, req.Volume.LocalID, req.Volume.Context, "volume")
}

func (b *Backend) deleteThin(kind byte, local string, ctx map[string]string, what string) error {
	if err := b.ready(); err != nil {
		return err
	}
	id, ok := parseLocalID(kind, local)
	if !ok {
		return nil // never one of ours
	}
	if err := b.inPool(ctx, what, local); err != nil {
		return err
	}
	err := hostcall.DmThinDelete(&abi.DmThinRequest{Pool: b.cfg.pool, ID: id})
	if err != nil && abi.CodeOf(err) != abi.NotFound {
		return wrap(err, "delete ", what, " ", local, " (thin ", u64(uint64(id)), " of pool ", b.cfg.pool, ")")
	}
	return b.dropRecords(id)
}

// ExpandVolume grows the volume: the size record first (so a node that
// activates the volume later uses the new size), then the thin device if
// it is active. The filesystem grows on the node (NodeExpansion).
func (b *Backend) ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	v := req.Volume
	id, ok := parseLocalID(kindVolume, v.LocalID)
	if !ok {
		return nil, errorf(abi.NotFound, "volume ", v.LocalID, " is not a dmthin volume")
	}
	if err := b.inPool(v.Context, "volume", v.LocalID); err != nil {
		return nil, err
	}
	size := sdk.RoundUp(req.RequiredBytes, b.blockBytes)
	if req.LimitBytes > 0 && size > req.LimitBytes {
		return nil, errorf(abi.OutOfRange, "expansion to ", i64(req.RequiredBytes), " bytes rounds up to ", i64(size), ", above the limit of ", i64(req.LimitBytes))
	}
	current := b.sizeOf(id, v.Context, v.CapacityBytes)
	if size <= current {
		return &abi.ExpandVolumeResponse{CapacityBytes: current, NodeExpansionRequired: true}, nil
	}
	if err := b.growRecord(id, size); err != nil {
		return nil, err
	}
	if err := hostcall.DmThinResize(&abi.DmThinRequest{Pool: b.cfg.pool, ID: id, SizeBytes: size}); err != nil {
		return nil, wrap(err, "resize thin ", u64(uint64(id)), " to ", i64(size), " bytes")
	}
	ctx := map[string]string{}
	for k, val := range v.Context {
		ctx[k] = val
	}
	ctx[ctxSize] = i64(size)
	return &abi.ExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true, Context: ctx}, nil
}

// CreateSnapshot makes a thin snapshot of the volume: instant, sharing all
// of its blocks. An active (staged) volume is suspended for the moment of
// the snapshot, which flushes its writes, so the snapshot is crash
// consistent. A repeated call finds the snapshot made before.
func (b *Backend) CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if !b.reachable(req.Requisite) {
		return nil, errorf(abi.ResourceExhausted, "dmthin snapshots live on node ", b.cfg.node, ", which the requisite topology excludes")
	}
	src := req.Source
	origin, ok := parseLocalID(kindVolume, src.LocalID)
	if !ok {
		return nil, errorf(abi.NotFound, "volume ", src.LocalID, " is not a dmthin volume")
	}
	if err := b.inPool(src.Context, "volume", src.LocalID); err != nil {
		return nil, err
	}
	if err := checkParameters(req.Parameters); err != nil {
		return nil, err
	}
	size := b.sizeOf(origin, src.Context, src.CapacityBytes)
	id, err := b.claim(ownerOf(kindSnapshot, req.Name))
	if err != nil {
		return nil, err
	}
	if err := b.admit(id); err != nil {
		return nil, err
	}
	if err := b.recordSize(id, size, "snapshot "+req.Name); err != nil {
		return nil, err
	}
	if err := b.snapshotThin(origin, id); err != nil {
		b.rollback(id)
		return nil, err
	}
	return &abi.CreateSnapshotResponse{
		LocalID:    localID(kindSnapshot, id),
		SizeBytes:  size,
		Context:    b.context(id, size),
		ReadyToUse: true,
		Topology:   []abi.Topology{{Segments: map[string]string{TopologyKey: b.cfg.node}}},
	}, nil
}

// DeleteSnapshot deletes the snapshot's thin device and its records.
// Volumes restored from it keep the blocks they share with it.
func (b *Backend) DeleteSnapshot(req *abi.DeleteSnapshotRequest) error {
	return b.deleteThin(kindSnapshot, req.Snapshot.LocalID, req.Snapshot.Context, "snapshot")
}

// SnapshotData names the snapshot's thin device for the SnapshotMetadata
// service; the host reads its mapped blocks, and the blocks changed since
// an older snapshot, from the pool's metadata, in the pool's blocks.
func (b *Backend) SnapshotData(req *abi.SnapshotDataRequest) (*abi.SnapshotDataResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	s := req.Snapshot
	id, ok := parseLocalID(kindSnapshot, s.LocalID)
	if !ok {
		return nil, errorf(abi.NotFound, "snapshot ", s.LocalID, " is not a dmthin snapshot")
	}
	if err := b.inPool(s.Context, "snapshot", s.LocalID); err != nil {
		return nil, err
	}
	return &abi.SnapshotDataResponse{ThinPool: b.cfg.pool, ThinID: id, SizeBytes: b.sizeOf(id, s.Context, s.SizeBytes)}, nil
}

// GetCapacity reports what the pool can still store (see capacity).
func (b *Backend) GetCapacity(req *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if req.Topology != nil {
		if v, ok := req.Topology.Segments[TopologyKey]; ok && v != b.cfg.node {
			return &abi.GetCapacityResponse{}, nil
		}
	}
	st, err := b.status()
	if err != nil {
		return nil, err
	}
	avail, _ := capacity(st)
	return &abi.GetCapacityResponse{AvailableBytes: avail, MinimumVolumeSize: b.Info().MinSizeBytes}, nil
}

func (b *Backend) status() (*abi.DmPoolStatus, error) {
	st, err := hostcall.DmPoolStatus(&abi.DmPoolRequest{Pool: b.cfg.pool})
	if err != nil {
		return nil, wrap(err, "status of thin pool ", b.cfg.pool)
	}
	return st, nil
}

// Capacity accounting: what new data the pool can still take.
const (
	metaBlockBytes = 4096
	// metaPerDataBlock is the metadata a mapped data block costs, with the
	// margin hostcalls/dm budgets for snapshots unsharing btree nodes.
	metaPerDataBlock = 48
	// metaReserveBlocks caps the metadata the accounting keeps free: the
	// kernel's own low-water mark is min(4 MiB, a quarter of the device).
	metaReserveBlocks = 1024
)

// capacity returns the bytes of new data the pool can take, and why it
// is zero when it is:
//
//	data     = free data blocks
//	meta     = (free metadata blocks - reserve) × 4096 / 48
//	           with reserve = min(1024, total metadata blocks / 4)
//	capacity = min(data, meta) × block size
//
// Data written to a volume or snapshot counts once however many thin
// devices share it; a write to a shared block costs a new block (copy on
// write). The metadata term makes the answer fall to zero before the
// metadata runs out, which would turn the whole pool read-only. A pool
// that is failed, read-only, out of data space or needs a check reports 0.
func capacity(st *abi.DmPoolStatus) (int64, string) {
	switch {
	case st.Failed:
		return 0, "the pool has failed"
	case st.NeedsCheck:
		return 0, "the pool's metadata needs a check (thin_check)"
	case st.ReadOnly:
		return 0, "the pool is read-only"
	case st.OutOfDataSpace:
		return 0, "the pool is out of data space"
	}
	blockBytes := st.BlockSectors * sectorSize
	var data uint64
	if st.TotalDataBlocks > st.UsedDataBlocks {
		data = st.TotalDataBlocks - st.UsedDataBlocks
	}
	reserve := min(uint64(metaReserveBlocks), st.TotalMetaBlocks/4)
	var freeMeta uint64
	if st.TotalMetaBlocks > st.UsedMetaBlocks+reserve {
		freeMeta = st.TotalMetaBlocks - st.UsedMetaBlocks - reserve
	}
	meta := freeMeta * metaBlockBytes / metaPerDataBlock
	blocks := min(data, meta)
	switch {
	case data == 0:
		return 0, "no free data blocks"
	case meta == 0:
		return 0, "the metadata is nearly full"
	case blockBytes == 0:
		return 0, "the pool reports no block size"
	}
	if blocks > uint64(1<<62)/blockBytes {
		return 1 << 62, ""
	}
	return int64(blocks * blockBytes), ""
}

func (b *Backend) reachable(requisite []abi.Topology) bool {
	if len(requisite) == 0 {
		return true
	}
	for _, t := range requisite {
		if v, ok := t.Segments[TopologyKey]; !ok || v == b.cfg.node {
			return true
		}
	}
	return false
}
