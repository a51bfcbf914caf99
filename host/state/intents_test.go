package state

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

// A volume marked Deleting is gone to every reader but the ones start-up
// and a same-name create use, also in paged listings, and the mark and
// the intents survive a reopen.
func TestDeletingMarkAndIntents(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if err := s.InsertVolume(fullVolume(id, "n-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkVolumeDeleting("b"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.MarkVolumeDeleting("x"), abi.NotFound, ErrNotFound)
	intent := Intent{Key: "volume/n-d", Op: "create_volume", Backend: "loop", Request: []byte{1, 2, 3}, SourceVolumeID: "a", CreatedAt: created}
	if err := s.LogIntent(intent); err != nil {
		t.Fatal(err)
	}
	if err := s.LogIntent(Intent{Key: "volume/n-e", Op: "create_volume", CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	// Only the intent logged at that time goes.
	if err := s.DropIntentSoon("volume/n-e", created.Add(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetIntent("volume/n-e"); err != nil {
		t.Fatalf("an intent logged at another time was dropped: %v", err)
	}
	if err := s.DropIntentSoon("volume/n-e", created); err != nil {
		t.Fatal(err)
	}
	if err := s.DropIntentSoon("volume/n-e", created); err != nil {
		t.Fatalf("dropping a dropped intent: %v", err)
	}
	if err := s.MarkVolumeDeleting("c"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	if _, err := s.GetVolume("b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetVolume of a deleting volume: %v, want ErrNotFound", err)
	}
	if _, err := s.VolumeByName("n-b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("VolumeByName of a deleting volume: %v, want ErrNotFound", err)
	}
	if v, err := s.VolumeRecordByName("n-b"); err != nil || !v.Deleting || v.ID != "b" {
		t.Errorf("VolumeRecordByName: %+v, %v", v, err)
	}
	if v, err := s.VolumeRecord("b"); err != nil || !v.Deleting {
		t.Errorf("VolumeRecord: %+v, %v", v, err)
	}
	// One entry per page: the hidden volume neither shows nor takes a page.
	var ids []string
	for tok := ""; ; {
		vols, next, err := s.ListVolumes(tok, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vols {
			ids = append(ids, v.ID)
		}
		if next == "" {
			break
		}
		tok = next
	}
	if !reflect.DeepEqual(ids, []string{"a"}) {
		t.Errorf("listed %v, want [a]", ids)
	}
	del, err := s.DeletingVolumes()
	if err != nil || len(del) != 2 || del[0].ID != "b" {
		t.Errorf("DeletingVolumes: %+v, %v", del, err)
	}
	// The name stays taken until the record goes.
	if err := s.InsertVolume(fullVolume("b2", "n-b")); !errors.Is(err, ErrNameTaken) {
		t.Errorf("insert under a deleting volume's name: %v, want ErrNameTaken", err)
	}
	if err := s.DeleteVolumeSoon("b"); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertVolume(fullVolume("b2", "n-b")); err != nil {
		t.Errorf("insert after the removal: %v", err)
	}
	got, err := s.ListIntents()
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], intent) {
		t.Errorf("ListIntents: %+v, %v; want [%+v]", got, err, intent)
	}
	checkDB(t, s)
}

// A snapshot marked Deleting is gone to every reader but the ones
// start-up and a same-name create use, in both listings.
func TestSnapshotDeletingMark(t *testing.T) {
	s := openStore(t)
	for _, id := range []string{"s1", "s2"} {
		if err := s.InsertSnapshot(Snapshot{ID: id, Name: "n-" + id, Backend: "dir", LocalID: id, SourceVolumeID: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkSnapshotDeleting("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSnapshot("s1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSnapshot of a deleting snapshot: %v", err)
	}
	if _, err := s.SnapshotByName("n-s1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("SnapshotByName of a deleting snapshot: %v", err)
	}
	if v, err := s.SnapshotRecordByName("n-s1"); err != nil || !v.Deleting {
		t.Errorf("SnapshotRecordByName: %+v, %v", v, err)
	}
	for _, f := range []SnapshotFilter{{}, {SourceVolumeID: "v"}, {SnapshotID: "s1"}} {
		got, _, err := s.ListSnapshots(f, "", 1)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, v := range got {
			ids = append(ids, v.ID)
		}
		if want := []string{"s2"}; f.SnapshotID != "" && len(ids) != 0 || f.SnapshotID == "" && !reflect.DeepEqual(ids, want) {
			t.Errorf("ListSnapshots(%+v) = %v", f, ids)
		}
	}
	del, err := s.DeletingSnapshots()
	if err != nil || len(del) != 1 || del[0].ID != "s1" {
		t.Errorf("DeletingSnapshots: %+v, %v", del, err)
	}
	if err := s.DeleteSnapshotSoon("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SnapshotRecord("s1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after DeleteSnapshotSoon: %v", err)
	}
}
