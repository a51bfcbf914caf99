package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// The workload is what a CO and its pods do with two node-local backends:
// volumes are created empty, cloned or restored from snapshots, staged,
// published, written, expanded, unpublished, unstaged and deleted. The
// model below is what the CO has been told (every call that answered OK)
// and what the pods wrote; the checks compare the daemon and the kernel
// with it after every crash.

const (
	backendParam  = "wasmcsi.dev/backend"
	maxVolumes    = 8
	maxSnapshots  = 6
	localdirBytes = 64 << 20
	loopfileBytes = 32 << 20
	expandStep    = 16 << 20
	maxExpands    = 3
)

// maxBytes is the capacity up to which the workload expands v.
func maxBytes(v *volume) int64 {
	if v.backend == "loopfile" {
		return loopfileBytes + maxExpands*expandStep
	}
	return localdirBytes + maxExpands*expandStep
}

// volume is one volume the CO was told about.
type volume struct {
	name, id string
	backend  string
	block    bool
	capacity int64 // the largest capacity acknowledged
	volCtx   map[string]string
	token    string // the data it holds: the last acknowledged write, or its source's
	// copied says its data came from a clone or a restore; suspect says
	// why that copy may be partial (its creation, or its source's, was cut
	// off by a kill and retried).
	copied  bool
	suspect string
	origin  string // created empty, clone of, restore of

	staged, published bool
	nodeExpand        bool // a controller expansion awaits NodeExpandVolume
	unstages          int  // acknowledged NodeUnstage calls, to tell one stale record from the next
	gen               int  // writes so far
	checked           int  // the round its data was last checked in
	// broken says why the harness stopped using the volume: an anomaly
	// left its state unknown. It is still cleaned up at the end.
	broken string
	create *op // the call that created it
}

func (v *volume) String() string {
	return fmt.Sprintf("%s (%s %s %s)", v.name, v.backend, access(v.block), v.id)
}

func access(block bool) string {
	if block {
		return "block"
	}
	return "mount"
}

func (v *volume) label() string { return v.backend + "/" + access(v.block) }

// file is the pool file of a loopfile volume ("" for localdir).
func (v *volume) file() string { return v.volCtx["path"] }

func (v *volume) capability() *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	switch {
	case v.block:
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	case v.backend == "loopfile":
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}
	default:
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
	}
	return c
}

// snapshot is one snapshot the CO was told about.
type snapshot struct {
	name, id string
	source   *volume
	sourceID string
	capacity int64 // its source's capacity when it was taken
	token    string
	suspect  string
	broken   string
}

func (s *snapshot) String() string {
	if s.id == "" {
		return fmt.Sprintf("%s (of %s)", s.name, s.source.name)
	}
	return fmt.Sprintf("%s (of %s, %s)", s.name, s.source.name, s.id)
}

// opList names ops for the log.
func opList(ops []*op) string {
	var names []string
	for _, o := range ops {
		names = append(names, o.String())
	}
	return strings.Join(names, "; ")
}

// model is what the CO knows.
type model struct {
	vols  []*volume // live, in creation order
	snaps []*snapshot
	gone  map[string]*volume   // deleted volumes by ID
	goneS map[string]*snapshot // deleted snapshots by ID
	next  int
}

func (m *model) live(f func(v *volume) bool) []*volume {
	var out []*volume
	for _, v := range m.vols {
		if v.broken == "" && (f == nil || f(v)) {
			out = append(out, v)
		}
	}
	return out
}

func (m *model) liveSnaps() []*snapshot {
	var out []*snapshot
	for _, s := range m.snaps {
		if s.broken == "" && s.source != nil {
			out = append(out, s)
		}
	}
	return out
}

func (m *model) name(prefix string) string {
	m.next++
	return fmt.Sprintf("%s%04d", prefix, m.next)
}

