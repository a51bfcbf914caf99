package main

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// NodeInfo pins volumes to this node: the pool is node-local.
func (b *Backend) NodeInfo() (*abi.NodeInfoResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	return &abi.NodeInfoResponse{Topology: &abi.Topology{Segments: map[string]string{TopologyKey: b.cfg.node}}}, nil
}

// NodeStage activates the volume's thin device with its recorded size and
// names it, /dev/mapper/<pool>-<id>; the host formats and mounts it or
// publishes it as a block device. An active device of a smaller size (the
// volume grew while it was active elsewhere in this daemon's life) is
// grown first; a repeat finds the device active and answers it again.
func (b *Backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	id, size, err := b.nodeVolume(&req.Volume)
	if err != nil {
		return nil, err
	}
	thin := &abi.DmThinRequest{Pool: b.cfg.pool, ID: id, SizeBytes: size}
	resp, err := hostcall.DmThinActivate(thin)
	if abi.CodeOf(err) == abi.AlreadyExists {
		if rerr := hostcall.DmThinResize(thin); rerr != nil {
			return nil, errorf(abi.FailedPrecondition, "volume ", req.Volume.LocalID, " is active with another size than its ", i64(size), " bytes: ", message(rerr))
		}
		resp, err = hostcall.DmThinActivate(thin)
	}
	if err != nil {
		return nil, wrap(err, "activate volume ", req.Volume.LocalID, " (thin ", u64(uint64(id)), " of pool ", b.cfg.pool, ", ", i64(size), " bytes)")
	}
	return &abi.NodeStageResponse{Device: resp.Path}, nil
}

// NodeUnstage deactivates the thin device after the host unmounted it; the
// volume stays in the pool. Inactive already is success.
func (b *Backend) NodeUnstage(req *abi.NodeUnstageRequest) error {
	if err := b.ready(); err != nil {
		return err
	}
	id, ok := parseLocalID(kindVolume, req.Volume.LocalID)
	if !ok {
		return nil
	}
	if err := b.inPool(req.Volume.Context, "volume", req.Volume.LocalID); err != nil {
		return err
	}
	if err := hostcall.DmThinDeactivate(&abi.DmThinRequest{Pool: b.cfg.pool, ID: id}); err != nil {
		return wrap(err, "deactivate volume ", req.Volume.LocalID)
	}
	return nil
}

// NodeExpand makes sure the active device has the volume's recorded size
// (ExpandVolume already grew it when it was active) and reports that size;
// the host then grows the filesystem.
func (b *Backend) NodeExpand(req *abi.NodeExpandRequest) (*abi.NodeExpandResponse, error) {
	id, size, err := b.nodeVolume(&req.Volume)
	if err != nil {
		return nil, err
	}
	if req.RequiredBytes > size {
		return nil, errorf(abi.OutOfRange, "volume ", req.Volume.LocalID, " has ", i64(size), " bytes; expand it to ",
			i64(req.RequiredBytes), " with ControllerExpandVolume first")
	}
	if err := hostcall.DmThinResize(&abi.DmThinRequest{Pool: b.cfg.pool, ID: id, SizeBytes: size}); err != nil {
		return nil, wrap(err, "resize volume ", req.Volume.LocalID, " to ", i64(size), " bytes")
	}
	return &abi.NodeExpandResponse{CapacityBytes: size}, nil
}

// nodeVolume resolves a node operation's volume to its thin id and current
// size: the size record, else the context's size from the creation.
func (b *Backend) nodeVolume(v *abi.VolumeRef) (uint32, int64, error) {
	if err := b.ready(); err != nil {
		return 0, 0, err
	}
	id, ok := parseLocalID(kindVolume, v.LocalID)
	if !ok {
		return 0, 0, errorf(abi.NotFound, "volume ", v.LocalID, " is not a dmthin volume")
	}
	if err := b.inPool(v.Context, "volume", v.LocalID); err != nil {
		return 0, 0, err
	}
	size := b.sizeOf(id, v.Context, v.CapacityBytes)
	if size <= 0 {
		return 0, 0, errorf(abi.NotFound, "volume ", v.LocalID, " has no size record in ", b.cfg.state, " and no size in its context")
	}
	return id, size, nil
}

