package state

import (
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// indexedDeleting is what the file's volumes_deleting bucket holds, read
// from bbolt after a checkpoint of every write.
func indexedDeleting(t *testing.T, s *Store) []string {
	t.Helper()
	var ids []string
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketVolumesDeleting)
		if b == nil {
			t.Fatal("no volumes_deleting bucket")
		}
		return b.ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func deletingIDs(t *testing.T, s *Store) []string {
	t.Helper()
	vols, err := s.DeletingVolumes()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, v := range vols {
		if !v.Deleting {
			t.Errorf("DeletingVolumes answered %s, which is not marked", v.ID)
		}
		ids = append(ids, v.ID)
	}
	return ids
}

// The volumes marked Deleting are indexed, in the write that marks them
// and the one that removes or unmarks them, so start-up reads them without
// decoding every volume; the index survives a reopen.
func TestDeletingIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		id := "vol-" + strconv.Itoa(i)
		if err := s.InsertVolume(fullVolume(id, "name-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"vol-3", "vol-17", "vol-40", "vol-41"} {
		if err := s.MarkVolumeDeleting(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkVolumeDeleting("vol-3"); err != nil { // again: no change
		t.Fatal(err)
	}
	if err := s.DeleteVolumeSoon("vol-17"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume("vol-40"); err != nil {
		t.Fatal(err)
	}
	// A put of the record unmarked (as an undone deletion would write it)
	// takes it out of the index; a put of a marked record puts it in.
	unmarked, err := s.VolumeRecord("vol-41")
	if err != nil {
		t.Fatal(err)
	}
	unmarked.Deleting = false
	if err := s.PutVolume(unmarked); err != nil {
		t.Fatal(err)
	}
	marked := fullVolume("vol-new", "name-new")
	marked.Deleting = true
	if err := s.PutVolume(marked); err != nil {
		t.Fatal(err)
	}
	want := []string{"vol-3", "vol-new"}
	if got := deletingIDs(t, s); !slices.Equal(got, want) {
		t.Errorf("DeletingVolumes: %v, want %v", got, want)
	}
	if got := indexedDeleting(t, s); !slices.Equal(got, want) {
		t.Errorf("volumes_deleting holds %v, want %v", got, want)
	}
	checkDB(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := deletingIDs(t, s); !slices.Equal(got, want) {
		t.Errorf("after reopening, DeletingVolumes: %v, want %v", got, want)
	}
}

// A file without the index (written before it) gets it on Open, built
// from the volume records, marks that only the log held included.
func TestDeletingIndexBuiltOnOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := s.InsertVolume(fullVolume("vol-"+strconv.Itoa(i), "")); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"vol-2", "vol-12"} {
		if err := s.MarkVolumeDeleting(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketVolumesDeleting) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := []string{"vol-12", "vol-2"}
	if got := deletingIDs(t, s); !slices.Equal(got, want) {
		t.Errorf("DeletingVolumes: %v, want %v", got, want)
	}
	if got := indexedDeleting(t, s); !slices.Equal(got, want) {
		t.Errorf("volumes_deleting holds %v, want %v", got, want)
	}
}

// BenchmarkDeletingVolumes measures start-up's read of the volumes marked
// Deleting (one) among 10,000 volume records in bbolt.
func BenchmarkDeletingVolumes(b *testing.B) {
	path := filepath.Join(b.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		if err := s.InsertVolume(fullVolume("vol-"+strconv.Itoa(i), "")); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.MarkVolumeDeleting("vol-5000"); err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil { // everything in bbolt, as at start-up
		b.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for b.Loop() {
		vols, err := s.DeletingVolumes()
		if err != nil {
			b.Fatal(err)
		}
		if len(vols) != 1 {
			b.Fatalf("%d volumes marked, want 1", len(vols))
		}
	}
}

// The ephemeral volume holding a node volume ID is found through the
// ephemeral_volumes index, which follows every put and delete of the
// records, survives a reopen, and is built on Open for a file without it.
func TestEphemeralVolumeIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	put := func(co, vol string) {
		t.Helper()
		if err := s.PutEphemeral(Ephemeral{COVolumeID: co, Name: "name-" + co, Phase: EphemeralPublishing, VolumeID: vol, CreatedAt: created}); err != nil {
			t.Fatal(err)
		}
	}
	holder := func(vol string) string {
		t.Helper()
		e, err := s.EphemeralByVolumeID(vol)
		if errors.Is(err, ErrNotFound) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return e.COVolumeID
	}
	for i := range 30 {
		put("co-"+strconv.Itoa(i), "vol-"+strconv.Itoa(i))
	}
	put("co-none", "")    // no answer from create_volume yet
	put("co-5", "vol-5")  // the same again
	put("co-7", "vol-7b") // another volume: the old one is no longer held
	if err := s.DeleteEphemeral("co-9"); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for vol, want := range map[string]string{"vol-1": "co-1", "vol-5": "co-5", "vol-7": "", "vol-7b": "co-7", "vol-9": "", "vol-29": "co-29", "": ""} {
			if got := holder(vol); got != want {
				t.Errorf("%s: volume %q held by %q, want %q", when, vol, got, want)
			}
		}
	}
	check("written")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	check("reopened")
	checkDB(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketEphemeralVolumes) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check("index built on open")
}
