package host_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// TestSnapshotOfVolumeInUseHoldsOneMoment: a snapshot of its own of a
// mounted volume in use is cut with the volume's filesystem frozen. What
// the workload wrote before the call, still only in the page cache, is in
// the snapshot; a write the workload starts while the backend copies the
// file (the pool here has no reflinks) waits for the cut and is not in it.
// Unpaused, the copy missed the cached write and let the other one through.
func TestSnapshotOfVolumeInUseHoldsOneMoment(t *testing.T) {
	ctl := t.TempDir()
	var target string
	during := make(chan error, 1)
	var finishedInCut bool
	hook := func() {
		// Runs in file_clone, before the copy: the workload writes.
		go func() { during <- os.WriteFile(filepath.Join(target, "during"), []byte("during"), 0o644) }()
		select {
		case err := <-during:
			finishedInCut = true
			during <- err
		case <-time.After(500 * time.Millisecond):
		}
	}
	d := faultyLoopfileDaemon(t, ctl, hook, 30*time.Second)
	ctx := callCtx(t)
	v := publishedVolume(t, d, "moment-b")
	target = v.target
	if err := os.WriteFile(filepath.Join(target, "before"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	resp, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "moment", SourceVolumeId: v.vol.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if finishedInCut {
		t.Error("a write the workload started during the cut finished within it: the filesystem was not frozen")
	}
	select {
	case err := <-during:
		if err != nil {
			t.Fatalf("the write started during the cut: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the write started during the cut did not finish after it: the filesystem stayed frozen")
	}
	got := restoreFiles(t, d, resp.GetSnapshot(), "moment-r", "before", "during")
	if got["before"] != "before" {
		t.Errorf("the snapshot holds %q for the file written (not synced) before the call, want %q", got["before"], "before")
	}
	if s, ok := got["during"]; ok {
		t.Errorf("the snapshot holds the file written during the cut (%q): it is not one moment", s)
	}
}

// TestSnapshotPauseDeadline: a cut that outlasts freeze_timeout resumes
// the writes on time, fails DEADLINE_EXCEEDED, and leaves no snapshot, in
// the records or in the pool.
func TestSnapshotPauseDeadline(t *testing.T) {
	ctl := t.TempDir()
	const freeze = time.Second
	cutting := make(chan struct{}, 1)
	d := faultyLoopfileDaemon(t, ctl, signal(cutting), freeze)
	v := publishedVolume(t, d, "late-b")
	hang := hangCuts(t, ctl)
	errc := snapshotAsync(t, d, "late", v)
	// The copy begins with the filesystem frozen; a write then stalls,
	// and goes on once the hold runs out, with the copy still hung.
	waitSignal(t, cutting, "the cut to begin")
	start := time.Now()
	wrote := make(chan error, 1)
	go func() { wrote <- os.WriteFile(filepath.Join(v.target, "w"), []byte("w"), 0o644) }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(freeze + 15*time.Second):
		t.Fatal("the writes did not resume after the freeze timeout")
	}
	resumed := time.Since(start)
	if resumed < freeze/4 {
		t.Errorf("a write during the cut finished after %s: the filesystem was not frozen", resumed)
	}
	select {
	case err := <-errc:
		t.Fatalf("the call returned (%v) before the hung copy", err)
	default:
	}
	if err := os.Remove(hang); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	wantCode(t, err, codes.DeadlineExceeded)
	t.Logf("writes resumed after %s; the call failed: %v", resumed.Round(time.Millisecond), err)
	if n := snapshotsOf(t, d, v); n != 0 {
		t.Errorf("%d snapshots of %s are recorded after the hold ran out", n, v.vol.GetVolumeId())
	}
	snaps, err := filepath.Glob(filepath.Join(filepath.Dir(v.file), "*.snap"))
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 0 {
		t.Errorf("the pool keeps the cut the hold did not cover: %v", snaps)
	}
	if j, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "quiesce-snapshots")); err != nil || len(j) != 0 {
		t.Errorf("snapshot journals after the failed cut: %v, %v; want none", j, err)
	}
}

