package host_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// staleBatchDaemon starts localdir beside a second localdir backend,
// "other", and returns the daemon and a function that takes other's pool
// folder away (so that no batch holding one of its changes can sync) and
// returns a function that brings it back.
func staleBatchDaemon(t *testing.T) (*daemon, func() func()) {
	o := localdirOptions(t)
	o.more = []daemonModule{{name: "other", wasm: o.wasm, hostcalls: o.hostcalls, config: o.config}}
	d := startDaemon(t, o)
	other := d.pools["other"]
	return d, func() func() {
		away := other + ".away"
		if err := os.Rename(other, away); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Rename(away, other) })
		return func() {
			if err := os.Rename(away, other); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRecreatedVolumeOutlivesStaleDeletion: a deletion whose batch has not
// settled must not be finished by a same-name CreateVolume: the new volume
// gets the same ID, and the batch's completion, when it settles, would
// remove the new volume's record. (Since a broken folder holds back only
// the operations on it, the deletion here settles and the create mostly
// succeeds; the test then checks the outcome: the re-created volume keeps
// its record. TestCreateOverHeldDeletionAborts holds the deletion itself.)
func TestRecreatedVolumeOutlivesStaleDeletion(t *testing.T) {
	d, takeAway := staleBatchDaemon(t)
	a := createVolume(t, d, &csi.CreateVolumeRequest{Name: "again"})
	b := createVolume(t, d, &csi.CreateVolumeRequest{Name: "elsewhere", Parameters: map[string]string{backendParam: "other"}})
	time.Sleep(500 * time.Millisecond) // both creates settled

	// Both deletions land in one batch, which cannot sync other's pool
	// folder while it is away.
	if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: b.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	back := takeAway()
	if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: a.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}

	req := &csi.CreateVolumeRequest{Name: "again", VolumeCapabilities: rwCaps()}
	r, err := d.controller().CreateVolume(callCtx(t), req)
	acked := err == nil
	if err != nil && status.Code(err) != codes.Aborted {
		t.Fatalf("CreateVolume of a name whose deletion is not settled: %v, want success or ABORTED", err)
	}
	if acked && r.GetVolume().GetVolumeId() != a.GetVolumeId() {
		t.Fatalf("re-created volume %q, want the same ID %q", r.GetVolume().GetVolumeId(), a.GetVolumeId())
	}
	back()
	time.Sleep(time.Second) // the retried batch settles
	found := func(what string) {
		t.Helper()
		_, err := d.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: a.GetVolumeId()})
		if status.Code(err) == codes.NotFound {
			t.Fatalf("%s: the acknowledged re-created volume %s lost its record to the old deletion's completion", what, a.GetVolumeId())
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if acked {
		found("first create")
	}
	createVolume(t, d, req)
	time.Sleep(500 * time.Millisecond)
	found("repeated create")
}

// TestRecreatedSnapshotOutlivesStaleDeletion is the same for a snapshot
// and a same-name CreateSnapshot.
func TestRecreatedSnapshotOutlivesStaleDeletion(t *testing.T) {
	d, takeAway := staleBatchDaemon(t)
	src := createVolume(t, d, &csi.CreateVolumeRequest{Name: "src"})
	b := createVolume(t, d, &csi.CreateVolumeRequest{Name: "elsewhere", Parameters: map[string]string{backendParam: "other"}})
	req := &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.GetVolumeId()}
	sn, err := d.controller().CreateSnapshot(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	id := sn.GetSnapshot().GetSnapshotId()
	t.Cleanup(func() { d.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: id}) })
	time.Sleep(500 * time.Millisecond)

	if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: b.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	back := takeAway()
	if _, err := d.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
		t.Fatal(err)
	}
	r, err := d.controller().CreateSnapshot(callCtx(t), req)
	acked := err == nil
	if err != nil && status.Code(err) != codes.Aborted {
		t.Fatalf("CreateSnapshot of a name whose deletion is not settled: %v, want success or ABORTED", err)
	}
	if acked && r.GetSnapshot().GetSnapshotId() != id {
		t.Fatalf("re-created snapshot %q, want the same ID %q", r.GetSnapshot().GetSnapshotId(), id)
	}
	back()
	time.Sleep(time.Second)
	found := func(what string) {
		t.Helper()
		resp, err := d.controller().ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{SnapshotId: id})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetEntries()) != 1 {
			t.Fatalf("%s: the acknowledged re-created snapshot %s lost its record to the old deletion's completion", what, id)
		}
	}
	if acked {
		found("first create")
	}
	if _, err := d.controller().CreateSnapshot(callCtx(t), req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	found("repeated create")
}

