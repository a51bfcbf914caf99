package host_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/host/state"
)

// These tests run the real daemon binary (procDaemon), kill it where a
// crash cuts a controller call short, and check what start-up's replay
// (replay.go) makes of the logged creates and the marked deletions: the
// volume as the CO was last told, never an older request of it, and no
// copy that lost its source.

const mib = 1 << 20

// openRecords opens the state of a stopped or killed daemon.
func openRecords(t *testing.T, p *procDaemon) *state.Store {
	t.Helper()
	s, err := state.Open(filepath.Join(p.dir, "state", "wasmcsi.db"))
	if err != nil {
		t.Fatalf("open the records: %v", err)
	}
	return s
}

// loggedIntents returns the keys of the creates a stopped daemon left
// logged.
func loggedIntents(t *testing.T, p *procDaemon) []string {
	t.Helper()
	s := openRecords(t, p)
	defer s.Close()
	in, err := s.ListIntents()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, i := range in {
		keys = append(keys, i.Key)
	}
	return keys
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func (p *procDaemon) expand(t *testing.T, id string, bytes int64) (*csi.ControllerExpandVolumeResponse, error) {
	return p.controller().ControllerExpandVolume(callCtx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: bytes},
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
	})
}

// TestExpandCutOffBeforeRecordKeepsVolume kills the daemon while a
// ControllerExpandVolume of a volume created a moment before runs, the
// moment the module grew the volume's file: the create's record was
// written without waiting, so an expansion that changes the storage
// first must make it durable, or start-up has only the logged create
// (whose limit the grown file exceeds) to rebuild it from, and the volume
// the CO was told of is gone while its file stays. The CO's retry of the
// expansion must succeed and nothing may leak.
func TestExpandCutOffBeforeRecordKeepsVolume(t *testing.T) {
	p := newProcDaemon(t)
	pool := p.Pool("loopfile")
	cut := 0
	for try := 0; try < 10 && cut < 2; try++ {
		name := fmt.Sprintf("grown-%d", try)
		resp, err := p.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
			Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mib, LimitBytes: 16 * mib},
			VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
			Parameters:         map[string]string{backendParam: "loopfile"},
		})
		if err != nil {
			t.Fatal(err)
		}
		id, file := resp.GetVolume().GetVolumeId(), resp.GetVolume().GetVolumeContext()["path"]
		in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.InotifyAddWatch(in, pool, unix.IN_MODIFY); err != nil {
			unix.Close(in)
			t.Fatal(err)
		}
		pid := p.Pid()
		done := make(chan error, 1)
		go func() { _, err := p.expand(t, id, 32*mib); done <- err }()
		waitEntry(t, in) // the module's resize
		syscall.Kill(pid, syscall.SIGKILL)
		unix.Close(in)
		if err := <-done; err != nil {
			cut++
		}
		p.kill(t)
		p.start(t)

		got, err := p.expand(t, id, 32*mib)
		if err != nil {
			t.Fatalf("try %d: the CO's retry of the expansion: %v", try, err)
		}
		if got.GetCapacityBytes() < 32*mib || fileSize(t, file) < 32*mib {
			t.Errorf("try %d: expanded to %d bytes, file %d bytes", try, got.GetCapacityBytes(), fileSize(t, file))
		}
		if listed := p.listedOf(t, "loopfile"); !slices.Equal(listed, []string{id}) {
			t.Errorf("try %d: listed %v, want [%s]", try, listed, id)
		}
		if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
		if e := poolEntries(t, pool); len(e) != 0 {
			t.Fatalf("try %d: pool holds %v after the volume's deletion", try, e)
		}
	}
	if cut == 0 {
		t.Fatal("no kill landed before ControllerExpandVolume answered")
	}
}

