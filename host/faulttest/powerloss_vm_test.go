package faulttest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/examples/dmthin/dmthintest"
	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/host/internal/logwrites"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// EnvPoints sets how many durable points the power-loss test checks,
// evenly sampled with the last always among them: a number, or "all"
// (make test-faults). Unset, it checks samplePoints, what the VM tier in
// CI can afford under emulation (about 40 s a point under TCG). EnvRounds
// is how many times the workload's script runs (default 1; make
// test-faults runs 2).
const (
	EnvPoints = "WASMCSI_POWERLOSS_POINTS"
	EnvRounds = "WASMCSI_POWERLOSS_ROUNDS"
)

const (
	lwName    = "wasmcsi-faults-lw"
	diskBytes = 320 << 20
	// plThinPrefix names the power-loss tier's thin pool and its volumes;
	// the pool's data and metadata are files in the module's state folder,
	// on the logged filesystem with everything else.
	plThinPrefix   = "wasmcsi-vmt-pl-"
	plThinData     = "pool-data"
	plThinMeta     = "pool-meta"
	plThinDataSize = "96Mi"
	logBytes       = 1 << 30
	// cleanupEvery: every n-th checked point (and the last) also starts
	// the daemon a second time to see its replay converged, deletes
	// everything through CSI and looks for what is left behind.
	cleanupEvery = 8
	samplePoints = 4
)

// state is what the CO has been told after a call was answered: the
// volumes and snapshots that exist, and those acknowledged deleted.
type state struct {
	vols    map[string]*vol    // by name
	snaps   map[string]*snap   // by name
	deleted map[string]string  // id -> what it was, acknowledged deleted
	sources map[string]*source // volume name -> the data a clone or restore must hold
}

type snap struct{ name, id, source, token, group string }

// source is what a copied volume holds when whole: its source's data.
type source struct{ token string }

func (s *state) clone() *state {
	n := &state{vols: map[string]*vol{}, snaps: map[string]*snap{}, deleted: maps.Clone(s.deleted), sources: maps.Clone(s.sources)}
	for k, v := range s.vols {
		c := *v
		n.vols[k] = &c
	}
	for k, v := range s.snaps {
		c := *v
		n.snaps[k] = &c
	}
	return n
}

// step is one call (or a pod's write) of the workload: its marks in the
// log bracket it, and after is the state once it was answered.
type step struct {
	n     int
	what  string
	vol   string // the volume it changes ("" none)
	after *state
}

type powerLoss struct {
	t     *testing.T
	d     *daemontest.Daemon
	node  string
	cur   *state
	steps []step
	// ids are every volume and snapshot ID the CO ever heard of or asked
	// for (by name): whatever the daemon lists must be one of them.
	names map[string]bool
}

// mark writes a mark into the log; entries before it completed before it.
func (p *powerLoss) mark(name string) {
	run(p.t, "dmsetup", "message", lwName, "0", "mark", name)
}

// do runs one step between its begin and end marks and records the state
// after it.
func (p *powerLoss) do(what, volName string, call func(c context.Context) error) {
	p.t.Helper()
	n := len(p.steps)
	p.mark("begin-" + strconv.Itoa(n))
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	err := call(c)
	cancel()
	if err != nil {
		p.t.Fatalf("step %d %s: %v", n, what, err)
	}
	p.mark("end-" + strconv.Itoa(n))
	p.steps = append(p.steps, step{n: n, what: what, vol: volName, after: p.cur.clone()})
}

func (p *powerLoss) create(name, backend string, block bool, size int64, src *csi.VolumeContentSource, token string) {
	p.names[name] = true
	v := &vol{name: name, backend: backend, block: block}
	p.do("create "+name, name, func(c context.Context) error {
		resp, err := p.d.Controller().CreateVolume(c, &csi.CreateVolumeRequest{Name: name,
			CapacityRange:       &csi.CapacityRange{RequiredBytes: size},
			VolumeCapabilities:  []*csi.VolumeCapability{v.capability()},
			Parameters:          map[string]string{backendParam: backend},
			VolumeContentSource: src})
		if err != nil {
			return err
		}
		v.id, v.capacity, v.volCtx, v.token = resp.GetVolume().GetVolumeId(), resp.GetVolume().GetCapacityBytes(), resp.GetVolume().GetVolumeContext(), token
		p.cur.vols[name] = v
		if src != nil {
			p.cur.sources[name] = &source{token: token}
		}
		return nil
	})
}

