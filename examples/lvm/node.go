package main

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// NodeInfo pins volumes to this node: volume groups are node-local.
func (b *Backend) NodeInfo() (*abi.NodeInfoResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	return &abi.NodeInfoResponse{Topology: &abi.Topology{Segments: map[string]string{TopologyKey: b.cfg.node}}}, nil
}

// NodeStage activates the volume's LV and names its device; the host checks
// the device is the lvm family's (by its number), then formats and mounts
// it or publishes it as a block device. A repeat finds it active.
func (b *Backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	loc, err := b.locate(kindVolume, req.Volume.LocalID, req.Volume.Context, "volume")
	if err != nil {
		return nil, err
	}
	lv, err := hostcall.LvmLvActivate(&abi.LvmLvRequest{VG: loc.vg, Name: loc.lv})
	if err != nil {
		return nil, wrap(err, "activate volume ", req.Volume.LocalID, " (LV ", loc.vg, "/", loc.lv, ")")
	}
	return &abi.NodeStageResponse{Device: lv.Path}, nil
}

// NodeUnstage deactivates the LV after the host unmounted it; the volume
// stays. Inactive or gone already is success.
func (b *Backend) NodeUnstage(req *abi.NodeUnstageRequest) error {
	if err := b.ready(); err != nil {
		return err
	}
	if !parseLocal(kindVolume, req.Volume.LocalID) {
		return nil
	}
	loc, err := b.locate(kindVolume, req.Volume.LocalID, req.Volume.Context, "volume")
	if err != nil {
		return err
	}
	err = hostcall.LvmLvDeactivate(&abi.LvmLvRequest{VG: loc.vg, Name: loc.lv})
	if err != nil && abi.CodeOf(err) != abi.NotFound {
		return wrap(err, "deactivate volume ", req.Volume.LocalID)
	}
	return nil
}

// NodeExpand reports the LV's size (ExpandVolume grew it live); the host
// then grows the filesystem.
func (b *Backend) NodeExpand(req *abi.NodeExpandRequest) (*abi.NodeExpandResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	loc, err := b.locate(kindVolume, req.Volume.LocalID, req.Volume.Context, "volume")
	if err != nil {
		return nil, err
	}
	lv, err := hostcall.LvmLvStatus(&abi.LvmLvRequest{VG: loc.vg, Name: loc.lv})
	if err != nil {
		return nil, wrap(err, "status of volume ", req.Volume.LocalID)
	}
	if req.RequiredBytes > lv.SizeBytes {
		return nil, errorf(abi.OutOfRange, "volume ", req.Volume.LocalID, " has ", i64(lv.SizeBytes), " bytes; expand it to ",
			i64(req.RequiredBytes), " with ControllerExpandVolume first")
	}
	return &abi.NodeExpandResponse{CapacityBytes: lv.SizeBytes}, nil
}

// StorageHealth reports every device class: a VG missing physical volumes
// or gone, a thin pool failed, read-only, out of or nearly out of space.
func (b *Backend) StorageHealth() (*abi.HealthResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	out := &abi.HealthResponse{}
	for _, n := range b.cfg.names {
		cl := b.cfg.classes[n]
		out.Entries = append(out.Entries, b.classHealth(cl.vg, cl.pool)...)
	}
	return out, nil
}