// restoreFiles restores sn into a new mount volume named name and returns
// the content of each of files found in it.
func restoreFiles(t *testing.T, d *daemon, sn *csi.Snapshot, name string, files ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	withRestored(t, d, sn, name, func(target string) {
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(target, f))
			if errors.Is(err, os.ErrNotExist) {
				continue
			} else if err != nil {
				t.Fatal(err)
			}
			out[f] = string(b)
		}
	})
	return out
}

// TestSnapshotCleanupRetried: a cut whose pause someone else ended while
// the backend copied is removed; when that removal fails the call answers
// UNAVAILABLE and the snapshot's journal stays, the next start removes the
// cut (a retry of the same name would otherwise adopt it), and the retry
// then cuts anew.
func TestSnapshotCleanupRetried(t *testing.T) {
	ctl := t.TempDir()
	var thaw atomic.Value // the path to thaw behind the hold's back, or ""
	thaw.Store("")
	hook := func() {
		if p := thaw.Load().(string); p != "" {
			if _, err := fs.Thaw(p, 0); err != nil {
				t.Errorf("thaw %s: %v", p, err)
			}
		}
	}
	d := faultyLoopfileDaemon(t, ctl, hook, 30*time.Second)
	v := publishedVolume(t, d, "again-b")
	failRemove := filepath.Join(ctl, "failremove")
	touch(t, failRemove)
	t.Cleanup(func() { os.Remove(failRemove) })
	thaw.Store(v.staging)
	req := &csi.CreateSnapshotRequest{Name: "again-a-1", SourceVolumeId: v.vol.GetVolumeId()}
	_, err := d.controller().CreateSnapshot(callCtx(t), req)
	wantCode(t, err, codes.Unavailable)
	thaw.Store("")
	snapFiles := func() []string {
		t.Helper()
		files, err := filepath.Glob(filepath.Join(filepath.Dir(v.file), "*.snap"))
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	journalDir := filepath.Join(d.cfg.StateDir, "quiesce-snapshots")
	journals := func() []os.DirEntry {
		t.Helper()
		entries, err := os.ReadDir(journalDir)
		if err != nil {
			t.Fatal(err)
		}
		return entries
	}
	if len(snapFiles()) == 0 || len(journals()) != 1 {
		t.Fatalf("after a failed removal: snapshot files %v and %d journals, want the cut and its journal", snapFiles(), len(journals()))
	}
	if err := os.Remove(failRemove); err != nil {
		t.Fatal(err)
	}
	d.restart(t)
	if files, j := snapFiles(), journals(); len(files) != 0 || len(j) != 0 {
		t.Fatalf("after a restart: snapshot files %v and %d journals, want none", files, len(j))
	}
	if n := snapshotsOf(t, d, v); n != 0 {
		t.Fatalf("%d snapshots recorded", n)
	}
	resp, err := d.controller().CreateSnapshot(callCtx(t), req)
	if err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if !resp.GetSnapshot().GetReadyToUse() || len(snapFiles()) != 1 || len(journals()) != 0 {
		t.Fatalf("the retry: ready %v, snapshot files %v, %d journals", resp.GetSnapshot().GetReadyToUse(), snapFiles(), len(journals()))
	}
}

// TestSnapshotOfFrozenSource: a source whose filesystem someone else froze
// already (a backup tool's pre-hook) is cut as it is, still frozen: the
// call succeeds and leaves the thaw to whoever froze it.
func TestSnapshotOfFrozenSource(t *testing.T) {
	d := faultyLoopfileDaemon(t, t.TempDir(), nil, 30*time.Second)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "frozen", false)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := fs.Freeze(v.staging, 0); err != nil {
		t.Fatal(err)
	}
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			fs.Thaw(v.staging, 0)
		}
	})
	if _, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "frozen-1", SourceVolumeId: v.vol.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	was, err := fs.Thaw(v.staging, 0)
	thawed = err == nil
	if err != nil || !was {
		t.Fatalf("the filesystem after the snapshot: frozen %v, %v; want still frozen by its owner", was, err)
	}
}