func (p *powerLoss) snapshot(name, volName string) {
	p.names[name] = true
	v := p.cur.vols[volName]
	p.do("snapshot "+name+" of "+volName, "", func(c context.Context) error {
		resp, err := p.d.Controller().CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
		if err != nil {
			return err
		}
		p.cur.snaps[name] = &snap{name: name, id: resp.GetSnapshot().GetSnapshotId(), source: volName, token: v.token}
		return nil
	})
}

func (p *powerLoss) stagePublishWrite(volName, token string) {
	v := p.cur.vols[volName]
	p.do("stage+publish "+volName, volName, func(c context.Context) error { return stagePublish(c, p.d, p.node, v) })
	p.write(volName, token)
}

func (p *powerLoss) write(volName, token string) {
	v := p.cur.vols[volName]
	p.do("write "+token+" into "+volName, volName, func(context.Context) error {
		if err := writeData(target(p.node, v), v.block, token); err != nil {
			return err
		}
		v.token = token
		delete(p.cur.sources, volName)
		return nil
	})
}

func (p *powerLoss) expand(volName string, size int64) {
	v := p.cur.vols[volName]
	p.do("expand "+volName, volName, func(c context.Context) error {
		resp, err := p.d.Controller().ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: v.id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: v.capability()})
		if err != nil {
			return err
		}
		v.capacity = resp.GetCapacityBytes()
		return nil
	})
}

// nodeExpand grows the published volume's filesystem to its new size,
// as the CO does after a ControllerExpandVolume that asks for it.
func (p *powerLoss) nodeExpand(volName string) {
	v := p.cur.vols[volName]
	p.do("node expand "+volName, volName, func(c context.Context) error {
		_, err := p.d.Node().NodeExpandVolume(c, &csi.NodeExpandVolumeRequest{VolumeId: v.id, VolumePath: target(p.node, v),
			StagingTargetPath: staging(p.node, v), CapacityRange: &csi.CapacityRange{RequiredBytes: v.capacity}, VolumeCapability: v.capability()})
		return err
	})
}

// modify changes a mutable parameter of the volume.
func (p *powerLoss) modify(volName string, params map[string]string) {
	v := p.cur.vols[volName]
	p.do("modify "+volName, volName, func(c context.Context) error {
		_, err := p.d.Controller().ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: v.id, MutableParameters: params})
		return err
	})
}

// groupSnapshot cuts one snapshot of each volume at one point; its
// members are snapshots named "<group>/<volume>".
func (p *powerLoss) groupSnapshot(name string, volNames ...string) {
	p.names[name] = true
	var ids []string
	for _, n := range volNames {
		ids = append(ids, p.cur.vols[n].id)
	}
	p.do("group snapshot "+name, "", func(c context.Context) error {
		resp, err := p.d.Group().CreateVolumeGroupSnapshot(c, &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: ids})
		if err != nil {
			return err
		}
		g := resp.GetGroupSnapshot()
		for _, m := range g.GetSnapshots() {
			for _, n := range volNames {
				if v := p.cur.vols[n]; v.id == m.GetSourceVolumeId() {
					p.cur.snaps[name+"/"+n] = &snap{name: name + "/" + n, id: m.GetSnapshotId(), source: n, token: v.token, group: g.GetGroupSnapshotId()}
				}
			}
		}
		if len(g.GetSnapshots()) != len(volNames) {
			return fmt.Errorf("group snapshot of %d volumes has %d members", len(volNames), len(g.GetSnapshots()))
		}
		return nil
	})
}

// deleteGroup deletes a group snapshot and its members.
func (p *powerLoss) deleteGroup(name string) {
	var gid string
	var members []string
	for _, s := range p.cur.snaps {
		if strings.HasPrefix(s.name, name+"/") {
			gid = s.group
			members = append(members, s.id)
		}
	}
	p.do("delete group "+name, "", func(c context.Context) error {
		if _, err := p.d.Group().DeleteVolumeGroupSnapshot(c, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gid, SnapshotIds: members}); err != nil {
			return err
		}
		for k, s := range p.cur.snaps {
			if s.group == gid {
				delete(p.cur.snaps, k)
				p.cur.deleted[s.id] = "snapshot " + k
			}
		}
		return nil
	})
}

