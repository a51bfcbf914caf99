package faulttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// faultDisk is a filesystem on a device-mapper device whose table the test
// swaps: linear (healthy), flakey with error_writes (every write fails
// with EIO, reads work), or the same filesystem remounted read-only.
type faultDisk struct {
	t       *testing.T
	name    string // device-mapper name
	dev     string // its node
	backing string // the loop device under it
	sectors string
	root    string // where the filesystem is mounted
	binds   []string
}

func newFaultDisk(t *testing.T, base, name string, size int64) *faultDisk {
	file := filepath.Join(base, name+".img")
	sparseFile(t, file, size)
	lo := attach(t, file)
	t.Cleanup(func() { detach(t, lo) })
	f := &faultDisk{t: t, name: "wasmcsi-faults-" + name, backing: lo, sectors: sectors(t, lo), root: filepath.Join(base, "fs-"+name)}
	f.dev = dmCreate(t, f.name, f.linear())
	run(t, "mkfs.ext4", "-q", "-F", "-E", "nodiscard", f.dev)
	f.mount()
	t.Cleanup(f.unmount)
	return f
}

func (f *faultDisk) linear() string { return fmt.Sprintf("0 %s linear %s 0", f.sectors, f.backing) }

// mount mounts the filesystem and binds its folder "dir" at each bind
// target (a pool or the state folder the daemon was given).
func (f *faultDisk) mount() {
	mountFS(f.t, f.dev, f.root, "")
	for _, b := range f.binds {
		f.bindAt(b)
	}
}

func (f *faultDisk) bindAt(target string) {
	src := filepath.Join(f.root, "dir")
	if err := os.MkdirAll(src, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		f.t.Fatalf("bind %s at %s: %v", src, target, err)
	}
}

// bind makes target a folder of this filesystem, now and after a remount.
func (f *faultDisk) bind(target string) {
	f.binds = append(f.binds, target)
	f.bindAt(target)
}

func (f *faultDisk) unmount() {
	for _, b := range f.binds {
		unix.Unmount(b, unix.MNT_DETACH)
	}
	unix.Unmount(f.root, unix.MNT_DETACH)
}

func (f *faultDisk) load(table string) {
	run(f.t, "dmsetup", "suspend", "--noflush", "--nolockfs", f.name)
	run(f.t, "dmsetup", "load", f.name, "--table", table)
	run(f.t, "dmsetup", "resume", f.name)
}

// failWrites makes every write to the device fail with EIO.
func (f *faultDisk) failWrites() {
	f.load(fmt.Sprintf("0 %s flakey %s 0 0 3600 1 error_writes", f.sectors, f.backing))
}

// heal puts the healthy table back and mounts the filesystem again, as an
// operator does once the disk answers again: the kernel aborted its
// journal at the first failed write and keeps it read-only until then.
// The daemon must not run meanwhile (its loop devices hold the files).
func (f *faultDisk) heal() {
	f.load(f.linear())
	f.unmount()
	f.mount() // the journal replays
}

// callResult is one call made while a fault was on.
type callResult struct {
	what string
	err  error
	// retry is the CO's retry once the fault is gone; check verifies
	// what the retry (or the call, when it answered OK) left.
	retry func(context.Context) error
}

type faultRun struct {
	t     *testing.T
	d     *daemontest.Daemon
	node  string
	vols  map[string]*vol
	snaps map[string]*snap
	// classes counts anomalies by class; injected counts faulted calls.
	classes  map[string]int
	injected int
}

func (r *faultRun) anomaly(class, format string, args ...any) {
	r.classes[class]++
	r.t.Errorf(class+": "+format, args...)
}

func (r *faultRun) create(c context.Context, name, backend string, size int64, src *csi.VolumeContentSource, token string) error {
	return r.createVol(c, &vol{name: name, backend: backend}, size, src, token)
}

