package main

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// LV names: "v-<NameID>" for volumes, "s-<NameID>" for snapshots (sdk.NameID:
// a readable slug of the CO's name and 64 bits of its hash), so `lvs` shows
// each volume's name, a repeated request finds the same LV (every create
// is idempotent without a record of the module's own), and two names never
// share an LV. The LV name is the local ID; the VG and pool travel in the
// context.
const (
	kindVolume   = "v-"
	kindSnapshot = "s-"
)

func lvName(kind, name string) string { return kind + sdk.NameID(name, "x") }

// nameTagPrefix starts the tag that keeps the CO's name of a volume or
// snapshot on its LV, when the name fits LVM's tag characters (Kubernetes'
// pvc-<uuid> and snapshot-<uuid> do): start-up's check of what no record
// explains (list_owned) then tells a create that start-up could not finish
// from a leftover.
const nameTagPrefix = "wasmcsi.dev/name="

func nameTags(name string) []string {
	if len(name) > 900 {
		return nil
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_+.-/=!:&#", c) >= 0) {
			return nil
		}
	}
	return []string{nameTagPrefix + name}
}

// ListOwned lists the module's LVs in every device class's VG (the host
// shows it no other): volumes and snapshots by their LV names, with the
// context their delete needs and the CO's name from their tag.
func (b *Backend) ListOwned(*abi.ListOwnedRequest) (*abi.ListOwnedResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	out := &abi.ListOwnedResponse{}
	seen := map[string]bool{}
	for _, n := range b.cfg.names {
		vg := b.cfg.classes[n].vg
		if seen[vg] {
			continue
		}
		seen[vg] = true
		list, err := hostcall.LvmLvList(&abi.LvmListRequest{VG: vg})
		if err != nil {
			return nil, wrap(err, "list the LVs of volume group ", vg)
		}
		for _, lv := range list.LVs {
			snap := parseLocal(kindSnapshot, lv.Name)
			if !snap && !parseLocal(kindVolume, lv.Name) {
				continue
			}
			ctx := map[string]string{ctxVG: lv.VG, ctxNode: b.cfg.node}
			if lv.ThinPool != "" {
				ctx[ctxPool] = lv.ThinPool
			}
			it := abi.OwnedItem{LocalID: lv.Name, Snapshot: snap, Context: ctx, SizeBytes: lv.SizeBytes}
			for _, t := range lv.Tags {
				if strings.HasPrefix(t, nameTagPrefix) {
					it.Name = t[len(nameTagPrefix):]
				}
			}
			out.Items = append(out.Items, it)
		}
	}
	return out, nil
}

// parseLocal checks a local ID of kind this module issued.
func parseLocal(kind, id string) bool {
	return len(id) > len(kind) && id[:len(kind)] == kind && sdk.ValidNameID(id[len(kind):])
}

// Context keys of volumes and snapshots.
const (
	ctxVG    = "vg"
	ctxPool  = "pool"
	ctxClass = "deviceClass"
	ctxNode  = "node"
)

func (b *Backend) context(cl *class) map[string]string {
	m := map[string]string{ctxVG: cl.vg, ctxClass: cl.name, ctxNode: b.cfg.node}
	if cl.thin() {
		m[ctxPool] = cl.pool
	}
	return m
}

// located is where a volume or snapshot lives, from its context.
type located struct {
	vg, pool, lv string
}

// locate reads a volume's or snapshot's context: NOT_FOUND when it was made
// on another node (whose VG may well have the same name) or names no VG.
func (b *Backend) locate(kind, id string, ctx map[string]string, what string) (located, error) {
	if !parseLocal(kind, id) {
		return located{}, errorf(abi.NotFound, what, " ", id, " is not an lvm ", what)
	}
	if n := ctx[ctxNode]; n != "" && n != b.cfg.node {
		return located{}, errorf(abi.NotFound, what, " ", id, " lives on node ", n, "; this is node ", b.cfg.node)
	}
	vg := ctx[ctxVG]
	if vg == "" {
		return located{}, errorf(abi.NotFound, what, " ", id, " has no volume group in its context")
	}
	return located{vg: vg, pool: ctx[ctxPool], lv: id}, nil
}