func (p *powerLoss) unpublishUnstage(volName string) {
	v := p.cur.vols[volName]
	p.do("unpublish+unstage "+volName, volName, func(c context.Context) error { return unpublishUnstage(c, p.d, p.node, v) })
}

func (p *powerLoss) deleteSnapshot(name string) {
	s := p.cur.snaps[name]
	p.do("delete snapshot "+name, "", func(c context.Context) error {
		if _, err := p.d.Controller().DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: s.id}); err != nil {
			return err
		}
		delete(p.cur.snaps, name)
		p.cur.deleted[s.id] = "snapshot " + name
		return nil
	})
}

func (p *powerLoss) deleteVolume(volName string) {
	v := p.cur.vols[volName]
	p.do("delete "+volName, volName, func(c context.Context) error {
		if _, err := p.d.Controller().DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			return err
		}
		delete(p.cur.vols, volName)
		delete(p.cur.sources, volName)
		p.cur.deleted[v.id] = "volume " + volName
		return nil
	})
}

func snapSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func volSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// script is the workload of one round r: on each backend a volume created,
// staged, published, written, snapshotted, written again, cloned,
// restored, expanded, unpublished, unstaged; the snapshot deleted while
// its restore lives, the clone deleted; a block volume on loopfile.
func (p *powerLoss) script(r int) {
	for _, b := range []string{"localdir", "loopfile", "dmthin"} {
		pre := fmt.Sprintf("r%d-%s-", r, b[:4])
		size := int64(localdirBytes)
		switch b {
		case "loopfile":
			size = loopfileBytes
		case "dmthin":
			size = thinVolBytes
		}
		p.create(pre+"a", b, false, size, nil, "")
		p.stagePublishWrite(pre+"a", pre+"a.1")
		p.snapshot(pre+"s", pre+"a")
		p.write(pre+"a", pre+"a.2")
		p.create(pre+"clone", b, false, size, volSource(p.cur.vols[pre+"a"].id), pre+"a.2")
		p.create(pre+"restore", b, false, size, snapSource(p.cur.snaps[pre+"s"].id), pre+"a.1")
		p.expand(pre+"a", size+8<<20)
		if b != "localdir" {
			p.nodeExpand(pre + "a")
		}
		p.unpublishUnstage(pre + "a")
		p.deleteSnapshot(pre + "s")
		p.stagePublishWrite(pre+"restore", pre+"restore.1")
		p.unpublishUnstage(pre + "restore")
		p.deleteVolume(pre + "clone")
	}
	pre := fmt.Sprintf("r%d-", r)
	// A mutable parameter changed; a group snapshot across two backends,
	// a volume restored from one of its members, the group deleted while
	// the restore lives.
	p.modify(pre+"loop-a", map[string]string{"prealloc": "true"})
	p.groupSnapshot(pre+"g", pre+"loop-a", pre+"dmth-a")
	p.create(pre+"g-restore", "dmthin", false, thinVolBytes+8<<20, snapSource(p.cur.snaps[pre+"g/"+pre+"dmth-a"].id), p.cur.snaps[pre+"g/"+pre+"dmth-a"].token)
	p.deleteGroup(pre + "g")
	p.deleteVolume(pre + "g-restore")
	p.create(pre+"blk", "loopfile", true, loopfileBytes, nil, "")
	p.stagePublishWrite(pre+"blk", pre+"blk.1")
	p.snapshot(pre+"blk-s", pre+"blk")
	p.write(pre+"blk", pre+"blk.2")
	p.unpublishUnstage(pre + "blk")
	p.expand(pre+"blk", loopfileBytes+8<<20)
	// A thin block volume: written, snapshotted, restored from it while
	// the source is rewritten, expanded, the restore deleted.
	p.create(pre+"tblk", "dmthin", true, thinVolBytes, nil, "")
	p.stagePublishWrite(pre+"tblk", pre+"tblk.1")
	p.snapshot(pre+"tblk-s", pre+"tblk")
	p.write(pre+"tblk", pre+"tblk.2")
	p.create(pre+"tblk-r", "dmthin", true, thinVolBytes, snapSource(p.cur.snaps[pre+"tblk-s"].id), pre+"tblk.1")
	p.unpublishUnstage(pre + "tblk")
	p.expand(pre+"tblk", thinVolBytes+8<<20)
	p.deleteVolume(pre + "tblk-r")
	if r > 0 {
		// What the previous round kept goes now.
		prev := fmt.Sprintf("r%d-", r-1)
		p.deleteSnapshot(prev + "blk-s")
		p.deleteVolume(prev + "blk")
		p.deleteVolume(prev + "loca-a")
		p.deleteSnapshot(prev + "tblk-s")
		p.deleteVolume(prev + "tblk")
		p.deleteVolume(prev + "dmth-a")
	}
}