// TestReplayedCreateKeepsExpansion kills the daemon right after a
// ControllerExpandVolume answered for a volume whose create is still
// logged (its drop waits for the settler): start-up's replay of the
// create must bring the volume to its record (the expanded capacity), not
// to the logged request, whose limit the expanded file exceeds, and
// finish: loopfile's file keeps its size and nothing stays logged.
func TestReplayedCreateKeepsExpansion(t *testing.T) {
	p := newProcDaemon(t)
	for try := 0; ; try++ {
		if try == 5 {
			t.Fatal("the create's intent was never still logged when the expansion answered")
		}
		name := fmt.Sprintf("expanded-%d", try)
		resp, err := p.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
			Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes, LimitBytes: loopfileVolumeBytes},
			VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
			Parameters:         map[string]string{backendParam: "loopfile"},
		})
		if err != nil {
			t.Fatal(err)
		}
		v := resp.GetVolume()
		if _, err := p.expand(t, v.GetVolumeId(), 2*loopfileVolumeBytes); err != nil {
			t.Fatal(err)
		}
		p.kill(t)
		if !slices.Contains(loggedIntents(t, p), state.VolumeIntentKey(name)) {
			// The settler was quicker than the expansion: try again.
			p.start(t)
			continue
		}
		p.start(t)
		p.stop(t)
		if left := loggedIntents(t, p); len(left) != 0 {
			t.Errorf("start-up left %v logged", left)
		}
		s := openRecords(t, p)
		rec, err := s.GetVolume(v.GetVolumeId())
		s.Close()
		if err != nil || rec.CapacityBytes != 2*loopfileVolumeBytes {
			t.Errorf("record after the replay: %+v, %v; want %d bytes", rec, err, 2*loopfileVolumeBytes)
		}
		if got := fileSize(t, v.GetVolumeContext()["path"]); got != 2*loopfileVolumeBytes {
			t.Errorf("volume file has %d bytes after the replay, want %d", got, 2*loopfileVolumeBytes)
		}
		p.start(t)
		if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
		return
	}
}

// TestCopyOutlivesItsSourceDeletion restores a volume from a snapshot
// and clones a volume, deletes the snapshot and the clone's source at
// once (within the settle delay), kills the daemon and does to the pool
// what a power loss may do to the changes whose sync was still to come
// (a copy still logged loses its file, a deletion not settled gets its
// source back). Start-up must leave each copy listed with its source's
// data, and the sources gone.
func TestCopyOutlivesItsSourceDeletion(t *testing.T) {
	p := newProcDaemon(t)
	pool := p.Pool("loopfile")
	src, err := p.createVolume(callCtx(t), "source", "loopfile")
	if err != nil {
		t.Fatal(err)
	}
	token := []byte("written before the copies")
	writeAt := func(path string) {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(token, 0); err != nil {
			t.Fatal(err)
		}
	}
	writeAt(src.GetVolumeContext()["path"])
	before := poolEntries(t, pool)
	snap, err := p.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	var snapFile string
	for _, e := range poolEntries(t, pool) {
		if !slices.Contains(before, e) {
			snapFile = filepath.Join(pool, e)
		}
	}
	saved := map[string][]byte{}
	for _, f := range []string{snapFile, src.GetVolumeContext()["path"]} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		saved[f] = b
	}
	p.stop(t) // everything so far settled
	p.start(t)

	blk := []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	restore, err := p.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
		Name: "restore", CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes}, VolumeCapabilities: blk,
		Parameters:          map[string]string{backendParam: "loopfile"},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	clone, err := p.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
		Name: "clone", CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes}, VolumeCapabilities: blk,
		Parameters:          map[string]string{backendParam: "loopfile"},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: src.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	p.kill(t)

	// The power loss: a copy whose create is still logged had its pool
	// entry unsynced, and loses it; a source marked deleting (whose
	// record the settler has not removed) had its unlink unsynced, and
	// gets its file back.
	s := openRecords(t, p)
	logged, err := s.ListIntents()
	if err != nil {
		t.Fatal(err)
	}
	copies := map[string]*csi.Volume{state.VolumeIntentKey("restore"): restore.GetVolume(), state.VolumeIntentKey("clone"): clone.GetVolume()}
	for _, in := range logged {
		if v := copies[in.Key]; v != nil {
			if err := os.Remove(v.GetVolumeContext()["path"]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if sn, err := s.SnapshotRecord(snap.GetSnapshot().GetSnapshotId()); err == nil && sn.Deleting {
		if err := os.WriteFile(snapFile, saved[snapFile], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := s.VolumeRecord(src.GetVolumeId()); err == nil && v.Deleting {
		if err := os.WriteFile(src.GetVolumeContext()["path"], saved[src.GetVolumeContext()["path"]], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	p.start(t)
	listed := p.listedOf(t, "loopfile")
	for _, v := range []*csi.Volume{restore.GetVolume(), clone.GetVolume()} {
		if !slices.Contains(listed, v.GetVolumeId()) {
			t.Errorf("%s is not listed after the restart: %v", v.GetVolumeId(), listed)
			continue
		}
		b, err := os.ReadFile(v.GetVolumeContext()["path"])
		if err != nil || !strings.HasPrefix(string(b), string(token)) {
			t.Errorf("%s lost its data after the restart: %v", v.GetVolumeId(), err)
		}
	}
	if slices.Contains(listed, src.GetVolumeId()) {
		t.Errorf("the deleted source is listed: %v", listed)
	}
	for _, f := range []string{snapFile, src.GetVolumeContext()["path"]} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("deleted %s is still in the pool", filepath.Base(f))
		}
	}
	for _, v := range []*csi.Volume{restore.GetVolume(), clone.GetVolume()} {
		if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
}
