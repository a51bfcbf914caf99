package host_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Group snapshots of loopfile volumes in use: two mount volumes, staged
// and published on this machine through a real daemon, take a stream of
// sequence-numbered records, alternately, each written and fdatasync'ed
// before the next one starts. A group snapshot must cut that stream at one
// point: restored, the two snapshots together hold records 0..n-1 for some
// n, and nothing else (RATIONALE.md, "Group snapshots").

func (d *daemon) groups() csi.GroupControllerClient { return csi.NewGroupControllerClient(d.conn) }

const recordSize = 16

// record is record n: n and its complement, so a torn or foreign block
// never reads as a record.
func record(n uint64) []byte {
	b := make([]byte, recordSize)
	binary.LittleEndian.PutUint64(b, n)
	binary.LittleEndian.PutUint64(b[8:], ^n)
	return b
}

// seqWriter appends record n to files[n%2], one record at a time.
type seqWriter struct {
	files   [2]*os.File
	written atomic.Int64 // records acknowledged (written and synced)
	longest atomic.Int64 // the longest one record took, in ns
	stop    chan struct{}
	done    chan error
	once    sync.Once
}

func startWriter(t *testing.T, dirs [2]string) *seqWriter {
	t.Helper()
	w := &seqWriter{stop: make(chan struct{}), done: make(chan error, 1)}
	for i, dir := range dirs {
		f, err := os.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		w.files[i] = f
	}
	go w.run()
	t.Cleanup(func() {
		if err := w.halt(); err != nil {
			t.Errorf("writer: %v", err)
		}
	})
	// Runs first: a writer blocked on a filesystem a failed test left
	// frozen would keep the cleanups that follow from unmounting it.
	t.Cleanup(func() {
		for _, dir := range dirs {
			fs.Thaw(dir, 0)
		}
	})
	return w
}

func (w *seqWriter) run() {
	defer func() {
		for _, f := range w.files {
			f.Close()
		}
	}()
	for n := uint64(0); ; n++ {
		select {
		case <-w.stop:
			w.done <- nil
			return
		default:
		}
		start := time.Now()
		f := w.files[n%2]
		if _, err := f.Write(record(n)); err != nil {
			w.done <- fmt.Errorf("record %d: %w", n, err)
			return
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			w.done <- fmt.Errorf("sync record %d: %w", n, err)
			return
		}
		if took := int64(time.Since(start)); took > w.longest.Load() {
			w.longest.Store(took)
		}
		w.written.Store(int64(n + 1))
	}
}

// halt stops the writer and waits for it.
func (w *seqWriter) halt() error {
	w.once.Do(func() { close(w.stop) })
	select {
	case err := <-w.done:
		w.done <- err // for a second halt
		return err
	case <-time.After(30 * time.Second):
		return errors.New("still blocked 30s after it was told to stop")
	}
}