// TestPowerLoss: a power cut at any point keeps what the CO was told.
func TestPowerLoss(t *testing.T) {
	require(t, "dm_log_writes")
	begin := time.Now()
	base := t.TempDir()
	dataImg, logImg := filepath.Join(base, "disk.img"), filepath.Join(base, "log.img")
	sparseFile(t, dataImg, diskBytes)
	sparseFile(t, logImg, logBytes)
	dataDev, logDev := attach(t, dataImg), attach(t, logImg)
	t.Cleanup(func() { detach(t, dataDev); detach(t, logDev) })
	lw := dmCreate(t, lwName, fmt.Sprintf("0 %s log-writes %s %s", sectors(t, dataDev), dataDev, logDev))
	// No discard of the whole device by mkfs, and no lazy inode table
	// initialisation writing for minutes behind the workload.
	run(t, "mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", lw)
	mnt := filepath.Join(base, "mnt")
	mountFS(t, lw, mnt, "")
	mounted := true
	t.Cleanup(func() {
		if mounted {
			unmount(t, mnt)
		}
	})
	// However the test ends: the thin devices and the pool go before the
	// loop devices under them and the filesystem holding their files.
	t.Cleanup(func() { removeThin(t) })

	// The daemon's folder (state, pools, the CO's node paths) on the
	// logged filesystem; its compilation cache stays outside.
	tmp := os.Getenv("TMPDIR")
	t.Setenv("TMPDIR", mnt)
	mods := append(modules(t), daemontest.Module{Name: "dmthin", Wasm: moduletest.Build(t, "../../examples/dmthin", toolchain()),
		HostCalls: dmthintest.HostCalls, Pool: true, Roots: []string{plThinPrefix, "/dev/mapper/" + plThinPrefix},
		Config: map[string]string{"pool": plThinPrefix + "pool", "data_device": plThinData, "metadata_device": plThinMeta,
			"data_size": plThinDataSize, "metadata_size": "4Mi"}})
	dd := daemontest.New(t, daemontest.Options{LogFormat: "json", Modules: mods})
	os.Setenv("TMPDIR", tmp)
	p := &powerLoss{t: t, d: dd, node: filepath.Join(dd.Dir, "node"), names: map[string]bool{},
		cur: &state{vols: map[string]*vol{}, snaps: map[string]*snap{}, deleted: map[string]string{}, sources: map[string]*source{}}}
	// What the operator installed (modules, configuration) is durable
	// before the daemon first starts; points before that are no state
	// the daemon could be blamed for.
	if err := syncFS(mnt); err != nil {
		t.Fatal(err)
	}
	p.mark("installed")
	startDaemon(t, dd)
	rounds := envInt(t, EnvRounds, 1)
	for r := range rounds {
		p.script(r)
	}
	workload := time.Since(begin)

	// The power cut: the daemon dies, the kernel's mounts go, the device
	// goes away (its last mark updates the log's super).
	dd.Kill(true)
	releaseAll(t, dd.Dir)
	unmount(t, mnt)
	mounted = false
	run(t, "dmsetup", "remove", lwName)

	lf, err := os.Open(logImg)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	lg, err := logwrites.Open(lf)
	if err != nil {
		t.Fatal(err)
	}
	installed := lg.FindMark("installed", 0)
	if installed < 0 {
		t.Fatal("mark installed missing from the log")
	}
	var all []int
	for _, pt := range lg.DurablePoints() {
		if pt > installed {
			all = append(all, pt)
		}
	}
	n := samplePoints
	if os.Getenv(EnvPoints) == "all" {
		n = len(all)
	} else {
		n = envInt(t, EnvPoints, n)
	}
	points := sample(all, n)
	t.Logf("workload: %d steps in %v; log: %d entries, %d durable points (flush or FUA) after the install, checking %d",
		len(p.steps), workload.Round(time.Millisecond), len(lg.Entries), len(all), len(points))

	ends := make([]int, len(p.steps))   // log index of each step's end mark
	begins := make([]int, len(p.steps)) // and of its begin mark
	for i := range p.steps {
		begins[i] = lg.FindMark("begin-"+strconv.Itoa(i), 0)
		ends[i] = lg.FindMark("end-"+strconv.Itoa(i), begins[i])
		if begins[i] < 0 || ends[i] < 0 {
			t.Fatalf("step %d: marks missing from the log (begin %d, end %d)", i, begins[i], ends[i])
		}
	}

	replayImg := filepath.Join(base, "replay.img")
	sparseFile(t, replayImg, diskBytes)
	rf, err := os.OpenFile(replayImg, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	an := &anomalies{t: t, classes: map[string]int{}}
	checkImg := filepath.Join(base, "check.img")
	replayed := 0
	checkStart := time.Now()
	for i, pt := range points {
		if err := lg.Replay(rf, replayed, pt+1); err != nil {
			t.Fatal(err)
		}
		replayed = pt + 1
		// The steps answered before this point, and the one under way.
		done := 0
		for done < len(p.steps) && ends[done] < pt {
			done++
		}
		cur := &state{vols: map[string]*vol{}, snaps: map[string]*snap{}, deleted: map[string]string{}, sources: map[string]*source{}}
		if done > 0 {
			cur = p.steps[done-1].after
		}
		var inFlight *step
		if done < len(p.steps) && begins[done] < pt {
			inFlight = &p.steps[done]
		}
		an.where = fmt.Sprintf("point %d (log entry %d, %d steps answered", i, pt, done)
		if inFlight != nil {
			an.where += ", under way: " + inFlight.what
		}
		an.where += ")"
		full := i%cleanupEvery == cleanupEvery-1 || i == len(points)-1
		pointStart := time.Now()
		p.checkPoint(an, rf, checkImg, mnt, cur, inFlight, full)
		t.Logf("%s: %d volumes, %d snapshots acknowledged; checked in %v (full %v)", an.where, len(cur.vols), len(cur.snaps),
			time.Since(pointStart).Round(time.Millisecond), full)
	}
	t.Logf("checked %d points in %v", len(points), time.Since(checkStart).Round(time.Millisecond))
	t.Log(an.report(len(points)))
	if an.total() > 0 {
		t.Errorf("%d anomalies", an.total())
	}
}

// checkPoint starts the daemon on a copy of the disk as replayed to this
// point and checks it against what the CO was told.
func (p *powerLoss) checkPoint(an *anomalies, replay *os.File, checkImg, mnt string, want *state, inFlight *step, full bool) {
	t := p.t
	if err := copyImage(replay, checkImg); err != nil {
		t.Fatal(err)
	}
	dev := attach(t, checkImg)
	defer detach(t, dev)
	// The journal recovers as at a boot after the cut.
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		an.add("filesystem lost", fmt.Sprintf("mount: %v", err))
		return
	}
	defer func() {
		p.d.Kill(true)
		releaseAll(t, p.d.Dir)
		unmount(t, mnt)
	}()
	if _, err := os.Stat(p.d.Dir); err != nil {
		// Before the daemon's folder was made durable: nothing was
		// acknowledged yet.
		if len(want.vols)+len(want.snaps) > 0 {
			an.add("state lost", fmt.Sprintf("daemon folder missing: %v", err))
		}
		return
	}
	if err := start(p.d); err != nil {
		an.add("start failed", err.Error())
		return
	}
	vols, snaps, err := p.list()
	if err != nil {
		an.add("list failed", err.Error())
		return
	}
	changing := ""
	if inFlight != nil {
		changing = inFlight.vol
	}
	// Every acknowledged volume and snapshot is there.
	for name, v := range want.vols {
		got, ok := vols[v.id]
		switch {
		case !ok && name == changing && strings.HasPrefix(inFlight.what, "delete "):
			// Its deletion was under way at the cut.
		case !ok:
			an.add("lost volume", fmt.Sprintf("%s (%s) acknowledged, not listed", name, v.id))
		case got.GetCapacityBytes() < v.capacity && name != changing:
			an.add("capacity lost", fmt.Sprintf("%s: %d bytes listed, %d acknowledged", name, got.GetCapacityBytes(), v.capacity))
		}
	}
	deleting, deletingGroup := "", ""
	if inFlight != nil && strings.HasPrefix(inFlight.what, "delete snapshot ") {
		deleting = strings.TrimPrefix(inFlight.what, "delete snapshot ")
	}
	if inFlight != nil && strings.HasPrefix(inFlight.what, "delete group ") {
		deletingGroup = strings.TrimPrefix(inFlight.what, "delete group ") + "/"
	}
	for name, s := range want.snaps {
		got, ok := snaps[s.id]
		if !ok && (name == deleting || deletingGroup != "" && strings.HasPrefix(name, deletingGroup)) {
			continue // its deletion was under way at the cut
		}
		if !ok {
			an.add("lost snapshot", fmt.Sprintf("%s (%s) acknowledged, not listed", name, s.id))
		} else if !got.GetReadyToUse() {
			an.add("lost snapshot", fmt.Sprintf("%s (%s) listed not ready", name, s.id))
		}
	}
	// Nothing the CO never asked for, nothing it was told is gone.
	known := map[string]*vol{}
	for _, st := range p.steps {
		for _, v := range st.after.vols {
			known[v.id] = v
		}
	}
	for id := range vols {
		if what, gone := want.deleted[id]; gone {
			an.add("resurrected", fmt.Sprintf("%s (%s) acknowledged deleted, listed", what, id))
		} else if known[id] == nil && !p.askedFor(vols[id]) {
			an.add("unknown adopted", fmt.Sprintf("volume %s listed, never asked for", id))
		}
	}
	for id := range snaps {
		if what, gone := want.deleted[id]; gone {
			an.add("resurrected", fmt.Sprintf("%s (%s) acknowledged deleted, listed", what, id))
		}
	}
	// Every listed volume is usable and holds its data: an acknowledged
	// one what was last written (the one a write was under way into:
	// that or the one before), one whose creation was under way nothing
	// partial.
	for id, lv := range vols {
		v := known[id]
		if _, gone := want.deleted[id]; v == nil || gone {
			continue
		}
		accept := map[string]bool{}
		if w := want.vols[v.name]; w != nil {
			accept[w.token] = true
			if v.name == changing {
				for _, st := range p.steps {
					if nv := st.after.vols[v.name]; nv != nil {
						accept[nv.token] = true
					}
				}
			}
		} else {
			// Created by the call under way (or deleted by it): whole if
			// listed, as its creation would have made it.
			for _, st := range p.steps {
				if nv := st.after.vols[v.name]; nv != nil && nv.id == id {
					accept[nv.token] = true
					break
				}
			}
		}
		use := *v
		use.volCtx = lv.GetVolumeContext()
		if v.name == changing && inFlight != nil && strings.HasPrefix(inFlight.what, "write ") {
			// The pod's own write under way may be torn: the daemon
			// promises nothing about it, only that the volume serves.
			accept = nil
		}
		if err := p.checkData(&use, accept); err != nil {
			class := "data lost"
			if want.vols[v.name] == nil {
				class = "partial adopted"
			}
			an.add(class, fmt.Sprintf("%s (%s): %v", v.name, id, err))
		}
	}
	if !full {
		return
	}
	// Replay converged: a second start finds the same, with nothing left
	// to replay.
	if err := p.d.Stop(); err != nil {
		an.add("not converged", err.Error())
	}
	if err := start(p.d); err != nil {
		an.add("start failed", "second start: "+err.Error())
		return
	}
	vols2, snaps2, err := p.list()
	if err != nil {
		an.add("list failed", err.Error())
		return
	}
	if !slices.Equal(slices.Sorted(maps.Keys(vols)), slices.Sorted(maps.Keys(vols2))) ||
		!slices.Equal(slices.Sorted(maps.Keys(snaps)), slices.Sorted(maps.Keys(snaps2))) {
		an.add("not converged", fmt.Sprintf("second start lists volumes %v snapshots %v, first %v %v",
			slices.Sorted(maps.Keys(vols2)), slices.Sorted(maps.Keys(snaps2)), slices.Sorted(maps.Keys(vols)), slices.Sorted(maps.Keys(snaps))))
	}
	p.cleanupAll(an, snaps2, vols2)
}

