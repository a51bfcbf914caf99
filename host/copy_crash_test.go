package host_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// A daemon killed while CreateSnapshot or a restoring CreateVolume copies
// a localdir volume must not leave a partial copy that the CO's retry then
// adopts: the retry must answer a whole copy, and nothing of the killed
// copy may stay in the pool.

// scratchDir is the pools' scratch folder (hostcalls/internal/scratch).
const scratchDir = ".wasmcsi-tmp"

// fillTree writes n small files, each with its own contents, in folders
// of 100 below dir.
func fillTree(t *testing.T, dir string, n int) {
	t.Helper()
	for i := range n {
		sub := filepath.Join(dir, "d"+strconv.Itoa(i/100))
		if i%100 == 0 {
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		data := bytes.Repeat([]byte(strconv.Itoa(i)+"\n"), 512)
		if err := os.WriteFile(filepath.Join(sub, strconv.Itoa(i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// regularFiles returns the regular files below dir, relative to it,
// skipping the folders in skip. Entries that vanish during the walk (a
// copy in progress removes nothing, but a sweep may) are passed over.
func regularFiles(dir string, skip ...string) []string {
	var out []string
	filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if e.IsDir() && slices.Contains(skip, path) {
			return filepath.SkipDir
		}
		if e.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// sameTree checks that dst holds exactly src's regular files, each with the
// same contents.
func sameTree(t *testing.T, src, dst string) {
	t.Helper()
	want, got := regularFiles(src), regularFiles(dst)
	if len(got) != len(want) {
		t.Fatalf("%s holds %d files, its source %s %d: a partial copy", dst, len(got), src, len(want))
	}
	for _, rel := range want {
		a, err := os.ReadFile(filepath.Join(src, rel))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dst, rel))
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s in the copy differs from its source (%v)", rel, err)
		}
	}
}

// killDuringCopy runs call against the daemon process p and kills the
// daemon once at least 100 files of a copy have appeared in pool outside
// the folders in skip (the copy's sources). The copy must still have been
// under way at the kill: fewer than want files copied.
func killDuringCopy(t *testing.T, p *procDaemon, pool string, want int, call func(ctx context.Context) error, skip ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for len(regularFiles(pool, skip...)) < 100 {
		select {
		case err := <-done:
			t.Fatalf("the call ended (%v) before its copy was seen under way", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no copy under way after a minute")
		}
		time.Sleep(time.Millisecond)
	}
	p.kill(t)
	if err := <-done; err == nil {
		t.Fatal("the call succeeded although its daemon was killed")
	}
	if n := len(regularFiles(pool, skip...)); n >= want {
		t.Fatalf("the copy was complete (%d files) when the daemon died: make the volume larger", n)
	}
}

// deleteAtEnd deletes the volume or snapshot id through p when the test
// ends, if the daemon still runs.
func deleteAtEnd(t *testing.T, p *procDaemon, id string, snapshot bool) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if snapshot {
			p.controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
		} else {
			p.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		}
	})
}

// TestLocaldirCopyKilled kills the daemon while CreateSnapshot copies a
// volume, and again while CreateVolume restores the snapshot, and checks
// that the CO's retry after the restart answers a whole copy each time and
// that no temporary stays behind.
func TestLocaldirCopyKilled(t *testing.T) {
	const files = 3000
	p := newProcDaemon(t)
	pool := filepath.Join(p.dir, "pools", "localdir")
	vol, err := p.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: "copied", VolumeCapabilities: rwCaps()})
	if err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, p, vol.GetVolume().GetVolumeId(), false)
	src := vol.GetVolume().GetVolumeContext()["path"]
	fillTree(t, src, files)

	snapReq := &csi.CreateSnapshotRequest{Name: "copied-snap", SourceVolumeId: vol.GetVolume().GetVolumeId()}
	killDuringCopy(t, p, pool, files, func(ctx context.Context) error {
		_, err := p.controller().CreateSnapshot(ctx, snapReq)
		return err
	}, src)
	p.start(t)
	snap, err := p.controller().CreateSnapshot(callCtx(t), snapReq)
	if err != nil {
		t.Fatalf("CreateSnapshot retried after the kill: %v", err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	deleteAtEnd(t, p, snapID, true)
	_, local, _ := strings.Cut(snapID, ":")
	snapDir := filepath.Join(pool, local)
	sameTree(t, src, snapDir)
	if _, err := os.Stat(filepath.Join(pool, scratchDir)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after the retried snapshot the pool's scratch folder is still there (%v)", err)
	}

	restoreReq := &csi.CreateVolumeRequest{
		Name: "restored", VolumeCapabilities: rwCaps(),
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID},
		}},
	}
	killDuringCopy(t, p, pool, files, func(ctx context.Context) error {
		_, err := p.controller().CreateVolume(ctx, restoreReq)
		return err
	}, src, snapDir)
	p.start(t)
	restored, err := p.controller().CreateVolume(callCtx(t), restoreReq)
	if err != nil {
		t.Fatalf("CreateVolume from the snapshot retried after the kill: %v", err)
	}
	deleteAtEnd(t, p, restored.GetVolume().GetVolumeId(), false)
	sameTree(t, src, restored.GetVolume().GetVolumeContext()["path"])
	if _, err := os.Stat(filepath.Join(pool, scratchDir)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after the retried restore the pool's scratch folder is still there (%v)", err)
	}
}