// op is one step of the workload: a single CSI call (or a pod's write),
// built once so that a retry sends exactly the same request.
type op struct {
	kind  string // create, clone, restore, snapshot, stage, publish, write, unpublish, unstage, expand, nodeexpand, delete, deletesnap
	vol   *volume
	snap  *snapshot
	call  func(ctx context.Context, d *daemon) error
	done  func() // the model's update once the call answered OK
	isCSI bool
	// copies says the call copies data (snapshot, clone, restore): cut off,
	// it may leave a partial copy for its retry to find.
	copies bool
	src    *volume // a clone's source
}

// touches lists the volumes and snapshots the op reads or changes; ops
// that share none can run side by side.
func (o *op) touches() []any {
	var out []any
	for _, x := range []any{o.vol, o.snap, o.src} {
		switch x := x.(type) {
		case *volume:
			if x != nil {
				out = append(out, x)
			}
		case *snapshot:
			if x != nil {
				out = append(out, x)
			}
		}
	}
	return out
}

func (o *op) label() string {
	switch {
	case o.vol != nil:
		return o.kind + " " + o.vol.label()
	case o.snap != nil:
		return o.kind + " " + o.snap.source.label()
	}
	return o.kind
}

func (o *op) String() string {
	switch {
	case o.vol != nil && o.snap != nil:
		return fmt.Sprintf("%s %s / %s", o.kind, o.vol, o.snap)
	case o.vol != nil:
		return fmt.Sprintf("%s %s", o.kind, o.vol)
	case o.snap != nil:
		return fmt.Sprintf("%s %s", o.kind, o.snap)
	}
	return o.kind
}

func (d *daemon) staging(v *volume) string { return filepath.Join(d.node, "staging", v.name) }
func (d *daemon) target(v *volume) string  { return filepath.Join(d.node, "pods", v.name, "vol") }

// choice is a candidate op with its weight, and its weight among the ops
// a kill cuts off (even).
type choice struct {
	weight, even int
	make         func() *op // nil when it could not be made
}

// pick chooses the next op at random among what the model allows: by
// weight for the workload's own course, or each kind alike for the op the
// kill will cut off, so that every kind is killed about as often, but for
// expansions, which are killed three times as often (twice of any volume,
// once of a fresh one): each changes a volume whose create start-up may
// replay.
func (w *workload) pick(evenly bool) *op {
	for range 3 {
		if o := w.pickOnce(evenly, true); o != nil {
			return o
		}
	}
	return w.pickOnce(evenly, false)
}