// TestSnapshotOfFrozenSourceThawedMidCut: a filesystem someone else froze
// is cut as it is, but when they thaw it while the backend copies it (a
// backup tool's hook that timed out), the copy may hold two moments: the
// call fails ABORTED, and neither the cut, a record nor a journal stays.
func TestSnapshotOfFrozenSourceThawedMidCut(t *testing.T) {
	var staging atomic.Pointer[string]
	hook := func() {
		if p := staging.Load(); p != nil {
			fs.Thaw(*p, 0) // the owner's thaw, mid-copy
		}
	}
	d := faultyLoopfileDaemon(t, t.TempDir(), hook, 30*time.Second)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "thawed-b", false)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := fs.Freeze(v.staging, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Thaw(v.staging, 0) })
	staging.Store(&v.staging)
	_, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "thawed-1", SourceVolumeId: v.vol.GetVolumeId()})
	wantCode(t, err, codes.Aborted, "thawed")
	if n := snapshotsOf(t, d, v); n != 0 {
		t.Errorf("%d snapshots recorded of a cut whose freeze ended mid-copy", n)
	}
	if snaps, err := filepath.Glob(filepath.Join(filepath.Dir(v.file), "*.snap")); err != nil || len(snaps) != 0 {
		t.Errorf("the pool keeps the cut: %v, %v", snaps, err)
	}
	if j, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "quiesce-snapshots")); err != nil || len(j) != 0 {
		t.Errorf("snapshot journals after the aborted cut: %v, %v; want none", j, err)
	}
	if was, err := fs.Thaw(v.staging, 0); err != nil || was {
		t.Errorf("the filesystem after the aborted cut: frozen %v, %v; want thawed, as its owner left it", was, err)
	}
	// Frozen again and left so, the retry is cut.
	staging.Store(nil)
	if err := fs.Freeze(v.staging, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "thawed-1", SourceVolumeId: v.vol.GetVolumeId()}); err != nil {
		t.Fatalf("the retry, with the filesystem frozen throughout: %v", err)
	}
	if was, err := fs.Thaw(v.staging, 0); err != nil || !was {
		t.Errorf("the filesystem after the retry: frozen %v, %v; want still frozen by its owner", was, err)
	}
}

// signal is a faultyClone hook that reports, without waiting, each clone
// of a "-b-" volume's file beginning: for a paused cut, once the writes
// are paused.
func signal(c chan<- struct{}) func() {
	return func() {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

func waitSignal(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(60 * time.Second):
		t.Fatalf("waited a minute for %s", what)
	}
}

// TestSnapshotJournalResumedAtStart: a daemon that stopped while it held a
// snapshot's pause (here: its journal, and the filesystem it names left
// frozen) resumes the writes at its next start and drops the journal; a
// cut the attempt put in place (made while paused) stays for the retry.
func TestSnapshotJournalResumedAtStart(t *testing.T) {
	clones := make(chan struct{}, 1)
	d := faultyLoopfileDaemon(t, t.TempDir(), signal(clones), 30*time.Second)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "held-b", false)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	dev, err := fs.DeviceOf(v.staging)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Freeze(v.staging, dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Thaw(v.staging, dev) })
	j, err := quiesce.OpenJournals(filepath.Join(d.cfg.StateDir, "quiesce-snapshots"), nil)
	if err != nil {
		t.Fatal(err)
	}
	id := v.vol.GetVolumeId()
	if err := j.Write(quiesce.Journal{Group: "held-1", Sources: []string{id},
		Targets: []quiesce.Target{{Kind: quiesce.Filesystem, Path: v.staging, Dev: dev, Volume: id}}}); err != nil {
		t.Fatal(err)
	}
	d.restart(t)
	if was, err := fs.Thaw(v.staging, dev); err != nil || was {
		t.Fatalf("after the start: frozen %v, %v; want thawed by the start", was, err)
	}
	if js, err := j.All(); err != nil || len(js) != 0 {
		t.Fatalf("journals after the start: %v, %v; want none", js, err)
	}
	select {
	case <-clones:
		t.Fatal("the start asked the backend to cut the snapshot again: a paused attempt's cut needs no removal")
	default:
	}
	if _, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "held-1", SourceVolumeId: id}); err != nil {
		t.Fatalf("the retry: %v", err)
	}
}