// CreateVolume makes the volume's LV in its device class: empty, or for a
// thin class a writable thin snapshot of the source snapshot or volume,
// grown at once when the request is larger than the source (the host
// grows the filesystem at stage). A repeat finds the LV made before,
// whatever of it happened; a create whose LV holds less than asked, or a
// copy of another source, is ALREADY_EXISTS. A thick LV beyond the VG's
// free space is RESOURCE_EXHAUSTED, with nothing created.
func (b *Backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if !b.reachable(req.Requisite) {
		return nil, errorf(abi.ResourceExhausted, "lvm volumes live on node ", b.cfg.node, ", which the requisite topology excludes")
	}
	cl, err := b.classFor(req.Parameters)
	if err != nil {
		return nil, err
	}
	vg, err := hostcall.LvmVgStatus(&abi.LvmVgRequest{VG: cl.vg})
	if err != nil {
		return nil, wrap(err, "device class ", cl.name)
	}
	name := lvName(kindVolume, req.Name)
	// A volume made before is answered without its source, which may be
	// gone by now (a repeat after a crash needs only the copy).
	lv, err := hostcall.LvmLvStatus(&abi.LvmLvRequest{VG: cl.vg, Name: name})
	switch {
	case err == nil:
		if err := b.sameVolume(req, cl, lv, vg.ExtentBytes); err != nil {
			return nil, err
		}
	case abi.CodeOf(err) != abi.NotFound:
		return nil, wrap(err, "look for LV ", cl.vg, "/", name)
	default:
		origin, sourceSize, err := b.source(req.Source, cl)
		if err != nil {
			return nil, err
		}
		size, err := b.volumeSize(req, sourceSize, vg.ExtentBytes)
		if err != nil {
			return nil, err
		}
		if origin != "" {
			lv, err = hostcall.LvmLvSnapshot(&abi.LvmSnapshotRequest{VG: cl.vg, Origin: origin, Name: name, Writable: true, SizeBytes: size,
				Tags: nameTags(req.Name)})
		} else {
			lv, err = hostcall.LvmLvCreate(&abi.LvmCreateRequest{VG: cl.vg, Name: name, SizeBytes: size, ThinPool: cl.pool,
				Stripes: cl.stripes, StripeBytes: cl.stripeBytes, Mirrors: cl.mirrors, Tags: nameTags(req.Name)})
		}
		if err != nil {
			return nil, wrap(err, "create volume ", req.Name, " (LV ", cl.vg, "/", name, ", ", i64(size), " bytes, ", cl.where(), ")")
		}
		if lv.Existed { // made by a concurrent call meanwhile
			if err := b.sameVolume(req, cl, lv, vg.ExtentBytes); err != nil {
				return nil, err
			}
		}
	}
	return &abi.CreateVolumeResponse{
		LocalID:       name,
		CapacityBytes: lv.SizeBytes,
		Context:       b.context(cl),
		Topology:      []abi.Topology{{Segments: map[string]string{TopologyKey: b.cfg.node}}},
	}, nil
}

// sameVolume checks that an LV found under a create's name is what the
// create asks for: in the class's pool, at least as large as asked (a
// volume an expansion grew is kept), and a copy of the source asked for
// while that source is there to tell (LVM forgets the origin of a copy
// whose origin was removed).
func (b *Backend) sameVolume(req *abi.CreateVolumeRequest, cl *class, lv *abi.LvmLv, extent int64) error {
	if lv.ThinPool != cl.pool {
		return errorf(abi.AlreadyExists, "volume ", req.Name, " exists outside ", cl.where(), " (LV ", lv.VG, "/", lv.Name, ")")
	}
	size, err := b.volumeSize(&abi.CreateVolumeRequest{RequiredBytes: req.RequiredBytes, Capabilities: req.Capabilities}, 0, extent)
	if err != nil {
		return err
	}
	if lv.SizeBytes < size {
		return errorf(abi.AlreadyExists, "volume ", req.Name, " exists with ", i64(lv.SizeBytes), " bytes, not ", i64(size))
	}
	if req.LimitBytes > 0 && lv.SizeBytes > req.LimitBytes {
		return errorf(abi.AlreadyExists, "volume ", req.Name, " exists with ", i64(lv.SizeBytes), " bytes, above the limit of ", i64(req.LimitBytes))
	}
	want := ""
	if s := req.Source; s != nil && s.Snapshot != nil {
		want = s.Snapshot.LocalID
	} else if s != nil && s.Volume != nil {
		want = s.Volume.LocalID
	}
	if lv.Origin != "" && lv.Origin != want || want == "" && lv.Origin != "" {
		return errorf(abi.AlreadyExists, "volume ", req.Name, " exists as a copy of ", lv.Origin)
	}
	return nil
}