// askedFor reports whether a listed volume is one the workload asked for
// by a name, in a call cut off before it was answered.
func (p *powerLoss) askedFor(v *csi.Volume) bool {
	for name := range p.names {
		if strings.Contains(v.GetVolumeId(), name) {
			return true
		}
	}
	return false
}

// checkData stages and publishes v, reads its data, and undoes both: the
// data must be one of accept (nil: any, even torn).
func (p *powerLoss) checkData(v *vol, accept map[string]bool) error {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := stagePublish(c, p.d, p.node, v); err != nil {
		return fmt.Errorf("unusable: %w", err)
	}
	token, rerr := readToken(target(p.node, v), v.block)
	if err := unpublishUnstage(c, p.d, p.node, v); err != nil {
		return fmt.Errorf("unusable: %w", err)
	}
	switch {
	case accept == nil:
		return nil
	case rerr != nil:
		return rerr
	case !accept[token]:
		return fmt.Errorf("holds data %q, want one of %v", token, slices.Sorted(maps.Keys(accept)))
	}
	return nil
}

func (p *powerLoss) list() (map[string]*csi.Volume, map[string]*csi.Snapshot, error) {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	vols := map[string]*csi.Volume{}
	vr, err := p.d.Controller().ListVolumes(c, &csi.ListVolumesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("ListVolumes: %w", err)
	}
	for _, e := range vr.GetEntries() {
		vols[e.GetVolume().GetVolumeId()] = e.GetVolume()
	}
	snaps := map[string]*csi.Snapshot{}
	sr, err := p.d.Controller().ListSnapshots(c, &csi.ListSnapshotsRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("ListSnapshots: %w", err)
	}
	for _, e := range sr.GetEntries() {
		snaps[e.GetSnapshot().GetSnapshotId()] = e.GetSnapshot()
	}
	return vols, snaps, nil
}