// classHealth is what the VG, and the thin pool when there is one, say.
func (b *Backend) classHealth(vgName, pool string) []abi.HealthEntry {
	var out []abi.HealthEntry
	add := func(status abi.HealthStatus, reason string, msg ...string) {
		out = append(out, abi.HealthEntry{Status: status, Reason: reason, Message: strings.Join(msg, "")})
	}
	vg, err := hostcall.LvmVgStatus(&abi.LvmVgRequest{VG: vgName})
	if err != nil {
		add(abi.HealthInaccessible, "VolumeGroupUnreadable", "volume group ", vgName, ": ", message(err))
		return out
	}
	if vg.MissingPVs > 0 {
		add(abi.HealthDegraded, "PhysicalVolumeMissing", "volume group ", vgName, " misses ", i64(int64(vg.MissingPVs)), " physical volumes")
	}
	if pool == "" {
		return out
	}
	st, err := hostcall.LvmPoolStatus(&abi.LvmPoolRequest{VG: vgName, Pool: pool})
	if err != nil {
		add(abi.HealthInaccessible, "PoolUnreadable", "thin pool ", vgName, "/", pool, ": ", message(err))
		return out
	}
	where := "thin pool " + vgName + "/" + pool + ": "
	switch {
	case st.Failed:
		add(abi.HealthInaccessible, "PoolFailed", where, "the kernel failed the pool")
		return out
	case st.ReadOnly:
		add(abi.HealthDegraded, "PoolReadOnly", where, "the pool is read-only (its metadata is full or damaged)")
	case st.OutOfDataSpace:
		add(abi.HealthDegraded, "PoolOutOfDataSpace", where, "no free data space: writes to unallocated blocks fail")
	}
	if st.DataPercent >= nearlyFullPercent*100 && !st.OutOfDataSpace {
		add(abi.HealthDegraded, "PoolDataNearlyFull", where, percent(st.DataPercent), " of the data space used")
	}
	if st.MetadataPercent >= nearlyFullPercent*100 && !st.ReadOnly {
		add(abi.HealthDegraded, "PoolMetadataNearlyFull", where, percent(st.MetadataPercent), " of the metadata space used")
	}
	return out
}

// percent formats hundredths of a percent.
func percent(p int32) string {
	s := i64(int64(p / 100))
	if r := p % 100; r != 0 {
		f := i64(int64(r))
		if r < 10 {
			f = "0" + f
		}
		s += "." + f
	}
	return s + "%"
}

// VolumeHealth reports what keeps a volume from working: its LV gone (its
// data is lost), the LV partial or failed, its thin pool's or VG's
// conditions, and on a node the staged device gone or replaced. Asking
// activates nothing.
func (b *Backend) VolumeHealth(req *abi.VolumeHealthRequest) (*abi.HealthResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	v := req.Volume
	loc, err := b.locate(kindVolume, v.LocalID, v.Context, "volume")
	if err != nil {
		return nil, err
	}
	out := &abi.HealthResponse{Entries: b.classHealth(loc.vg, loc.pool)}
	add := func(status abi.HealthStatus, reason string, msg ...string) {
		out.Entries = append(out.Entries, abi.HealthEntry{Status: status, Reason: reason, Message: strings.Join(msg, "")})
	}
	lvName := "LV " + loc.vg + "/" + loc.lv
	lv, err := hostcall.LvmLvStatus(&abi.LvmLvRequest{VG: loc.vg, Name: loc.lv})
	switch {
	case abi.CodeOf(err) == abi.NotFound:
		add(abi.HealthDataLoss, "LogicalVolumeMissing", lvName, " is gone: the volume's data is lost")
		return out, nil
	case err != nil:
		add(abi.HealthInaccessible, "LogicalVolumeUnreadable", lvName, ": ", message(err))
		return out, nil
	}
	switch lv.Health {
	case "":
	case "partial":
		add(abi.HealthDegraded, "LogicalVolumePartial", lvName, " misses some of its physical volumes")
	default:
		add(abi.HealthDegraded, "LogicalVolumeUnhealthy", lvName, ": ", lv.Health)
	}
	if req.OnNode && req.Device != "" {
		switch {
		case !lv.Active:
			add(abi.HealthInaccessible, "DeviceMissing", "the staged device ", req.Device, " of ", lvName, " is gone")
		case lv.Path != req.Device:
			add(abi.HealthInaccessible, "DeviceChanged", lvName, " is active as ", lv.Path, ", not as the staged ", req.Device)
		}
	}
	return out, nil
}