// TestBrokenFolderHoldsOnlyItsOwn: while one backend's pool folder does not
// sync, the other backends' operations still complete: a deletion on
// localdir settles, so a same-name CreateVolume succeeds instead of
// answering ABORTED until the other backend's storage recovers.
func TestBrokenFolderHoldsOnlyItsOwn(t *testing.T) {
	d, takeAway := staleBatchDaemon(t)
	a := createVolume(t, d, &csi.CreateVolumeRequest{Name: "mine"})
	b := createVolume(t, d, &csi.CreateVolumeRequest{Name: "theirs", Parameters: map[string]string{backendParam: "other"}})
	time.Sleep(500 * time.Millisecond) // both creates settled

	if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: b.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	back := takeAway()
	defer back()
	if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: a.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // several batches: other's keeps failing
	r, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: "mine", VolumeCapabilities: rwCaps()})
	if err != nil {
		t.Fatalf("CreateVolume of a name whose deletion on a healthy backend should have settled: %v", err)
	}
	if r.GetVolume().GetVolumeId() != a.GetVolumeId() {
		t.Fatalf("re-created volume %q, want %q", r.GetVolume().GetVolumeId(), a.GetVolumeId())
	}
}

// TestBrokenFolderHoldsOnlyItsOwnAtStart: start-up repeats the operations a
// crash left logged and completes them once the pool folders they touched
// are synced. A backend whose pool folder cannot be synced, and which had
// nothing to repeat, must not hold them back: before, start-up synced every
// backend's folders, and one failure left every logged operation to be
// repeated at the next start, and the next.
func TestBrokenFolderHoldsOnlyItsOwnAtStart(t *testing.T) {
	o := localdirOptions(t)
	// A folder of the other backend's that cannot be synced: fsync of a
	// folder of procfs fails (EINVAL), as it would on failing storage.
	o.more = []daemonModule{{name: "other", wasm: o.wasm, hostcalls: o.hostcalls, config: o.config, extraRoots: []string{"/proc/sys"}}}
	d := startDaemon(t, o)
	d.stop()
	store, err := state.Open(filepath.Join(d.cfg.StateDir, "wasmcsi.db"))
	if err != nil {
		t.Fatal(err)
	}
	// A logged create on each backend: localdir's completes, other's waits.
	for _, backend := range []string{"localdir", "other"} {
		mreq := abi.CreateVolumeRequest{
			Name: "logged-" + backend, RequiredBytes: 1 << 20,
			Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}},
		}
		if err := store.LogIntent(state.Intent{
			Key: state.VolumeIntentKey(mreq.Name), Op: string(abi.OpCreateVolume), Backend: backend,
			Request: mreq.AppendWire(nil), CreatedAt: time.Now().UTC(),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	d.start(t)
	if r, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{}); err != nil {
		t.Fatal(err)
	} else if len(r.GetEntries()) != 2 {
		t.Fatalf("start-up should have finished both logged creates; listed %v", r.GetEntries())
	}
	d.stop()
	store, err = state.Open(filepath.Join(d.cfg.StateDir, "wasmcsi.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	in, err := store.ListIntents()
	if err != nil {
		t.Fatal(err)
	}
	var logged []string
	for _, i := range in {
		logged = append(logged, i.Key)
	}
	if want := []string{state.VolumeIntentKey("logged-other")}; !slices.Equal(logged, want) {
		t.Fatalf("logged after the start: %v; want only %v (the healthy backend's create completes, the other waits for its folder)", logged, want)
	}
	if v, err := store.VolumeByName("logged-localdir"); err != nil {
		t.Fatalf("record of the finished create: %+v, %v", v, err)
	}
}

// settled waits until no settler batch holds the completion of key.
func settled(t *testing.T, d *daemon, key string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); d.srv.Settling(key); {
		if time.Now().After(deadline) {
			t.Fatalf("the completion of %s did not settle", key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCreateOverHeldDeletionAborts: while a batch holds the removal of a
// deleted volume's record (its pool folder does not sync), a CreateVolume
// of its name answers ABORTED and leaves the record to the batch: the new
// volume would get the same ID, and the batch's removal would take its
// record. Once the batch settles, the same CreateVolume makes the volume,
// which keeps its record and folder.
func TestCreateOverHeldDeletionAborts(t *testing.T) {
	d := startDaemon(t, localdirOptions(t))
	req := &csi.CreateVolumeRequest{Name: "again", VolumeCapabilities: rwCaps()}
	id := createVolume(t, d, req).GetVolumeId()
	settled(t, d, state.VolumeIntentKey(req.Name))

	// The deletion is queued while the settler is held, and the pool
	// folder goes away before any batch takes it: every batch fails to
	// sync the folder and keeps the removal. The module's delete has run.
	release := d.srv.HoldSettler()
	t.Cleanup(release)
	if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	away := d.pool + ".away"
	if err := os.Rename(d.pool, away); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Rename(away, d.pool) })
	release()
	held, err := d.srv.VolumeRecord(id)
	if err != nil || !held.Deleting {
		t.Fatalf("record of the deleted volume: %+v, %v; want it marked Deleting", held, err)
	}

	_, err = d.controller().CreateVolume(callCtx(t), req)
	wantCode(t, err, codes.Aborted, "not settled")
	if !d.srv.Settling(id) {
		t.Fatal("the batch no longer holds the deletion: the folder sync did not fail")
	}
	if got, err := d.srv.VolumeRecord(id); err != nil || !reflect.DeepEqual(got, held) {
		t.Fatalf("after ABORTED, the batch-held record is %+v, %v; want it unchanged: %+v", got, err, held)
	}

	if err := os.Rename(away, d.pool); err != nil {
		t.Fatal(err)
	}
	settled(t, d, id)
	if _, err := d.srv.VolumeRecord(id); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("record of the deleted volume after its batch settled: %v, want not found", err)
	}
	r, err := d.controller().CreateVolume(callCtx(t), req)
	if err != nil {
		t.Fatalf("CreateVolume once the deletion settled: %v", err)
	}
	if r.GetVolume().GetVolumeId() != id {
		t.Fatalf("re-created volume %q, want the same ID %q", r.GetVolume().GetVolumeId(), id)
	}
	settled(t, d, state.VolumeIntentKey(req.Name))
	v, err := d.srv.VolumeRecord(id)
	if err != nil || v.Deleting {
		t.Fatalf("record of the re-created volume: %+v, %v", v, err)
	}
	if fi, err := os.Stat(filepath.Join(d.pool, v.LocalID)); err != nil || !fi.IsDir() {
		t.Fatalf("folder of the re-created volume: %v", err)
	}
}

// TestUnreadableSnapshotMarksHoldOnlyThemselves: start-up finishes what
// it can read. A damaged entry in the index of snapshots being deleted
// (DATA_LOSS when read) must not keep a logged create from being finished:
// before, start-up gave up on every list when one could not be read.
func TestUnreadableSnapshotMarksHoldOnlyThemselves(t *testing.T) {
	d := startDaemon(t, localdirOptions(t))
	d.stop()
	path := filepath.Join(d.cfg.StateDir, "wasmcsi.db")
	store, err := state.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	mreq := abi.CreateVolumeRequest{
		Name: "logged", RequiredBytes: 1 << 20,
		Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}},
	}
	if err := store.LogIntent(state.Intent{
		Key: state.VolumeIntentKey(mreq.Name), Op: string(abi.OpCreateVolume), Backend: "localdir",
		Request: mreq.AppendWire(nil), CreatedAt: time.Now().UTC(),
	}); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("snapshots_deleting")).Put([]byte("no-such-snapshot"), []byte{})
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	d.start(t)
	r, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetEntries()) != 1 {
		t.Fatalf("start-up should have finished the logged create despite the damaged snapshot index; listed %v", r.GetEntries())
	}
}