// cleanupAll deletes every snapshot and volume through CSI; then nothing
// may be left: no record after a restart, no file in a pool.
func (p *powerLoss) cleanupAll(an *anomalies, snaps map[string]*csi.Snapshot, vols map[string]*csi.Volume) {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// A group's snapshots go with their group, as the spec wants.
	groups := map[string][]string{}
	for id, sn := range snaps {
		if g := sn.GetGroupSnapshotId(); g != "" {
			groups[g] = append(groups[g], id)
		}
	}
	for g, members := range groups {
		if _, err := p.d.Group().DeleteVolumeGroupSnapshot(c, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g, SnapshotIds: members}); err != nil {
			an.add("cleanup failed", fmt.Sprintf("DeleteVolumeGroupSnapshot %s: %v", g, err))
		}
	}
	for id, sn := range snaps {
		if sn.GetGroupSnapshotId() != "" {
			continue
		}
		if _, err := p.d.Controller().DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
			an.add("cleanup failed", fmt.Sprintf("DeleteSnapshot %s: %v", id, err))
		}
	}
	for id := range vols {
		if _, err := p.d.Controller().DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil && status.Code(err) != codes.NotFound {
			an.add("cleanup failed", fmt.Sprintf("DeleteVolume %s: %v", id, err))
		}
	}
	if err := p.d.Stop(); err != nil {
		an.add("orphaned", err.Error())
	}
	if err := start(p.d); err != nil {
		an.add("start failed", "after cleanup: "+err.Error())
		return
	}
	v2, s2, err := p.list()
	if err != nil {
		an.add("list failed", err.Error())
		return
	}
	if len(v2)+len(s2) > 0 {
		an.add("orphaned", fmt.Sprintf("after deleting everything: volumes %v snapshots %v listed", slices.Sorted(maps.Keys(v2)), slices.Sorted(maps.Keys(s2))))
	}
	for _, m := range p.d.Modules {
		pool := p.d.Pool(m.Name)
		var left []string
		filepath.WalkDir(pool, func(path string, e os.DirEntry, err error) error {
			rel := strings.TrimPrefix(path, pool+"/")
			if m.Name == "dmthin" && (rel == plThinData || rel == plThinMeta) {
				return nil // the thin pool's own devices
			}
			if err == nil && path != pool {
				left = append(left, rel)
			}
			return nil
		})
		if len(left) > 0 {
			an.add("orphaned", fmt.Sprintf("pool %s holds %v after deleting everything", m.Name, left))
		}
	}
	if err := thinPoolEmpty(); err != nil {
		an.add("orphaned", err.Error())
	}
	if ms, _ := daemontest.MountsUnder(p.node); len(ms) > 0 {
		an.add("orphaned", fmt.Sprintf("mounts left: %v", ms))
	}
}

