package host_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A CreateVolume or DeleteVolume waits for one sync, of its logged intent
// (a create) or its deleting mark (a delete); the module's pool changes
// and the record's write are synced later, in batches. These tests run the
// real daemon binary, kill it with SIGKILL between the module's change
// and the record, and simulate the power loss of what is synced later, and
// check that start-up leaves no pool entry without a record and no record
// without its pool entry.

// poolEntries returns the volume entries of a pool folder (not the
// scratch folder).
func poolEntries(t *testing.T, pool string) []string {
	t.Helper()
	es, err := os.ReadDir(pool)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// waitEntry returns when the inotify descriptor in reports a new entry
// that is not hidden (the pools' scratch folder is).
func waitEntry(t *testing.T, in int) {
	t.Helper()
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(in, buf)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			l := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+l]), "\x00")
			if name != "" && !strings.HasPrefix(name, ".") {
				return
			}
			off += unix.SizeofInotifyEvent + l
		}
	}
}

// listedOf returns the IDs of the listed volumes of backend.
func (p *procDaemon) listedOf(t *testing.T, backend string) []string {
	t.Helper()
	resp, err := p.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range resp.GetEntries() {
		if id := e.GetVolume().GetVolumeId(); strings.Contains(id, backend) {
			out = append(out, id)
		}
	}
	return out
}

func (p *procDaemon) createVolume(ctx context.Context, name, backend string) (*csi.Volume, error) {
	c := rwCap
	if backend == "loopfile" {
		c = blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	}
	resp, err := p.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes},
		VolumeCapabilities: []*csi.VolumeCapability{c}, Parameters: map[string]string{backendParam: backend},
	})
	return resp.GetVolume(), err
}

// TestKilledBetweenModuleAndRecord kills the daemon the moment the module's
// create_volume made its pool entry (localdir's folder, loopfile's file),
// before the CO has its answer, and checks after the restart that the entry
// has its record (start-up finished the logged create), and that the CO's
// retry answers that volume.
func TestKilledBetweenModuleAndRecord(t *testing.T) {
	p := newProcDaemon(t)
	for _, backend := range []string{"localdir", "loopfile"} {
		pool := p.Pool(backend)
		cut := 0
		for try := 0; try < 10 && cut < 2; try++ {
			name := fmt.Sprintf("killed-%s-%d", backend, try)
			in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := unix.InotifyAddWatch(in, pool, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
				unix.Close(in)
				t.Fatal(err)
			}
			pid := p.Pid()
			done := make(chan error, 1)
			go func() { _, err := p.createVolume(callCtx(t), name, backend); done <- err }()
			waitEntry(t, in)
			syscall.Kill(pid, syscall.SIGKILL)
			unix.Close(in)
			if err := <-done; err != nil {
				cut++
			}
			p.kill(t)
			p.start(t)
			entries, listed := poolEntries(t, pool), p.listedOf(t, backend)
			if len(entries) != len(listed) {
				t.Fatalf("%s, try %d: after the restart the pool holds %v, the records list %v", backend, try, entries, listed)
			}
			v, err := p.createVolume(callCtx(t), name, backend)
			if err != nil {
				t.Fatalf("the CO's retry of %s: %v", name, err)
			}
			if !slices.Contains(listed, v.GetVolumeId()) {
				t.Fatalf("the retry answered %s; listed after the restart: %v", v.GetVolumeId(), listed)
			}
			if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
		}
		if cut == 0 {
			t.Fatalf("%s: no kill landed before CreateVolume answered", backend)
		}
		if e := poolEntries(t, pool); len(e) != 0 {
			t.Errorf("%s: pool holds %v after every volume was deleted", backend, e)
		}
	}
}