// progress waits until the writer has acknowledged n more records.
func (w *seqWriter) progress(t *testing.T, n int64, within time.Duration) {
	t.Helper()
	from := w.written.Load()
	deadline := time.Now().Add(within)
	for w.written.Load() < from+n {
		if time.Now().After(deadline) {
			t.Fatalf("the writer made %d records of progress in %s, want %d", w.written.Load()-from, within, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stalled reports whether the writer made no progress for quiet.
func (w *seqWriter) stalled(quiet time.Duration) bool {
	from := w.written.Load()
	time.Sleep(quiet)
	return w.written.Load() == from
}

// waitStalled waits until the writer stalls (its filesystems are frozen).
func (w *seqWriter) waitStalled(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !w.stalled(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the writer never stalled within %s: writes were not paused", within)
		}
	}
}

// readRecords reads a log back: the records in order; a torn record at
// the end (a write the snapshot caught half-way) is left out.
func readRecords(t *testing.T, path string) []uint64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for off := 0; off+recordSize <= len(data); off += recordSize {
		n := binary.LittleEndian.Uint64(data[off:])
		if binary.LittleEndian.Uint64(data[off+8:]) != ^n {
			t.Errorf("%s: garbage at offset %d: %x", path, off, data[off:off+recordSize])
			break
		}
		out = append(out, n)
	}
	return out
}

// checkCut checks that the records restored from a and b are one prefix
// of the write stream, 0..n-1, and returns n. A holds the even records, B
// the odd ones, so A has as many records as B or one more; anything else
// means one snapshot holds a point of the stream the other does not.
func checkCut(t *testing.T, a, b []uint64) int {
	t.Helper()
	for i, n := range a {
		if n != uint64(2*i) {
			t.Errorf("A's record %d is %d, want %d", i, n, 2*i)
			break
		}
	}
	for i, n := range b {
		if n != uint64(2*i+1) {
			t.Errorf("B's record %d is %d, want %d", i, n, 2*i+1)
			break
		}
	}
	if d := len(a) - len(b); d != 0 && d != 1 {
		t.Errorf("the group holds %d records of A (up to record %d) and %d of B (up to record %d): "+
			"not one point of the write stream, which would leave A and B at most the one record in flight apart",
			len(a), 2*len(a)-2, len(b), 2*len(b)-1)
	}
	return len(a) + len(b)
}

// groupSnapshot cuts a group of vols and deletes it when the test ends.
func groupSnapshot(ctx context.Context, t *testing.T, d *daemon, name string, vols ...*loopVolume) (*csi.VolumeGroupSnapshot, error) {
	t.Helper()
	var ids []string
	for _, v := range vols {
		ids = append(ids, v.vol.GetVolumeId())
	}
	resp, err := d.groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: ids})
	if err != nil {
		return nil, err
	}
	g := resp.GetGroupSnapshot()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := d.groups().DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()}); err != nil {
			t.Errorf("delete group snapshot %s: %v", name, err)
		}
	})
	return g, nil
}

// memberOf returns the group's snapshot of volume v.
func memberOf(t *testing.T, g *csi.VolumeGroupSnapshot, v *loopVolume) *csi.Snapshot {
	t.Helper()
	for _, sn := range g.GetSnapshots() {
		if sn.GetSourceVolumeId() == v.vol.GetVolumeId() {
			return sn
		}
	}
	t.Fatalf("group %s has no snapshot of %s", g.GetGroupSnapshotId(), v.vol.GetVolumeId())
	return nil
}

// restoreRecords restores snapshot sn as a new volume, mounts it and reads
// its log; the restored volume is unmounted and deleted again.
func restoreRecords(t *testing.T, d *daemon, sn *csi.Snapshot, name string) (recs []uint64) {
	t.Helper()
	withRestored(t, d, sn, name, func(target string) { recs = readRecords(t, filepath.Join(target, "log")) })
	return recs
}

// withRestored restores snapshot sn as a new mount volume named name,
// stages and publishes it, calls read with its target path, and unmounts
// and deletes it again.
func withRestored(t *testing.T, d *daemon, sn *csi.Snapshot, name string, read func(target string)) {
	t.Helper()
	withVolumeFrom(t, d, sn.GetSnapshotId(), &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sn.GetSnapshotId()}}}, name, read)
}

// withVolumeFrom creates a mount volume named name from src (a snapshot
// or volume whose ID is srcID), stages and publishes it, calls read with
// its target, and takes it down again.
func withVolumeFrom(t *testing.T, d *daemon, srcID string, src *csi.VolumeContentSource, name string, read func(target string)) {
	t.Helper()
	ctx := callCtx(t)
	head, _, _ := strings.Cut(srcID, ":")
	backend, _, _ := strings.Cut(head, "@") // without the node tag
	vol := createVolume(t, d, &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes},
		Parameters:          map[string]string{backendParam: backend},
		VolumeCapabilities:  []*csi.VolumeCapability{loopCapability(false)},
		VolumeContentSource: src,
	})
	w := workDir(t)
	v := &loopVolume{vol: vol, file: vol.GetVolumeContext()["path"], staging: stagingPath(w, name), target: targetPath(w, name)}
	if err := v.stage(ctx, d); err != nil {
		t.Fatalf("stage restore %s: %v", name, err)
	}
	if err := v.publish(ctx, d); err != nil {
		t.Fatalf("publish restore %s: %v", name, err)
	}
	read(v.target)
	if err := v.unpublishAt(ctx, d, v.target); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}