// copyImage copies the replayed disk into a fresh image the daemon may
// change, keeping holes as holes.
func copyImage(src *os.File, dst string) error {
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	if err := out.Truncate(st.Size()); err != nil {
		return err
	}
	fd := int(src.Fd())
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data after off
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// sample picks n of points, evenly spread, the last always among them.
func sample(points []int, n int) []int {
	if n >= len(points) || n <= 0 {
		return points
	}
	out := make([]int, 0, n)
	for i := range n {
		out = append(out, points[(i+1)*len(points)/n-1])
	}
	return out
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

// anomalies counts what the checks found, by class.
type anomalies struct {
	t       *testing.T
	where   string
	classes map[string]int
}

func (a *anomalies) add(class, detail string) {
	a.classes[class]++
	a.t.Errorf("%s: %s: %s", a.where, class, detail)
}

func (a *anomalies) total() int {
	n := 0
	for _, c := range a.classes {
		n += c
	}
	return n
}

// classes every check can report, listed with 0 when nothing was found.
var powerLossClasses = []string{"filesystem lost", "state lost", "start failed", "list failed", "lost volume",
	"lost snapshot", "capacity lost", "data lost", "partial adopted", "resurrected", "unknown adopted",
	"not converged", "cleanup failed", "orphaned"}

func (a *anomalies) report(points int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "anomalies by class over %d points:", points)
	for _, c := range powerLossClasses {
		fmt.Fprintf(&b, "\n  %-16s %d", c, a.classes[c])
	}
	return b.String()
}

// syncFS makes everything on the filesystem at dir durable.
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// removeThin removes the power-loss tier's device-mapper devices: the thin
// devices first, the pool last.
func removeThin(t testing.TB) { dmthintest.RemoveAll(t, plThinPrefix, plThinPrefix+"pool") }

// releaseAll takes away what a dead daemon left in the kernel, as a power
// cut does: its mounts, the thin devices and pool, the loop devices.
func releaseAll(t testing.TB, dir string) {
	ms, err := daemontest.MountsUnder(dir)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, m := range ms {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s: %v", m, err)
		}
	}
	removeThin(t)
	daemontest.ReleaseUnder(t, dir)
}

// thinPoolEmpty checks the thin pool holds nothing once every volume and
// snapshot is deleted: no thin device active beside the pool, no data
// block mapped.
func thinPoolEmpty() error {
	m, err := dm.New(plThinPrefix)
	if err != nil {
		return err
	}
	ctx := context.Background()
	devs, err := m.List(ctx)
	if err != nil {
		return fmt.Errorf("list dm devices: %w", err)
	}
	for _, d := range devs {
		if d.Name != plThinPrefix+"pool" {
			return fmt.Errorf("thin device %s active after deleting everything", d.Name)
		}
	}
	out, err := exec.Command("dmsetup", "status", plThinPrefix+"pool").CombinedOutput()
	if err != nil {
		return fmt.Errorf("dmsetup status: %v: %s", err, out)
	}
	// <start> <len> thin-pool <transaction> <meta used>/<total> <data used>/<total> ...
	f := strings.Fields(string(out))
	if len(f) < 6 || !strings.HasPrefix(f[5], "0/") {
		return fmt.Errorf("thin pool after deleting everything: %s", strings.TrimSpace(string(out)))
	}
	return nil
}