// source resolves a content source to the LV to snapshot and its size.
// Only thin LVs have snapshots, and a copy lives in its source's pool: a
// source elsewhere than the class's thin pool is INVALID_ARGUMENT.
func (b *Backend) source(src *abi.VolumeSource, cl *class) (string, int64, error) {
	var loc located
	var size int64
	var err error
	switch {
	case src == nil:
		return "", 0, nil
	case src.Snapshot != nil:
		loc, err = b.locate(kindSnapshot, src.Snapshot.LocalID, src.Snapshot.Context, "snapshot")
		size = src.Snapshot.SizeBytes
	case src.Volume != nil:
		loc, err = b.locate(kindVolume, src.Volume.LocalID, src.Volume.Context, "volume")
		size = src.Volume.CapacityBytes
	default:
		return "", 0, errorf(abi.InvalidArgument, "volume source names neither a snapshot nor a volume")
	}
	if err != nil {
		return "", 0, err
	}
	if !cl.thin() || loc.vg != cl.vg || loc.pool != cl.pool {
		where := "volume group " + loc.vg
		if loc.pool != "" {
			where = "thin pool " + loc.vg + "/" + loc.pool
		}
		return "", 0, errorf(abi.InvalidArgument, "a copy is a thin snapshot in its source's thin pool: the source is in ", where,
			", device class ", cl.name, " is ", cl.where())
	}
	st, err := hostcall.LvmLvStatus(&abi.LvmLvRequest{VG: loc.vg, Name: loc.lv})
	if err != nil {
		return "", 0, wrap(err, "source ", loc.lv)
	}
	return loc.lv, max(size, st.SizeBytes), nil
}

// volumeSize is the size to provision: the request (never below the
// source's size), raised to the minimum of every requested filesystem and
// rounded up to the VG's extent size, within the request's limit.
func (b *Backend) volumeSize(req *abi.CreateVolumeRequest, sourceSize, extent int64) (int64, error) {
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
	if extent > 0 {
		size = sdk.RoundUp(size, extent)
	}
	if req.LimitBytes > 0 && size > req.LimitBytes {
		return 0, errorf(abi.OutOfRange, "volume needs ", i64(size), " bytes (source, filesystem minimum and the extent size of ",
			i64(extent), "), above the limit of ", i64(req.LimitBytes))
	}
	return size, nil
}

// DeleteVolume removes the volume's LV. A volume already gone is success;
// one still open (staged) is FAILED_PRECONDITION.
func (b *Backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	return b.remove(kindVolume, req.Volume.LocalID, req.Volume.Context, "volume")
}

func (b *Backend) remove(kind, id string, ctx map[string]string, what string) error {
	if err := b.ready(); err != nil {
		return err
	}
	if !parseLocal(kind, id) {
		return nil // never one of ours
	}
	loc, err := b.locate(kind, id, ctx, what)
	if err != nil {
		if ctx[ctxNode] != "" && ctx[ctxNode] != b.cfg.node {
			return err
		}
		return nil
	}
	err = hostcall.LvmLvRemove(&abi.LvmLvRequest{VG: loc.vg, Name: loc.lv})
	if err != nil && abi.CodeOf(err) != abi.NotFound {
		return wrap(err, "delete ", what, " ", id, " (LV ", loc.vg, "/", loc.lv, ")")
	}
	return nil
}

// ExpandVolume grows the LV, live when it is active; the filesystem grows
// on the node (NodeExpansion).
func (b *Backend) ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	loc, err := b.locate(kindVolume, req.Volume.LocalID, req.Volume.Context, "volume")
	if err != nil {
		return nil, err
	}
	vg, err := hostcall.LvmVgStatus(&abi.LvmVgRequest{VG: loc.vg})
	if err != nil {
		return nil, wrap(err, "volume group of ", loc.lv)
	}
	size := sdk.RoundUp(req.RequiredBytes, max(vg.ExtentBytes, 1))
	if req.LimitBytes > 0 && size > req.LimitBytes {
		return nil, errorf(abi.OutOfRange, "expansion to ", i64(req.RequiredBytes), " bytes rounds up to ", i64(size), ", above the limit of ", i64(req.LimitBytes))
	}
	lv, err := hostcall.LvmLvExtend(&abi.LvmExtendRequest{VG: loc.vg, Name: loc.lv, SizeBytes: size})
	if err != nil {
		return nil, wrap(err, "expand volume ", req.Volume.LocalID, " to ", i64(size), " bytes")
	}
	return &abi.ExpandVolumeResponse{CapacityBytes: lv.SizeBytes, NodeExpansionRequired: true}, nil
}