// inUse creates two mount volumes, stages and publishes them, and starts
// a writer on them.
func inUse(t *testing.T, d *daemon, prefix string) (a, b *loopVolume, w *seqWriter) {
	t.Helper()
	ctx := callCtx(t)
	a, b = newLoopVolume(t, d, prefix+"-a", false), newLoopVolume(t, d, prefix+"-b", false)
	for _, v := range []*loopVolume{a, b} {
		if err := v.stage(ctx, d); err != nil {
			t.Fatal(err)
		}
		if err := v.publish(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, startWriter(t, [2]string{a.target, b.target})
}

// TestGroupSnapshotWriteOrder cuts groups of two volumes while a writer
// appends to both, restores each group and checks that it holds one
// prefix of the write stream. Cut member by member with the writes
// running, the second member holds records the first one lacks.
func TestGroupSnapshotWriteOrder(t *testing.T) {
	d := loopfileDaemon(t)
	a, b, w := inUse(t, d, "wo")
	for round := range 3 {
		w.progress(t, 50, 20*time.Second)
		start := time.Now()
		g, err := groupSnapshot(callCtx(t), t, d, fmt.Sprintf("wo-%d", round), a, b)
		if err != nil {
			t.Fatalf("group snapshot: %v", err)
		}
		took := time.Since(start)
		written := w.written.Load()
		for _, sn := range g.GetSnapshots() {
			if !sn.GetCreationTime().AsTime().Equal(g.GetCreationTime().AsTime()) {
				t.Errorf("member %s was taken at %v, the group at %v: they share one point in time", sn.GetSnapshotId(),
					sn.GetCreationTime().AsTime(), g.GetCreationTime().AsTime())
			}
		}
		w.progress(t, 10, 20*time.Second)
		ra := restoreRecords(t, d, memberOf(t, g, a), fmt.Sprintf("wo-%d-ra", round))
		rb := restoreRecords(t, d, memberOf(t, g, b), fmt.Sprintf("wo-%d-rb", round))
		n := checkCut(t, ra, rb)
		t.Logf("round %d: the group holds records 0..%d; %d were acknowledged when the call returned after %s",
			round, n-1, written, took.Round(time.Millisecond))
		if n == 0 {
			t.Errorf("round %d: the group holds none of the %d records written before it", round, written)
		}
	}
	if err := w.halt(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the longest a record took: %s", time.Duration(w.longest.Load()).Round(time.Microsecond))
}

// faultyClone wraps the file_clone host call. A clone whose source is a
// volume named "...-b" (its file is "<prefix>-b-<hash>.img") first calls
// hook, if set; then it fails while ctl/fail exists, and waits while
// ctl/hang exists, ignoring its deadline as a stuck copy would.
func faultyClone(t testing.TB, ctl string, hook func()) hostcalls.Func {
	real := defaultHostCall(t, abi.HostCallFileClone)
	f := real
	f.Call = func(ctx context.Context, env *hostcalls.Env, req []byte) ([]byte, error) {
		var r abi.FileCloneRequest
		if err := r.UnmarshalWire(req); err == nil && strings.Contains(filepath.Base(r.Source), "-b-") {
			if hook != nil {
				hook()
			}
			if _, err := os.Stat(filepath.Join(ctl, "fail")); err == nil {
				return nil, abi.Errorf(abi.ResourceExhausted, "injected: no room to clone %s", r.Source)
			}
			for start := time.Now(); time.Since(start) < 2*time.Minute; time.Sleep(20 * time.Millisecond) {
				if _, err := os.Stat(filepath.Join(ctl, "hang")); err != nil {
					break
				}
			}
		}
		return real.Call(ctx, env, req)
	}
	return f
}

// faultyRemove wraps the file_remove host call: removing a snapshot of a
// volume named "...-a" fails while ctl/failremove exists.
func faultyRemove(t testing.TB, ctl string) hostcalls.Func {
	real := defaultHostCall(t, abi.HostCallFileRemove)
	f := real
	f.Call = func(ctx context.Context, env *hostcalls.Env, req []byte) ([]byte, error) {
		var r abi.FileRequest
		if err := r.UnmarshalWire(req); err == nil && strings.HasSuffix(r.Path, ".snap") && strings.Contains(filepath.Base(r.Path), "-a-") {
			if _, err := os.Stat(filepath.Join(ctl, "failremove")); err == nil {
				return nil, abi.Errorf(abi.Unavailable, "injected: cannot remove %s", r.Path)
			}
		}
		return real.Call(ctx, env, req)
	}
	return f
}

func defaultHostCall(t testing.TB, name string) hostcalls.Func {
	t.Helper()
	calls, err := host.DefaultHostCalls(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return calls[name]
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// faultyLoopfileDaemon is loopfileDaemon with faultyClone.
func faultyLoopfileDaemon(t *testing.T, ctl string, hook func(), freeze time.Duration) *daemon {
	t.Helper()
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	d := startDaemon(t, daemonOptions{
		backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go),
		hostcalls: []string{"file", "loop"}, hostCalls: []hostcalls.Func{faultyClone(t, ctl, hook), faultyRemove(t, ctl)},
		freezeTimeout: freeze,
	})
	releaseUnder(t, filepath.Dir(d.pool))
	return d
}

func snapshotsOf(t *testing.T, d *daemon, v *loopVolume) int {
	t.Helper()
	resp, err := d.controller().ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{SourceVolumeId: v.vol.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.GetEntries())
}

func journals(t *testing.T, d *daemon) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "quiesce"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestGroupSnapshotMemberFailureResumesWrites: the second member's snapshot
// fails while both members' writes are paused; the call fails with the
// member's error, the writes resume, the first member's snapshot is
// removed again, and no journal stays.
func TestGroupSnapshotMemberFailureResumesWrites(t *testing.T) {
	ctl := t.TempDir()
	touch(t, filepath.Join(ctl, "fail"))
	var w atomic.Pointer[seqWriter]
	var pausedAtFailure atomic.Bool
	hook := func() {
		if sw := w.Load(); sw != nil {
			pausedAtFailure.Store(sw.stalled(300 * time.Millisecond))
		}
	}
	d := faultyLoopfileDaemon(t, ctl, hook, time.Minute)
	a, b, sw := inUse(t, d, "ge")
	w.Store(sw)
	sw.progress(t, 20, 20*time.Second)

	_, err := groupSnapshot(callCtx(t), t, d, "ge", a, b)
	wantCode(t, err, codes.ResourceExhausted, "injected")
	if !pausedAtFailure.Load() {
		t.Error("the writes were not paused while the members were cut")
	}
	sw.progress(t, 20, 5*time.Second)
	for _, v := range []*loopVolume{a, b} {
		if n := snapshotsOf(t, d, v); n != 0 {
			t.Errorf("%d snapshots of %s remain after the failed group", n, v.vol.GetVolumeId())
		}
	}
	if j := journals(t, d); len(j) != 0 {
		t.Errorf("journals remain after the failed group: %v", j)
	}

	// With the fault gone the same group succeeds.
	if err := os.Remove(filepath.Join(ctl, "fail")); err != nil {
		t.Fatal(err)
	}
	g, err := groupSnapshot(callCtx(t), t, d, "ge", a, b)
	if err != nil {
		t.Fatal(err)
	}
	sw.progress(t, 10, 20*time.Second)
	checkCut(t, restoreRecords(t, d, memberOf(t, g, a), "ge-ra"), restoreRecords(t, d, memberOf(t, g, b), "ge-rb"))
}

// TestGroupSnapshotFreezeDeadline: the second member's snapshot hangs
// past the freeze timeout, ignoring its deadline; the writes resume at the
// timeout while it still hangs, the call then fails with
// DEADLINE_EXCEEDED, and the first member's snapshot is removed again.
func TestGroupSnapshotFreezeDeadline(t *testing.T) {
	ctl := t.TempDir()
	const freeze = time.Second
	d := faultyLoopfileDaemon(t, ctl, nil, freeze)
	a, b, w := inUse(t, d, "gd")
	w.progress(t, 20, 20*time.Second)
	hang := hangCuts(t, ctl)

	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		_, err := groupSnapshot(callCtx(t), t, d, "gd", a, b)
		errc <- err
	}()
	w.waitStalled(t, 30*time.Second)
	stalled := time.Since(start)
	w.progress(t, 10, freeze+15*time.Second)
	resumed := time.Since(start)
	select {
	case err := <-errc:
		t.Fatalf("the group call returned (%v) before the hung snapshot: the writes must resume on their own", err)
	default:
	}
	if err := os.Remove(hang); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	wantCode(t, err, codes.DeadlineExceeded)
	t.Logf("writes stalled by %s, resumed by %s, the call failed after %s: %v", stalled.Round(time.Millisecond),
		resumed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), err)
	if resumed-stalled > freeze+5*time.Second {
		t.Errorf("the writes resumed %s after they were seen paused, long after the %s freeze timeout", resumed-stalled, freeze)
	}
	for _, v := range []*loopVolume{a, b} {
		if n := snapshotsOf(t, d, v); n != 0 {
			t.Errorf("%d snapshots of %s remain after the group timed out", n, v.vol.GetVolumeId())
		}
	}
	if j := journals(t, d); len(j) != 0 {
		t.Errorf("journals remain after the group timed out: %v", j)
	}
}

// TestGroupSnapshotRepeat: a repeat with the same name answers the same
// group; other parameters or other volumes are ALREADY_EXISTS.
func TestGroupSnapshotRepeat(t *testing.T) {
	d := loopfileDaemon(t)
	a, b, c := newLoopVolume(t, d, "gr-a", false), newLoopVolume(t, d, "gr-b", false), newLoopVolume(t, d, "gr-c", false)
	ctx := callCtx(t)
	params := map[string]string{"csi.storage.k8s.io/volumegroupsnapshot/name": "g1"}
	req := &csi.CreateVolumeGroupSnapshotRequest{Name: "gr", SourceVolumeIds: []string{a.vol.GetVolumeId(), b.vol.GetVolumeId()}, Parameters: params}
	first, err := d.groups().CreateVolumeGroupSnapshot(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.groups().DeleteVolumeGroupSnapshot(context.Background(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: first.GetGroupSnapshot().GetGroupSnapshotId()})
	})
	again, err := d.groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "gr",
		SourceVolumeIds: []string{b.vol.GetVolumeId(), a.vol.GetVolumeId()}, Parameters: params})
	if err != nil {
		t.Fatalf("repeat: %v", err)
	}
	if again.GetGroupSnapshot().GetGroupSnapshotId() != first.GetGroupSnapshot().GetGroupSnapshotId() ||
		len(again.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Errorf("repeat answered %v, want %v", again.GetGroupSnapshot(), first.GetGroupSnapshot())
	}
	for _, tc := range []struct {
		what   string
		srcs   []string
		params map[string]string
	}{
		{"other parameters", req.SourceVolumeIds, map[string]string{"csi.storage.k8s.io/volumegroupsnapshot/name": "g2"}},
		{"no parameters", req.SourceVolumeIds, nil},
		{"another volume", []string{a.vol.GetVolumeId(), c.vol.GetVolumeId()}, params},
		{"one volume more", []string{a.vol.GetVolumeId(), b.vol.GetVolumeId(), c.vol.GetVolumeId()}, params},
	} {
		_, err := d.groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "gr", SourceVolumeIds: tc.srcs, Parameters: tc.params})
		if status.Code(err) != codes.AlreadyExists {
			t.Errorf("%s: %v, want ALREADY_EXISTS", tc.what, err)
		}
	}
}