// pickOnce is pick; fresh allows the expansion of a fresh volume, the one
// choice that makes nothing when its create fails.
func (w *workload) pickOnce(evenly, fresh bool) *op {
	m := &w.m
	var cs []choice
	add := func(weight int, mk func() *op) { cs = append(cs, choice{weight, 1, mk}) }
	addEven := func(weight, even int, mk func() *op) { cs = append(cs, choice{weight, even, mk}) }
	vols := m.live(nil)
	snaps := m.liveSnaps()
	anyOf := func(vs []*volume) *volume { return vs[w.rng.IntN(len(vs))] }
	if len(vols) < maxVolumes {
		add(3, func() *op {
			backend := []string{"localdir", "loopfile"}[w.rng.IntN(2)]
			return w.createOp(backend, backend == "loopfile" && w.rng.IntN(2) == 0, nil, nil)
		})
		if len(vols) > 0 {
			add(2, func() *op { src := anyOf(vols); return w.createOp(src.backend, src.block, src, nil) })
		}
		if len(snaps) > 0 {
			add(2, func() *op {
				s := snaps[w.rng.IntN(len(snaps))]
				return w.createOp(s.source.backend, s.source.block, nil, s)
			})
		}
	}
	if len(vols) > 0 && len(snaps) < maxSnapshots {
		add(3, func() *op { return w.snapshotOp(anyOf(vols)) })
	}
	if vs := m.live(func(v *volume) bool { return !v.staged }); len(vs) > 0 {
		add(3, func() *op { return w.stageOp(anyOf(vs)) })
	}
	if vs := m.live(func(v *volume) bool { return v.staged && !v.published }); len(vs) > 0 {
		add(3, func() *op { return w.publishOp(anyOf(vs)) })
		add(2, func() *op { return w.unstageOp(anyOf(vs)) })
	}
	if vs := m.live(func(v *volume) bool { return v.published }); len(vs) > 0 {
		add(4, func() *op { return w.writeOp(anyOf(vs)) })
		add(2, func() *op { return w.unpublishOp(anyOf(vs)) })
	}
	if vs := m.live(func(v *volume) bool { return v.capacity < maxBytes(v) }); len(vs) > 0 {
		addEven(2, 2, func() *op { return w.expandOp(anyOf(vs)) })
	}
	if fresh && len(vols) < maxVolumes {
		addEven(1, 1, w.freshExpandOp)
	}
	if vs := m.live(func(v *volume) bool { return v.nodeExpand && v.staged && (v.block || w.onlineGrow) }); len(vs) > 0 {
		add(3, func() *op { return w.nodeExpandOp(anyOf(vs)) })
	}
	// Deletions grow likelier with the number of volumes and snapshots,
	// which keeps them around half their maximum, with room to create.
	if vs := m.live(func(v *volume) bool { return !v.staged }); len(vs) > 0 && len(vols) > 2 {
		add(len(vols), func() *op { return w.deleteOp(anyOf(vs)) })
	}
	if len(snaps) > 1 {
		add(len(snaps), func() *op { return w.deleteSnapOp(snaps[w.rng.IntN(len(snaps))]) })
	}
	total := 0
	for i := range cs {
		if evenly {
			cs[i].weight = cs[i].even
		}
		total += cs[i].weight
	}
	n := w.rng.IntN(total)
	for _, c := range cs {
		if n < c.weight {
			return c.make()
		}
		n -= c.weight
	}
	panic("unreachable")
}

// createOp creates a volume: empty, a clone of src, or a restore of snap.
func (w *workload) createOp(backend string, block bool, src *volume, snap *snapshot) *op {
	v := &volume{name: w.m.name("v"), backend: backend, block: block, origin: "created empty"}
	req := &csi.CreateVolumeRequest{
		Name:               v.name,
		Parameters:         map[string]string{backendParam: backend},
		VolumeCapabilities: []*csi.VolumeCapability{v.capability()},
	}
	size := int64(localdirBytes)
	if backend == "loopfile" {
		size = loopfileBytes
	}
	o := &op{kind: "create", vol: v, isCSI: true}
	switch {
	case src != nil:
		o.kind, o.copies, o.src = "clone", true, src
		size = src.capacity
		v.token, v.copied, v.suspect = src.token, true, src.suspect
		v.origin = "clone of " + src.name
		req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.id}}}
	case snap != nil:
		o.kind, o.copies, o.snap = "restore", true, snap
		size = snap.capacity
		v.token, v.copied, v.suspect = snap.token, true, snap.suspect
		v.origin = "restore of " + snap.name
		req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.id}}}
	}
	req.CapacityRange = &csi.CapacityRange{RequiredBytes: size}
	var resp *csi.CreateVolumeResponse
	o.call = func(ctx context.Context, d *daemon) (err error) {
		resp, err = d.Controller().CreateVolume(ctx, req)
		return err
	}
	o.done = func() {
		v.id = resp.GetVolume().GetVolumeId()
		v.capacity = resp.GetVolume().GetCapacityBytes()
		v.volCtx = resp.GetVolume().GetVolumeContext()
		if !slices.Contains(w.m.vols, v) {
			w.m.vols = append(w.m.vols, v)
			w.stats.created++
		}
	}
	v.create = o
	return o
}