// StorageHealth reports the pool's condition as the kernel reports it, and
// a pool about to run out of data or metadata space.
func (b *Backend) StorageHealth() (*abi.HealthResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	st, err := b.status()
	if err != nil {
		return unhealthy(abi.HealthInaccessible, "PoolUnreadable", message(err)), nil
	}
	return &abi.HealthResponse{Entries: poolHealth(st, b.cfg.pool)}, nil
}

// VolumeHealth reports what keeps a volume from working: the pool's
// conditions, which every volume in it shares (failed, read-only, needing
// a check, out of or low on data or metadata space), its thin device gone
// from the pool's metadata (its data is lost), and on a node the staged
// device gone or replaced (removed behind the daemon's back) or failed.
// Asking activates nothing (dm_thin_status).
func (b *Backend) VolumeHealth(req *abi.VolumeHealthRequest) (*abi.HealthResponse, error) {
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
	st, err := b.status()
	if err != nil {
		return unhealthy(abi.HealthInaccessible, "PoolUnreadable", message(err)), nil
	}
	out := &abi.HealthResponse{Entries: poolHealth(st, b.cfg.pool)}
	if st.Failed {
		return out, nil // the pool says nothing more about its devices
	}
	ts, err := hostcall.DmThinStatus(&abi.DmThinRequest{Pool: b.cfg.pool, ID: id})
	if err != nil {
		return nil, wrap(err, "status of volume ", v.LocalID, " (thin ", u64(uint64(id)), " of pool ", b.cfg.pool, ")")
	}
	add := func(status abi.HealthStatus, reason string, msg ...string) {
		out.Entries = append(out.Entries, abi.HealthEntry{Status: status, Reason: reason, Message: strings.Join(msg, "")})
	}
	thin := "thin " + u64(uint64(id)) + " of pool " + b.cfg.pool
	switch {
	case !ts.Exists:
		add(abi.HealthDataLoss, "ThinDeviceDeleted", thin, " is gone from the pool's metadata: the volume's data is lost")
	case ts.Failed:
		add(abi.HealthInaccessible, "ThinDeviceFailed", thin, " reports failure")
	case req.OnNode && req.Device != "" && !ts.Active:
		add(abi.HealthInaccessible, "DeviceMissing", "the staged device ", req.Device, " of ", thin, " is gone")
	case req.OnNode && req.Device != "" && ts.Path != req.Device:
		add(abi.HealthInaccessible, "DeviceChanged", thin, " is active as ", ts.Path, ", not as the staged ", req.Device)
	}
	return out, nil
}

func unhealthy(status abi.HealthStatus, reason, msg string) *abi.HealthResponse {
	return &abi.HealthResponse{Entries: []abi.HealthEntry{{Status: status, Reason: reason, Message: msg}}}
}

// lowSpacePercent is the free share of data or metadata below which the
// pool reports itself degraded.
const lowSpacePercent = 5

func poolHealth(st *abi.DmPoolStatus, pool string) []abi.HealthEntry {
	var out []abi.HealthEntry
	add := func(status abi.HealthStatus, reason, msg string) {
		out = append(out, abi.HealthEntry{Status: status, Reason: reason, Message: "thin pool " + pool + ": " + msg})
	}
	if st.Failed {
		add(abi.HealthInaccessible, "PoolFailed", "the kernel failed the pool")
		return out
	}
	if st.NeedsCheck {
		add(abi.HealthDegraded, "PoolNeedsCheck", "the metadata needs thin_check before the pool is writable again")
	}
	if st.ReadOnly {
		add(abi.HealthDegraded, "PoolReadOnly", "the pool is read-only")
	}
	if st.OutOfDataSpace {
		add(abi.HealthDegraded, "PoolOutOfDataSpace", "no free data blocks: writes to unallocated blocks fail")
	} else if low(st.UsedDataBlocks, st.TotalDataBlocks) {
		add(abi.HealthDegraded, "PoolDataLow", u64(st.UsedDataBlocks)+" of "+u64(st.TotalDataBlocks)+" data blocks used")
	}
	if low(st.UsedMetaBlocks, st.TotalMetaBlocks) {
		add(abi.HealthDegraded, "PoolMetadataLow", u64(st.UsedMetaBlocks)+" of "+u64(st.TotalMetaBlocks)+" metadata blocks used")
	}
	return out
}

func low(used, total uint64) bool {
	return total > 0 && (total-min(used, total))*100 < total*lowSpacePercent
}