// TestGroupSnapshotRefusesWhatCannotPause: members whose writes cannot be
// paused make the group FAILED_PRECONDITION while they are published
// writable (a loop device published as a raw block device; a localdir
// directory) and are fine once unpublished; a daemon that serves only the
// controller refuses node-local volumes, whose use it cannot see.
func TestGroupSnapshotRefusesWhatCannotPause(t *testing.T) {
	requireRoot(t)
	o := localdirOptions(t)
	o.more = []daemonModule{{name: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go), hostcalls: []string{"file", "loop"}}}
	d := startDaemon(t, o)
	releaseUnder(t, filepath.Dir(d.pool))
	ctx := callCtx(t)

	mnt := createVolume(t, d, &csi.CreateVolumeRequest{Name: "rp-mount", Parameters: map[string]string{backendParam: "loopfile"},
		CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes}, VolumeCapabilities: []*csi.VolumeCapability{loopCapability(false)}})
	blk := createVolume(t, d, &csi.CreateVolumeRequest{Name: "rp-block", Parameters: map[string]string{backendParam: "loopfile"},
		CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes}, VolumeCapabilities: []*csi.VolumeCapability{loopCapability(true)}})
	dir := createVolume(t, d, &csi.CreateVolumeRequest{Name: "rp-dir"})
	w := workDir(t)
	vols := map[string]*loopVolume{
		"mount": {vol: mnt, staging: stagingPath(w, "m"), target: targetPath(w, "m")},
		"block": {vol: blk, block: true, staging: stagingPath(w, "b"), target: targetPath(w, "b")},
		"dir":   {vol: dir, staging: stagingPath(w, "d"), target: targetPath(w, "d")},
	}
	dirCap := rwCap
	for name, v := range vols {
		c := loopCapability(v.block)
		if name == "dir" {
			c = dirCap
		}
		if _, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging, VolumeCapability: c}); err != nil {
			t.Fatalf("stage %s: %v", name, err)
		}
		if _, err := d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: c}); err != nil {
			t.Fatalf("publish %s: %v", name, err)
		}
	}
	group := func(name string, members ...string) error {
		var ids []string
		for _, m := range members {
			ids = append(ids, vols[m].vol.GetVolumeId())
		}
		resp, err := d.groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: ids})
		if err == nil {
			t.Cleanup(func() {
				d.groups().DeleteVolumeGroupSnapshot(context.Background(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: resp.GetGroupSnapshot().GetGroupSnapshotId()})
			})
		}
		return err
	}
	wantCode(t, group("rp-1", "mount", "block"), codes.FailedPrecondition, vols["block"].vol.GetVolumeId(), "raw block device")
	wantCode(t, group("rp-2", "dir", "mount"), codes.FailedPrecondition, vols["dir"].vol.GetVolumeId(), "directory")
	if err := group("rp-3", "mount"); err != nil {
		t.Fatalf("a published mount volume alone: %v", err)
	}
	for _, name := range []string{"block", "dir"} {
		if _, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vols[name].vol.GetVolumeId(), TargetPath: vols[name].target}); err != nil {
			t.Fatal(err)
		}
	}
	if err := group("rp-4", "mount", "block"); err != nil {
		t.Fatalf("a mount volume and an unpublished block volume: %v", err)
	}
	if err := group("rp-5", "mount", "dir"); err != nil {
		t.Fatalf("a mount volume and an unpublished directory volume: %v", err)
	}
	if j := journals(t, d); len(j) != 0 {
		t.Errorf("journals remain: %v", j)
	}

	// The same records served by a controller-only daemon.
	d.stop()
	d.cfg.Role = config.RoleController
	d.start(t)
	wantCode(t, group("rp-6", "mount", "block"), codes.FailedPrecondition, "only the controller")
	d.stop()
	d.cfg.Role = config.RoleAll
	d.start(t)
	ctx = callCtx(t)
	if _, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: mnt.GetVolumeId(), TargetPath: vols["mount"].target}); err != nil {
		t.Fatal(err)
	}
	for name, v := range vols {
		if _, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging}); err != nil {
			t.Errorf("unstage %s: %v", name, err)
		}
	}
}