func (w *workload) snapshotOp(v *volume) *op {
	s := &snapshot{name: w.m.name("s"), source: v, sourceID: v.id, capacity: v.capacity, token: v.token, suspect: v.suspect}
	req := &csi.CreateSnapshotRequest{Name: s.name, SourceVolumeId: v.id}
	var resp *csi.CreateSnapshotResponse
	return &op{kind: "snapshot", vol: v, snap: s, isCSI: true, copies: true,
		call: func(ctx context.Context, d *daemon) (err error) {
			resp, err = d.Controller().CreateSnapshot(ctx, req)
			return err
		},
		done: func() {
			s.id = resp.GetSnapshot().GetSnapshotId()
			w.m.snaps = append(w.m.snaps, s)
			w.stats.snapshots++
		},
	}
}

func (w *workload) stageReq(v *volume) *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: w.d.staging(v), VolumeCapability: v.capability(), VolumeContext: v.volCtx}
}

func (w *workload) stageOp(v *volume) *op {
	req := w.stageReq(v)
	return &op{kind: "stage", vol: v, isCSI: true,
		call: func(ctx context.Context, d *daemon) error {
			// The CO makes the staging folder, as kubelet does.
			if err := os.MkdirAll(req.StagingTargetPath, 0o750); err != nil {
				return err
			}
			_, err := d.Node().NodeStageVolume(ctx, req)
			return err
		},
		done: func() { v.staged = true },
	}
}

func (w *workload) publishReq(v *volume) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: w.d.staging(v), TargetPath: w.d.target(v), VolumeCapability: v.capability(), VolumeContext: v.volCtx}
}

func (w *workload) publishOp(v *volume) *op {
	req := w.publishReq(v)
	return &op{kind: "publish", vol: v, isCSI: true,
		call: func(ctx context.Context, d *daemon) error {
			if err := os.MkdirAll(filepath.Dir(req.TargetPath), 0o750); err != nil {
				return err
			}
			_, err := d.Node().NodePublishVolume(ctx, req)
			return err
		},
		done: func() { v.published = true },
	}
}

// writeOp is the pod writing a new generation of data: no CSI call, so a
// kill during it is a kill between calls.
func (w *workload) writeOp(v *volume) *op {
	v.gen++
	token := fmt.Sprintf("%s.%d", v.name, v.gen)
	target := w.d.target(v)
	return &op{kind: "write", vol: v,
		call: func(context.Context, *daemon) error { return writeData(target, v.block, token) },
		done: func() { v.token, v.copied, v.suspect = token, false, ""; w.stats.writes++ },
	}
}

func (w *workload) unpublishOp(v *volume) *op {
	req := &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: w.d.target(v)}
	return &op{kind: "unpublish", vol: v, isCSI: true,
		call: func(ctx context.Context, d *daemon) error {
			_, err := d.Node().NodeUnpublishVolume(ctx, req)
			return err
		},
		done: func() { v.published = false },
	}
}

func (w *workload) unstageReq(v *volume) *csi.NodeUnstageVolumeRequest {
	return &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: w.d.staging(v)}
}

func (w *workload) unstageOp(v *volume) *op {
	req := w.unstageReq(v)
	return &op{kind: "unstage", vol: v, isCSI: true,
		call: func(ctx context.Context, d *daemon) error {
			_, err := d.Node().NodeUnstageVolume(ctx, req)
			return err
		},
		done: func() { v.staged = false; v.unstages++ },
	}
}

// freshExpandOp creates a volume and returns the expansion of it: the
// expansion then changes a volume whose record may not be on disk yet and
// whose create is still logged (its drop waits for the settler), so a
// kill tests start-up's replay against the changed volume. nil when the
// create failed.
func (w *workload) freshExpandOp() *op {
	backend := []string{"localdir", "loopfile"}[w.rng.IntN(2)]
	c := w.createOp(backend, backend == "loopfile" && w.rng.IntN(2) == 0, nil, nil)
	if !w.run(c) {
		return nil
	}
	return w.expandOp(c.vol)
}