// createVol creates v (a block volume when v.block) and records it once
// acknowledged.
func (r *faultRun) createVol(c context.Context, v *vol, size int64, src *csi.VolumeContentSource, token string) error {
	name, backend := v.name, v.backend
	resp, err := r.d.Controller().CreateVolume(c, &csi.CreateVolumeRequest{Name: name,
		CapacityRange:       &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities:  []*csi.VolumeCapability{v.capability()},
		Parameters:          map[string]string{backendParam: backend},
		VolumeContentSource: src})
	if err != nil {
		return err
	}
	v.id, v.capacity, v.volCtx, v.token = resp.GetVolume().GetVolumeId(), resp.GetVolume().GetCapacityBytes(), resp.GetVolume().GetVolumeContext(), token
	r.vols[name] = v
	return nil
}

func (r *faultRun) snapshot(c context.Context, name, volName string) error {
	v := r.vols[volName]
	resp, err := r.d.Controller().CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
	if err != nil {
		return err
	}
	r.snaps[name] = &snap{name: name, id: resp.GetSnapshot().GetSnapshotId(), source: volName, token: v.token}
	return nil
}

func (r *faultRun) expand(c context.Context, volName string, size int64) error {
	v := r.vols[volName]
	resp, err := r.d.Controller().ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: v.id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: v.capability()})
	if err == nil {
		v.capacity = resp.GetCapacityBytes()
	}
	return err
}

func (r *faultRun) writeVolume(c context.Context, volName, token string) error {
	v := r.vols[volName]
	if err := stagePublish(c, r.d, r.node, v); err != nil {
		return err
	}
	if err := writeData(target(r.node, v), v.block, token); err != nil {
		return err
	}
	v.token = token
	return unpublishUnstage(c, r.d, r.node, v)
}

// checkVolume reads v's data through stage and publish.
func (r *faultRun) checkVolume(c context.Context, v *vol) error {
	if err := stagePublish(c, r.d, r.node, v); err != nil {
		return err
	}
	token, rerr := readToken(target(r.node, v), v.block)
	if err := unpublishUnstage(c, r.d, r.node, v); err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	if token != v.token {
		return fmt.Errorf("holds %q, want %q", token, v.token)
	}
	return nil
}

// faulted runs calls while a fault is on; each must fail with one of the
// codes in want (never OK, never a code that blames the request) and a
// message naming the cause (wantMsg, one of them).
func (r *faultRun) faulted(label string, want []codes.Code, wantMsg []string, calls []callResult) []callResult {
	r.t.Helper()
	for i := range calls {
		c, cancel := context.WithTimeout(context.Background(), callTimeout)
		calls[i].err = calls[i].retry(c)
		cancel()
		r.injected++
		code, msg := status.Code(calls[i].err), status.Convert(calls[i].err).Message()
		r.t.Logf("%s: %s: %v", label, calls[i].what, calls[i].err)
		switch {
		case calls[i].err == nil:
			// Acknowledged: it must be there, whole, once the fault is
			// gone (verifyAll), as a volume whose intent the state folder
			// kept is.
		case !containsCode(want, code):
			r.anomaly("imprecise code", "%s: %s answered %v, want one of %v: %s", label, calls[i].what, code, want, msg)
		case !containsAny(strings.ToLower(msg), wantMsg):
			r.anomaly("cause not named", "%s: %s: message %q names none of %q", label, calls[i].what, msg, wantMsg)
		}
	}
	return calls
}

// retried retries the calls that failed once the fault is gone: each
// must succeed now, as the CO's retry does.
func (r *faultRun) retried(label string, calls []callResult) {
	r.t.Helper()
	for _, cr := range calls {
		if cr.err == nil {
			continue
		}
		c, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := cr.retry(c)
		cancel()
		if err != nil {
			r.anomaly("retry failed", "%s: %s retried after the fault: %v", label, cr.what, err)
		}
	}
}

// serving checks the other backend keeps serving while one is faulted:
// a new volume created, written and read back.
func (r *faultRun) serving(label, backend, name string) {
	r.t.Helper()
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := r.create(c, name, backend, localdirBytes, nil, ""); err != nil {
		r.anomaly("others stopped", "%s: %s create: %v", label, backend, err)
		return
	}
	if err := r.writeVolume(c, name, name+".1"); err != nil {
		r.anomaly("others stopped", "%s: %s write: %v", label, backend, err)
		return
	}
	if err := r.checkVolume(c, r.vols[name]); err != nil {
		r.anomaly("others stopped", "%s: %s read: %v", label, backend, err)
	}
}