// TestLoopfileCloneKilled kills the daemon while CreateSnapshot copies a
// loopfile volume on a pool without reflinks (tmpfs: the copy that keeps
// holes) and checks that the retry after the restart answers a whole copy
// and that the killed copy left nothing in the pool.
func TestLoopfileCloneKilled(t *testing.T) {
	p := newProcDaemon(t)
	pool := filepath.Join(p.dir, "pools", "loopfile")
	// Unmounted by newProcDaemon's cleanup, after the daemon stopped.
	if err := unix.Mount("tmpfs", pool, "tmpfs", 0, "size=1g"); err != nil {
		t.Fatal(err)
	}

	const size, data = 512 << 20, 256 << 20
	vol, err := p.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
		Name: "cloned", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{loopCapability(true)},
		Parameters:         map[string]string{backendParam: "loopfile"},
	})
	if err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, p, vol.GetVolume().GetVolumeId(), false)
	file := vol.GetVolume().GetVolumeContext()["path"]
	if filepath.Dir(file) != pool {
		t.Fatalf("volume file %s is not in the pool %s", file, pool)
	}
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < data; off += 1 << 20 {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(off>>20) | 1}, 1<<20), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	used := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(pool, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	before := used()

	snapReq := &csi.CreateSnapshotRequest{Name: "cloned-snap", SourceVolumeId: vol.GetVolume().GetVolumeId()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.controller().CreateSnapshot(ctx, snapReq)
		done <- err
	}()
	for deadline := time.Now().Add(time.Minute); used() < before+32<<20; {
		select {
		case err := <-done:
			t.Fatalf("CreateSnapshot ended (%v) before its copy was seen under way", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no copy under way after a minute")
		}
		time.Sleep(time.Millisecond)
	}
	p.kill(t)
	if err := <-done; err == nil {
		t.Fatal("CreateSnapshot succeeded although its daemon was killed")
	}
	if got := used(); got > before+1<<20 {
		t.Fatalf("the killed copy still takes %d bytes of the pool", got-before)
	}
	if left := regularFiles(pool); !slices.Equal(left, []string{filepath.Base(file)}) {
		t.Fatalf("pool after the kill holds %v, want only the volume's file", left)
	}

	p.start(t)
	snap, err := p.controller().CreateSnapshot(callCtx(t), snapReq)
	if err != nil {
		t.Fatalf("CreateSnapshot retried after the kill: %v", err)
	}
	deleteAtEnd(t, p, snap.GetSnapshot().GetSnapshotId(), true)
	left := regularFiles(pool)
	if len(left) != 2 {
		t.Fatalf("pool after the retry holds %v, want the volume's file and its snapshot", left)
	}
	a, err := os.ReadFile(filepath.Join(pool, left[0]))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(pool, left[1]))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("the retried snapshot differs from its volume")
	}
}