// TestGroupSnapshotUndoneLater: an attempt whose undo fails (the first
// member's snapshot cannot be removed after the second one failed) leaves
// its journal, and the group's next attempt removes what is left before it
// cuts a new group.
func TestGroupSnapshotUndoneLater(t *testing.T) {
	ctl := t.TempDir()
	d := faultyLoopfileDaemon(t, ctl, nil, time.Minute)
	a, b, w := inUse(t, d, "gu")
	w.progress(t, 20, 20*time.Second)
	touch(t, filepath.Join(ctl, "fail"))
	touch(t, filepath.Join(ctl, "failremove"))
	_, err := groupSnapshot(callCtx(t), t, d, "gu", a, b)
	wantCode(t, err, codes.ResourceExhausted, "injected")
	if n := snapshotsOf(t, d, a); n != 1 {
		t.Fatalf("A has %d snapshots after its removal failed, want 1", n)
	}
	if j := journals(t, d); len(j) != 1 {
		t.Fatalf("journals after an undo that failed: %v, want the attempt's", j)
	}
	os.Remove(filepath.Join(ctl, "fail"))
	os.Remove(filepath.Join(ctl, "failremove"))
	w.progress(t, 20, 20*time.Second)
	g, err := groupSnapshot(callCtx(t), t, d, "gu", a, b)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if n := snapshotsOf(t, d, a); n != 1 {
		t.Errorf("A has %d snapshots after the retry, want only the new group's", n)
	}
	if j := journals(t, d); len(j) != 0 {
		t.Errorf("journals after the retry: %v", j)
	}
	w.progress(t, 10, 20*time.Second)
	checkCut(t, restoreRecords(t, d, memberOf(t, g, a), "gu-ra"), restoreRecords(t, d, memberOf(t, g, b), "gu-rb"))
}