// TestUnsyncedPoolChangesLost kills the daemon right after a CreateVolume
// and a DeleteVolume answered, then does to the pool what a power loss
// may do to changes whose sync was still to come: the new volume's entry
// vanishes, the deleted one's comes back. Start-up must make the pool
// agree with what the CO was told: the created volume is there, with the
// ID it got, and usable; the deleted one is gone, storage and record.
func TestUnsyncedPoolChangesLost(t *testing.T) {
	p := newProcDaemon(t)
	for _, backend := range []string{"localdir", "loopfile"} {
		pool := p.Pool(backend)
		old, err := p.createVolume(callCtx(t), "old-"+backend, backend)
		if err != nil {
			t.Fatal(err)
		}
		oldEntry := poolEntries(t, pool)
		if len(oldEntry) != 1 {
			t.Fatalf("pool holds %v", oldEntry)
		}
		// A clean stop settles everything.
		p.stop(t)
		p.start(t)

		fresh, err := p.createVolume(callCtx(t), "new-"+backend, backend)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: old.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
		p.kill(t)
		entries := poolEntries(t, pool)
		if len(entries) != 1 || entries[0] == oldEntry[0] {
			t.Fatalf("pool holds %v after the create and the delete", entries)
		}
		freshEntry := filepath.Join(pool, entries[0])
		st, err := os.Stat(freshEntry)
		if err != nil {
			t.Fatal(err)
		}
		// The power loss.
		if err := os.RemoveAll(freshEntry); err != nil {
			t.Fatal(err)
		}
		if st.IsDir() {
			err = os.Mkdir(filepath.Join(pool, oldEntry[0]), 0o755)
		} else {
			err = os.WriteFile(filepath.Join(pool, oldEntry[0]), nil, 0o600)
			if err == nil {
				err = os.Truncate(filepath.Join(pool, oldEntry[0]), st.Size())
			}
		}
		if err != nil {
			t.Fatal(err)
		}

		p.start(t)
		if got := poolEntries(t, pool); !slices.Equal(got, []string{filepath.Base(freshEntry)}) {
			t.Errorf("%s: after the restart the pool holds %v, want [%s]", backend, got, filepath.Base(freshEntry))
		}
		if got := p.listedOf(t, backend); !slices.Equal(got, []string{fresh.GetVolumeId()}) {
			t.Errorf("%s: after the restart the records list %v, want [%s]", backend, got, fresh.GetVolumeId())
		}
		_, err = p.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: old.GetVolumeId()})
		if status.Code(err) != codes.NotFound {
			t.Errorf("%s: ControllerGetVolume of the deleted volume: %v, want NotFound", backend, err)
		}
		if again, err := p.createVolume(callCtx(t), "new-"+backend, backend); err != nil || again.GetVolumeId() != fresh.GetVolumeId() {
			t.Errorf("%s: the CO's repeat of the create: %v, %v; want %s", backend, again.GetVolumeId(), err, fresh.GetVolumeId())
		}

		// A name whose deletion is not settled yet is free for a create.
		if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: fresh.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: fresh.GetVolumeId()}); err != nil {
			t.Errorf("%s: repeated DeleteVolume: %v", backend, err)
		}
		if got := p.listedOf(t, backend); len(got) != 0 {
			t.Errorf("%s: a deleted volume is listed: %v", backend, got)
		}
		again, err := p.createVolume(callCtx(t), "new-"+backend, backend)
		if err != nil {
			t.Fatalf("%s: create of a name just deleted: %v", backend, err)
		}
		if _, err := os.Stat(freshEntry); err != nil {
			t.Errorf("%s: the volume created again has no storage: %v", backend, err)
		}
		if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: again.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeletingMarkWaitsForBackend kills the daemon right after a