// CreateSnapshot makes a read-only thin snapshot of a thin volume: instant,
// sharing every block. An active (staged) volume is suspended for the
// moment of the snapshot, which flushes its writes, so the snapshot is
// crash consistent. A thick volume has no snapshots: INVALID_ARGUMENT.
func (b *Backend) CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if !b.reachable(req.Requisite) {
		return nil, errorf(abi.ResourceExhausted, "lvm snapshots live on node ", b.cfg.node, ", which the requisite topology excludes")
	}
	if err := abi.CheckParameters(nil, req.Parameters); err != nil {
		return nil, err
	}
	src := req.Source
	loc, err := b.locate(kindVolume, src.LocalID, src.Context, "volume")
	if err != nil {
		return nil, err
	}
	if loc.pool == "" {
		return nil, errorf(abi.InvalidArgument, "volume ", src.LocalID, " is a thick LV of volume group ", loc.vg, ": only volumes of thin device classes have snapshots")
	}
	name := lvName(kindSnapshot, req.Name)
	lv, err := hostcall.LvmLvSnapshot(&abi.LvmSnapshotRequest{VG: loc.vg, Origin: loc.lv, Name: name, Tags: nameTags(req.Name)})
	if err != nil {
		return nil, wrap(err, "snapshot volume ", src.LocalID, " as ", name)
	}
	if lv.Existed && lv.Origin != loc.lv {
		return nil, errorf(abi.AlreadyExists, "snapshot ", req.Name, " exists as a snapshot of ", lv.Origin, ", not of ", loc.lv)
	}
	ctx := map[string]string{ctxVG: loc.vg, ctxPool: loc.pool, ctxNode: b.cfg.node}
	if c := src.Context[ctxClass]; c != "" {
		ctx[ctxClass] = c
	}
	return &abi.CreateSnapshotResponse{
		LocalID:    name,
		SizeBytes:  lv.SizeBytes,
		Context:    ctx,
		ReadyToUse: true,
		Topology:   []abi.Topology{{Segments: map[string]string{TopologyKey: b.cfg.node}}},
	}, nil
}

// DeleteSnapshot removes the snapshot's LV. Volumes restored from it keep
// the blocks they share with it.
func (b *Backend) DeleteSnapshot(req *abi.DeleteSnapshotRequest) error {
	return b.remove(kindSnapshot, req.Snapshot.LocalID, req.Snapshot.Context, "snapshot")
}

// GetCapacity answers per device class (the parameters') and node: what a
// new thick LV can take (the VG's free space), or the data a thin pool can
// still take (its free data space; nothing when it is failed, read-only or
// out of data space). Another node's topology answers 0.
func (b *Backend) GetCapacity(req *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	if req.Topology != nil {
		if v, ok := req.Topology.Segments[TopologyKey]; ok && v != b.cfg.node {
			return &abi.GetCapacityResponse{}, nil
		}
	}
	cl, err := b.classFor(req.Parameters)
	if err != nil {
		return nil, err
	}
	if !cl.thin() {
		vg, err := hostcall.LvmVgStatus(&abi.LvmVgRequest{VG: cl.vg})
		if err != nil {
			return nil, wrap(err, "device class ", cl.name)
		}
		free := vg.FreeBytes / int64(max(1, cl.mirrors+1))
		return &abi.GetCapacityResponse{AvailableBytes: free, MaximumVolumeSize: free, MinimumVolumeSize: minVolumeBytes}, nil
	}
	st, err := hostcall.LvmPoolStatus(&abi.LvmPoolRequest{VG: cl.vg, Pool: cl.pool})
	if err != nil {
		return nil, wrap(err, "device class ", cl.name)
	}
	avail := st.SizeBytes - st.DataUsedBytes
	if st.Failed || st.ReadOnly || st.OutOfDataSpace || !st.Active || avail < 0 {
		avail = 0
	}
	return &abi.GetCapacityResponse{AvailableBytes: avail, MinimumVolumeSize: minVolumeBytes}, nil
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