// publishedVolume creates a loopfile mount volume, stages and publishes it.
func publishedVolume(t *testing.T, d *daemon, name string) *loopVolume {
	t.Helper()
	ctx := callCtx(t)
	v := newLoopVolume(t, d, name, false)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSnapshotOfBlockVolumeInUseHasItsWrites: a raw block volume in use
// cannot be paused, but what the workload wrote to it before the call,
// still only in the device's page cache (the workload holds the device
// open, so no close wrote it out), is in the snapshot: of its own, and as
// a group's member once unpublished (the workload still holding the
// device). Unflushed, the cut of the volume's file missed it.
func TestSnapshotOfBlockVolumeInUseHasItsWrites(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	want := bytes.Repeat([]byte("written-before-the-snapshot;"), 4096/28+1)[:4096]
	for _, group := range []bool{false, true} {
		name := "inuse-blk"
		if group {
			name = "inuse-grp"
		}
		v := newLoopVolume(t, d, name, true)
		if err := v.stage(ctx, d); err != nil {
			t.Fatal(err)
		}
		if err := v.publish(ctx, d); err != nil {
			t.Fatal(err)
		}
		dev := openDevice(t, v.target)
		defer dev.Close()
		if _, err := dev.WriteAt(want, 1<<20); err != nil {
			t.Fatal(err)
		}
		pattern := filepath.Join(filepath.Dir(v.file), "*.snap")
		before, _ := filepath.Glob(pattern)
		if group {
			if err := v.unpublishAt(ctx, d, v.target); err != nil {
				t.Fatal(err)
			}
			if _, err := groupSnapshot(ctx, t, d, name+"-1", v); err != nil {
				t.Fatal(err)
			}
		} else if _, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name + "-1", SourceVolumeId: v.vol.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
		after, err := filepath.Glob(pattern)
		snaps := slices.DeleteFunc(after, func(f string) bool { return slices.Contains(before, f) })
		if err != nil || len(snaps) != 1 {
			t.Fatalf("new snapshot files %v, %v; want the one of %s", snaps, err, name)
		}
		got := make([]byte, len(want))
		if f, err := os.Open(snaps[0]); err != nil {
			t.Fatal(err)
		} else if _, err := f.ReadAt(got, 1<<20); err != nil {
			f.Close()
			t.Fatal(err)
		} else {
			f.Close()
		}
		if !bytes.Equal(got, want) {
			t.Errorf("group %v: the snapshot lacks what the workload wrote to the device before the call: read %q…", group, got[:32])
		}
	}
}

// openDevice opens the block device published at target by its own node,
// so that the publication can go while the device stays open.
func openDevice(t *testing.T, target string) *os.File {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		t.Fatal(err)
	}
	uevent, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	if err != nil {
		t.Fatal(err)
	}
	_, name, ok := strings.Cut(string(uevent), "DEVNAME=")
	if !ok {
		t.Fatalf("no DEVNAME in the uevent of %s: %q", target, uevent)
	}
	name, _, _ = strings.Cut(name, "\n")
	f, err := os.OpenFile("/dev/"+name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestCloneOfVolumeInUseHasItsWrites: a clone of a volume in use on this
// node holds what the workload wrote before the call and the kernel still
// cached: a file in the filesystem's page cache, data in a raw device's.
// Unflushed, the copy of the volume's file (this pool has no reflinks)
// missed both.
func TestCloneOfVolumeInUseHasItsWrites(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	fromVolume := func(id string) *csi.VolumeContentSource {
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}

	v := publishedVolume(t, d, "clone-src")
	if err := os.WriteFile(filepath.Join(v.target, "before"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	withVolumeFrom(t, d, v.vol.GetVolumeId(), fromVolume(v.vol.GetVolumeId()), "clone-of-mount", func(target string) {
		if b, err := os.ReadFile(filepath.Join(target, "before")); err != nil || string(b) != "before" {
			t.Errorf("the clone holds %q, %v for the file written (not synced) before the call, want %q", b, err, "before")
		}
	})

	blk := newLoopVolume(t, d, "clone-blk", true)
	if err := blk.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := blk.publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	dev := openDevice(t, blk.target)
	defer dev.Close()
	want := bytes.Repeat([]byte("written-before-the-clone;"), 4096/25+1)[:4096]
	if _, err := dev.WriteAt(want, 1<<20); err != nil {
		t.Fatal(err)
	}
	clone := createVolume(t, d, &csi.CreateVolumeRequest{
		Name: "clone-of-blk", CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes},
		Parameters:          map[string]string{backendParam: "loopfile"},
		VolumeCapabilities:  []*csi.VolumeCapability{loopCapability(true)},
		VolumeContentSource: fromVolume(blk.vol.GetVolumeId()),
	})
	got := make([]byte, len(want))
	if f, err := os.Open(clone.GetVolumeContext()["path"]); err != nil {
		t.Fatal(err)
	} else if _, err := f.ReadAt(got, 1<<20); err != nil {
		f.Close()
		t.Fatal(err)
	} else {
		f.Close()
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the clone lacks what the workload wrote to the raw device before the call: read %q…", got[:32])
	}
}

// TestSnapshotPauseTakesAnInstanceFirst: a snapshot of a volume in use
// waits for an instance of its module before it pauses the volume's
// writes, not while they are paused. Here the module's only instance is
// busy with another volume's hung cut: the second snapshot waits, its
// volume's writes go on meanwhile, and it fails UNAVAILABLE once the
// module stays busy. Before, it froze the filesystem first, and the
// workload stalled for as long as the call waited.
func TestSnapshotPauseTakesAnInstanceFirst(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	ctl := t.TempDir()
	cutting := make(chan struct{}, 1)
	const acquire = 3 * time.Second
	d := startDaemon(t, daemonOptions{
		backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go),
		hostcalls: []string{"file", "loop"}, hostCalls: []hostcalls.Func{faultyClone(t, ctl, signal(cutting)), faultyRemove(t, ctl)},
		freezeTimeout: 30 * time.Second, limits: config.Limits{PoolSize: 1, AcquireTimeout: acquire},
	})
	releaseUnder(t, filepath.Dir(d.pool))
	busy, free := publishedVolume(t, d, "busy-b"), publishedVolume(t, d, "free")
	hang := hangCuts(t, ctl)
	first := snapshotAsync(t, d, "busy-1", busy)
	waitSignal(t, cutting, "the first cut to hold the module's only instance")
	for _, group := range []bool{false, true} {
		second := make(chan error, 1)
		start := time.Now()
		go func() {
			var err error
			if group {
				_, err = groupSnapshot(callCtx(t), t, d, "free-g", free)
			} else {
				_, err = d.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "free-1", SourceVolumeId: free.vol.GetVolumeId()})
			}
			second <- err
		}()
		time.Sleep(300 * time.Millisecond)
		wrote := make(chan error, 1)
		go func() { wrote <- os.WriteFile(filepath.Join(free.target, "w"), []byte("w"), 0o644) }()
		select {
		case err := <-wrote:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(acquire / 2):
			t.Errorf("group %v: a write to the volume stalled while its snapshot waited for an instance: its writes were paused during the wait", group)
			<-wrote
		}
		err := <-second
		wantCode(t, err, codes.Unavailable, "busy")
		if d := time.Since(start); d < acquire {
			t.Errorf("group %v: the second snapshot failed after %s, before the acquire timeout", group, d)
		}
	}
	if j := journals(t, d); len(j) != 0 {
		t.Errorf("group snapshot journals after the busy attempt: %v", j)
	}
	if err := os.Remove(hang); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first snapshot: %v", err)
	}
	if j, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "quiesce-snapshots")); err != nil || len(j) != 0 {
		t.Errorf("snapshot journals after both calls: %v, %v; want none", j, err)
	}
}

// hangCuts makes faultyClone hang every cut of a "-b-" volume until the
// returned file is removed (at the latest when the test ends).
func hangCuts(t *testing.T, ctl string) string {
	t.Helper()
	hang := filepath.Join(ctl, "hang")
	touch(t, hang)
	t.Cleanup(func() { os.Remove(hang) })
	return hang
}

// snapshotAsync starts CreateSnapshot name of v and returns its result.
func snapshotAsync(t *testing.T, d *daemon, name string, v *loopVolume) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := d.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.vol.GetVolumeId()})
		errc <- err
	}()
	return errc
}