// health asks for the volume's health: the fault must show.
func (r *faultRun) health(label string, v *vol) {
	r.t.Helper()
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := r.d.Controller().ControllerGetVolumeHealth(c, &csi.ControllerGetVolumeHealthRequest{VolumeId: v.id})
	if err != nil {
		r.anomaly("health silent", "%s: ControllerGetVolumeHealth %s: %v", label, v.name, err)
		return
	}
	var entries []string
	for _, e := range resp.GetVolumeHealth().GetHealthStatuses() {
		entries = append(entries, fmt.Sprintf("%v %s: %s", e.GetStatus(), e.GetReason(), e.GetMessage()))
	}
	r.t.Logf("%s: health of %s: %v", label, v.name, entries)
	if len(entries) == 0 {
		r.anomaly("health silent", "%s: volume %s on the faulted pool reports healthy", label, v.name)
	}
}

// verifyAll lists what the daemon has and checks it against what it was
// told: every acknowledged volume and snapshot there with its data,
// nothing else.
func (r *faultRun) verifyAll(label string) {
	r.t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 5*callTimeout)
	defer cancel()
	vr, err := r.d.Controller().ListVolumes(c, &csi.ListVolumesRequest{})
	if err != nil {
		r.anomaly("lost", "%s: ListVolumes: %v", label, err)
		return
	}
	listed := map[string]bool{}
	for _, e := range vr.GetEntries() {
		listed[e.GetVolume().GetVolumeId()] = true
	}
	known := map[string]bool{}
	for _, v := range r.vols {
		known[v.id] = true
		if !listed[v.id] {
			r.anomaly("lost", "%s: volume %s not listed", label, v.name)
			continue
		}
		if err := r.checkVolume(c, v); err != nil {
			r.anomaly("lost", "%s: volume %s: %v", label, v.name, err)
		}
	}
	for id := range listed {
		if !known[id] {
			r.anomaly("unacknowledged kept", "%s: volume %s listed, never acknowledged", label, id)
		}
	}
	sr, err := r.d.Controller().ListSnapshots(c, &csi.ListSnapshotsRequest{})
	if err != nil {
		r.anomaly("lost", "%s: ListSnapshots: %v", label, err)
		return
	}
	snaps := map[string]bool{}
	for _, e := range sr.GetEntries() {
		snaps[e.GetSnapshot().GetSnapshotId()] = true
	}
	for _, s := range r.snaps {
		if !snaps[s.id] {
			r.anomaly("lost", "%s: snapshot %s not listed", label, s.name)
		}
		delete(snaps, s.id)
	}
	for id := range snaps {
		r.anomaly("unacknowledged kept", "%s: snapshot %s listed, never acknowledged", label, id)
	}
}

func containsCode(list []codes.Code, c codes.Code) bool {
	for _, x := range list {
		if x == c {
			return true
		}
	}
	return false
}