// DeleteVolume answered and restarts it without the volume's backend: the
// deletion cannot be finished, and the volume, marked deleting, must stay
// gone to the CO (not listed, NOT_FOUND) while its file, brought back by
// the simulated power loss, waits. With the backend back, start-up
// finishes the deletion.
func TestDeletingMarkWaitsForBackend(t *testing.T) {
	p := newProcDaemon(t)
	pool := p.Pool("loopfile")
	v, err := p.createVolume(callCtx(t), "marked", "loopfile")
	if err != nil {
		t.Fatal(err)
	}
	entries := poolEntries(t, pool)
	if len(entries) != 1 {
		t.Fatalf("pool holds %v", entries)
	}
	p.stop(t)
	p.start(t)
	if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	p.kill(t)
	// The power loss brings the unsynced unlink back.
	if err := os.WriteFile(filepath.Join(pool, entries[0]), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	p.Modules[1].Name = "loopfile-off"
	p.start(t)
	if got := p.listedOf(t, "loopfile"); len(got) != 0 {
		t.Errorf("a volume marked deleting is listed: %v", got)
	}
	_, err = p.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()})
	if status.Code(err) != codes.NotFound {
		t.Errorf("ControllerGetVolume of a volume marked deleting: %v, want NotFound", err)
	}
	if got := poolEntries(t, pool); len(got) != 1 {
		t.Fatalf("without its backend the volume's file should wait; pool holds %v", got)
	}
	if !slices.ContainsFunc(p.log(), func(l string) bool { return strings.Contains(l, "waits for its backend") }) {
		t.Errorf("start-up did not report the deletion waiting for its backend")
	}

	p.stop(t)
	p.Modules[1].Name = "loopfile"
	p.start(t)
	if got := poolEntries(t, pool); len(got) != 0 {
		t.Errorf("start-up with the backend back left %v in the pool", got)
	}
	again, err := p.createVolume(callCtx(t), "marked", "loopfile")
	if err != nil {
		t.Fatalf("create of the deleted volume's name: %v", err)
	}
	if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: again.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}

// TestUnsyncedSnapshotDeleteLost kills the daemon right after a
// DeleteSnapshot answered and brings the snapshot's folder back, as a
// power loss may for an rmdir whose sync was still to come: start-up must
// remove it, and the snapshot stays gone. A snapshot of a name whose
// deletion is not settled can be cut at once.
func TestUnsyncedSnapshotDeleteLost(t *testing.T) {
	p := newProcDaemon(t)
	pool := p.Pool("localdir")
	v, err := p.createVolume(callCtx(t), "snapsrc", "localdir")
	if err != nil {
		t.Fatal(err)
	}
	before := poolEntries(t, pool)
	snap := func() *csi.Snapshot {
		resp, err := p.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: v.GetVolumeId()})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetSnapshot()
	}
	sn := snap()
	var snapEntry string
	for _, e := range poolEntries(t, pool) {
		if !slices.Contains(before, e) {
			snapEntry = e
		}
	}
	if snapEntry == "" {
		t.Fatalf("no new pool entry for the snapshot: %v", poolEntries(t, pool))
	}
	p.stop(t)
	p.start(t)
	if _, err := p.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: sn.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	p.kill(t)
	if err := os.Mkdir(filepath.Join(pool, snapEntry), 0o755); err != nil {
		t.Fatal(err)
	}
	p.start(t)
	if slices.Contains(poolEntries(t, pool), snapEntry) {
		t.Errorf("start-up left the deleted snapshot's folder %s", snapEntry)
	}
	resp, err := p.controller().ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{})
	if err != nil || len(resp.GetEntries()) != 0 {
		t.Errorf("ListSnapshots after the restart: %v, %v", resp.GetEntries(), err)
	}

	sn = snap()
	if _, err := p.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: sn.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: sn.GetSnapshotId()}); err != nil {
		t.Errorf("repeated DeleteSnapshot: %v", err)
	}
	if resp, err := p.controller().ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{SourceVolumeId: v.GetVolumeId()}); err != nil || len(resp.GetEntries()) != 0 {
		t.Errorf("a deleted snapshot is listed: %v, %v", resp.GetEntries(), err)
	}
	sn = snap()
	if _, err := os.Stat(filepath.Join(pool, snapEntry)); err != nil {
		t.Errorf("the snapshot cut again has no folder: %v", err)
	}
	if _, err := p.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: sn.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}