func (w *workload) expandOp(v *volume) *op {
	want := v.capacity + expandStep
	req := &csi.ControllerExpandVolumeRequest{VolumeId: v.id, CapacityRange: &csi.CapacityRange{RequiredBytes: want}, VolumeCapability: v.capability()}
	var resp *csi.ControllerExpandVolumeResponse
	return &op{kind: "expand", vol: v, isCSI: true,
		call: func(ctx context.Context, d *daemon) (err error) {
			resp, err = d.Controller().ControllerExpandVolume(ctx, req)
			return err
		},
		done: func() {
			v.capacity = max(v.capacity, resp.GetCapacityBytes())
			if resp.GetNodeExpansionRequired() {
				v.nodeExpand = true
			}
		},
	}
}

func (w *workload) nodeExpandOp(v *volume) *op {
	path := w.d.staging(v)
	if v.published {
		path = w.d.target(v)
	}
	req := &csi.NodeExpandVolumeRequest{VolumeId: v.id, VolumePath: path, StagingTargetPath: w.d.staging(v),
		CapacityRange: &csi.CapacityRange{RequiredBytes: v.capacity}, VolumeCapability: v.capability()}
	return &op{kind: "nodeexpand", vol: v, isCSI: true,
		call: func(ctx context.Context, d *daemon) error {
			_, err := d.Node().NodeExpandVolume(ctx, req)
			return err
		},
		done: func() { v.nodeExpand = false },
	}
}

func (w *workload) deleteOp(v *volume) *op {
	req := &csi.DeleteVolumeRequest{VolumeId: v.id}
	return &op{kind: "delete", vol: v, isCSI: true,
		call: func(ctx context.Context, d *daemon) error {
			_, err := d.Controller().DeleteVolume(ctx, req)
			return err
		},
		done: func() {
			w.m.vols = slices.DeleteFunc(w.m.vols, func(x *volume) bool { return x == v })
			w.m.gone[v.id] = v
			w.stats.deleted++
		},
	}
}

func (w *workload) deleteSnapOp(s *snapshot) *op {
	req := &csi.DeleteSnapshotRequest{SnapshotId: s.id}
	return &op{kind: "deletesnap", snap: s, isCSI: true,
		call: func(ctx context.Context, d *daemon) error {
			_, err := d.Controller().DeleteSnapshot(ctx, req)
			return err
		},
		done: func() {
			w.m.snaps = slices.DeleteFunc(w.m.snaps, func(x *snapshot) bool { return x == s })
			w.m.goneS[s.id] = s
		},
	}
}

// latency keeps the recent durations of each kind of op, so that kills
// spread over a call's whole duration, whatever its length.
type latency map[string][]time.Duration

const latencySamples = 15

func (l latency) observe(label string, d time.Duration) {
	s := append(l[label], d)
	if len(s) > latencySamples {
		s = s[1:]
	}
	l[label] = s
}

// delay is a random point in [0, 0.8 × the median duration]. The client
// sees a call end a little after the daemon finished it, and durations
// vary, so about a third of the kills still land after the daemon's work.
func (l latency) delay(rng *rand.Rand, label string) time.Duration {
	est := 10 * time.Millisecond
	if strings.HasPrefix(label, "stage loopfile") {
		est = 100 * time.Millisecond
	}
	if s := l[label]; len(s) > 0 {
		s = slices.Clone(s)
		slices.Sort(s)
		est = s[len(s)/2]
	}
	return time.Duration(rng.Float64() * 0.8 * float64(est))
}

// sleepPrecisely sleeps for d: time.Sleep overshoots by up to a
// millisecond, as long as many of the calls take, so the last stretch is
// spun.
func sleepPrecisely(d time.Duration) {
	end := time.Now().Add(d)
	if d > 2*time.Millisecond {
		time.Sleep(d - 2*time.Millisecond)
	}
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}