// children returns the process IDs of process pid's children.
func children(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, task := range tasks {
		data, err := os.ReadFile(task)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// TestGroupSnapshotDaemonKilledWhileFrozen kills the daemon (the real
// binary) with SIGKILL while a group snapshot holds its members' writes:
// its guardian resumes them. Then it kills the daemon and the guardian
// together: the next start resumes them from the journal. Each start
// undoes what the interrupted attempt cut, so that the group's next
// attempt cuts a new group at one point of the stream instead of adopting
// a member the dead attempt had cut. The group's third member is the slow
// fixture, whose snapshot hangs while the daemon is configured so: the
// daemon dies while it runs, after the two loopfile members were cut and
// recorded.
func TestGroupSnapshotDaemonKilledWhileFrozen(t *testing.T) {
	p := newProcDaemon(t)
	d := &daemon{conn: p.conn, cfg: &config.Config{StateDir: filepath.Join(p.dir, "state")}}
	restart := func(slow string) {
		t.Helper()
		p.slow = slow
		p.start(t)
		d.conn = p.conn
	}
	p.stop(t)
	restart("hang")
	a, b, w := inUse(t, d, "kl")
	slow := createVolume(t, d, &csi.CreateVolumeRequest{Name: "kl-s", Parameters: map[string]string{backendParam: "slow"}})
	members := []*loopVolume{a, b, {vol: slow}}
	w.progress(t, 20, 20*time.Second)

	// The daemon dies; its guardian resumes the writes.
	go groupSnapshot(context.Background(), t, d, "kl-1", members...)
	w.waitStalled(t, 20*time.Second)
	killed := time.Now()
	p.kill(t)
	w.progress(t, 10, 5*time.Second)
	t.Logf("the guardian resumed the writes %s after the daemon was killed", time.Since(killed).Round(time.Millisecond))
	restart("")
	if n := snapshotsOf(t, d, a); n != 0 {
		t.Errorf("%d snapshots of A remain from the interrupted attempt after a restart", n)
	}
	if j := journals(t, d); len(j) != 0 {
		t.Errorf("journals after a restart: %v", j)
	}

	// The daemon and its guardian die together; the next start resumes
	// the writes from the journal.
	p.stop(t)
	restart("hang")
	go groupSnapshot(context.Background(), t, d, "kl-2", members...)
	w.waitStalled(t, 20*time.Second)
	before := w.written.Load()
	guards := children(t, p.Pid())
	if len(guards) != 1 {
		t.Fatalf("the daemon has %d child processes, want its one guardian: %v", len(guards), guards)
	}
	if err := syscall.Kill(guards[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.kill(t)
	if !w.stalled(time.Second) {
		t.Fatal("the writes resumed with the daemon and the guardian both dead: nothing was frozen")
	}
	restarted := time.Now()
	restart("")
	w.progress(t, 10, 5*time.Second)
	t.Logf("the restarted daemon resumed the writes; it was serving %s after it was started", time.Since(restarted).Round(time.Millisecond))
	if n := snapshotsOf(t, d, a); n != 0 {
		t.Errorf("%d snapshots of A remain from the interrupted attempt after a restart", n)
	}

	// The groups' next attempts cut new groups at one point of the stream.
	for _, name := range []string{"kl-2", "kl-1"} {
		g, err := groupSnapshot(callCtx(t), t, d, name, members...)
		if err != nil {
			t.Fatalf("retry of %s: %v", name, err)
		}
		w.progress(t, 10, 20*time.Second)
		ra := restoreRecords(t, d, memberOf(t, g, a), name+"-ra")
		rb := restoreRecords(t, d, memberOf(t, g, b), name+"-rb")
		if n := checkCut(t, ra, rb); int64(n) <= before {
			t.Errorf("the retried group %s holds %d records, no more than the %d written before the interrupted attempt", name, n, before)
		}
	}
	if n := snapshotsOf(t, d, a); n != 2 {
		t.Errorf("A has %d snapshots, want the 2 of the retried groups", n)
	}
	if j := journals(t, d); len(j) != 0 {
		t.Errorf("journals left: %v", j)
	}
}