func containsAny(s string, subs []string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

var faultClasses = []string{"imprecise code", "cause not named", "others stopped",
	"health silent", "retry failed", "lost", "unacknowledged kept", "orphaned"}

// TestDiskFaults: pools and the state folder on disks that fail writes,
// fill up or turn read-only. Every call answers a precise code, keeps
// nothing it did not acknowledge, the other backend serves on, health shows
// the fault, and the CO's retries succeed once it is gone.
func TestDiskFaults(t *testing.T) {
	require(t, "dm_flakey")
	begin := time.Now()
	base := t.TempDir()
	dd := daemontest.New(t, daemontest.Options{LogFormat: "json", Modules: modules(t)})
	local := newFaultDisk(t, base, "localdir", 96<<20)
	loopDisk := newFaultDisk(t, base, "loopfile", 64<<20)
	stateDisk := newFaultDisk(t, base, "state", 64<<20)
	local.bind(dd.Pool("localdir"))
	loopDisk.bind(dd.Pool("loopfile"))
	stateDisk.bind(dd.State)
	// Unmount the daemon's mounts and loop devices before the disks go.
	t.Cleanup(func() { dd.Kill(true); daemontest.ReleaseUnder(t, dd.Dir) })
	startDaemon(t, dd)
	r := &faultRun{t: t, d: dd, node: filepath.Join(dd.Dir, "node"), vols: map[string]*vol{}, snaps: map[string]*snap{}, classes: map[string]int{}}
	restart := func(disks ...*faultDisk) {
		t.Helper()
		dd.Kill(true)
		daemontest.ReleaseUnder(t, filepath.Join(dd.Dir, "node"))
		devs, err := daemontest.LoopsUnder(dd.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, dev := range devs {
			if err := loop.DetachBound(context.Background(), dev); err != nil {
				t.Fatalf("detach %s: %v", dev.Path, err)
			}
		}
		for _, f := range disks {
			f.heal()
		}
		if err := start(dd); err != nil {
			t.Fatal(err)
		}
	}

	// What exists before the faults: data the faults must not take.
	c := ctx(t)
	for _, b := range []string{"localdir", "loopfile"} {
		if err := r.create(c, "base-"+b, b, loopfileBytes, nil, ""); err != nil {
			t.Fatal(err)
		}
		if err := r.writeVolume(c, "base-"+b, "base-"+b+".1"); err != nil {
			t.Fatal(err)
		}
		if err := r.snapshot(c, "base-"+b+"-s", "base-"+b); err != nil {
			t.Fatal(err)
		}
	}

	// The first failed write aborts the pool's journal and the kernel
	// turns the filesystem read-only: later calls meet that instead.
	ioCodes := []codes.Code{codes.Internal, codes.Unavailable, codes.Aborted, codes.FailedPrecondition}
	ioWords := []string{"input/output error", "i/o error", "read-only file system", loopDisk.name}

	t.Run("EIO", func(t *testing.T) {
		base := r.vols["base-loopfile"]
		loopDisk.failWrites()
		calls := r.faulted("EIO on the loopfile pool", ioCodes, ioWords, []callResult{
			{what: "CreateVolume", retry: func(c context.Context) error { return r.create(c, "eio-new", "loopfile", loopfileBytes, nil, "") }},
			{what: "CreateVolume (clone)", retry: func(c context.Context) error {
				return r.create(c, "eio-clone", "loopfile", loopfileBytes, volSource(base.id), base.token)
			}},
			{what: "CreateSnapshot", retry: func(c context.Context) error { return r.snapshot(c, "eio-snap", "base-loopfile") }},
			{what: "ControllerExpandVolume", retry: func(c context.Context) error { return r.expand(c, "base-loopfile", loopfileBytes+8<<20) }},
			{what: "NodeStageVolume", retry: func(c context.Context) error {
				if err := stagePublish(c, r.d, r.node, base); err != nil {
					return err
				}
				return unpublishUnstage(c, r.d, r.node, base)
			}},
		})
		r.serving("EIO on the loopfile pool", "localdir", "eio-other")
		r.health("EIO on the loopfile pool", base)
		restart(loopDisk)
		r.retried("after EIO", calls)
		r.verifyAll("after EIO")
	})

	t.Run("ENOSPC", func(t *testing.T) {
		base := r.vols["base-loopfile"]
		// Fill the pool's filesystem but for a few blocks.
		filler := filepath.Join(loopDisk.root, "filler")
		fillUp(t, filler)
		calls := r.faulted("ENOSPC on the loopfile pool", []codes.Code{codes.ResourceExhausted}, []string{"space", "exhausted", "full"}, []callResult{
			{what: "CreateVolume (clone)", retry: func(c context.Context) error {
				return r.create(c, "full-clone", "loopfile", base.capacity, volSource(base.id), base.token)
			}},
			{what: "CreateSnapshot", retry: func(c context.Context) error { return r.snapshot(c, "full-snap", "base-loopfile") }},
			{what: "CreateVolume (restore)", retry: func(c context.Context) error {
				return r.create(c, "full-restore", "loopfile", loopfileBytes, snapSource(r.snaps["base-loopfile-s"].id), r.snaps["base-loopfile-s"].token)
			}},
		})
		r.serving("ENOSPC on the loopfile pool", "localdir", "full-other")
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		r.retried("after ENOSPC", calls)
		r.verifyAll("after ENOSPC")
	})

	t.Run("ReadOnly", func(t *testing.T) {
		if err := unix.Mount("", local.root, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount %s read-only: %v", local.root, err)
		}
		roCodes := []codes.Code{codes.Internal, codes.Unavailable, codes.FailedPrecondition}
		calls := r.faulted("localdir pool read-only", roCodes, []string{"read-only"}, []callResult{
			{what: "CreateVolume", retry: func(c context.Context) error { return r.create(c, "ro-new", "localdir", localdirBytes, nil, "") }},
			{what: "CreateVolume (clone)", retry: func(c context.Context) error {
				b := r.vols["base-localdir"]
				return r.create(c, "ro-clone", "localdir", localdirBytes, volSource(b.id), b.token)
			}},
			{what: "CreateSnapshot", retry: func(c context.Context) error { return r.snapshot(c, "ro-snap", "base-localdir") }},
		})
		r.serving("localdir pool read-only", "loopfile", "ro-other")
		r.health("localdir pool read-only", r.vols["base-localdir"])
		if err := unix.Mount("", local.root, "", unix.MS_REMOUNT, ""); err != nil {
			t.Fatalf("remount %s read-write: %v", local.root, err)
		}
		r.retried("after read-only", calls)
		r.verifyAll("after read-only")
	})

	t.Run("StateFolder", func(t *testing.T) {
		stateDisk.failWrites()
		calls := r.faulted("state folder failing", ioCodes, []string{"input/output error", "state"}, []callResult{
			{what: "CreateVolume", retry: func(c context.Context) error { return r.create(c, "state-new", "localdir", localdirBytes, nil, "") }},
			// The same call again: answered from memory it would succeed.
			{what: "CreateVolume again", retry: func(c context.Context) error { return r.create(c, "state-new", "localdir", localdirBytes, nil, "") }},
			{what: "CreateSnapshot", retry: func(c context.Context) error { return r.snapshot(c, "state-snap", "base-localdir") }},
		})
		restart(stateDisk)
		r.retried("after the state folder failed", calls)
		r.verifyAll("after the state folder failed")
	})

	// Everything deleted through CSI: nothing left in the pools.
	c = ctx(t)
	for _, s := range r.snaps {
		if _, err := dd.Controller().DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: s.id}); err != nil {
			r.anomaly("orphaned", "DeleteSnapshot %s: %v", s.name, err)
		}
	}
	for _, v := range r.vols {
		if _, err := dd.Controller().DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			r.anomaly("orphaned", "DeleteVolume %s: %v", v.name, err)
		}
	}
	for _, m := range []string{"localdir", "loopfile"} {
		pool := dd.Pool(m)
		entries, _ := os.ReadDir(pool)
		var left []string
		for _, e := range entries {
			if e.Name() != "lost+found" {
				left = append(left, e.Name())
			}
		}
		if len(left) > 0 {
			r.anomaly("orphaned", "pool %s holds %v after deleting everything", m, left)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d faulted calls in %v; anomalies by class:", r.injected, time.Since(begin).Round(time.Millisecond))
	for _, cl := range faultClasses {
		fmt.Fprintf(&b, "\n  %-24s %d", cl, r.classes[cl])
	}
	t.Log(b.String())
}

// fillUp fills the filesystem holding file until not even a block is
// free (root writes into the reserved blocks too); the file goes when t
// ends, also on failure.
func fillUp(t *testing.T, file string) {
	t.Helper()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(file) })
	defer f.Close()
	off := int64(0)
	for _, chunk := range []int64{1 << 20, 4 << 10} {
		for {
			err := unix.Fallocate(int(f.Fd()), 0, off, chunk)
			if errors.Is(err, unix.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatalf("fill %s: %v", file, err)
			}
			off += chunk
		}
	}
}
