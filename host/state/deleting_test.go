package state

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	bolt "go.etcd.io/bbolt"
)

// markedKind is what the tests of an index of the records marked Deleting
// (volumes_deleting, snapshots_deleting) need of their kind.
type markedKind[T any] struct {
	records, index []byte            // the buckets
	prefix         string            // of the test records' IDs
	record         func(id string) T // a new, unmarked record
	id             func(*T) string
	deleting       func(*T) bool
	setDeleting    func(*T, bool)
	insert, put    func(*Store, T) error
	get            func(*Store, string) (T, error) // marked or not
	mark           func(*Store, string) error
	remove         func(*Store, string) error
	removeSoon     func(*Store, string) error
	marked         func(*Store) ([]T, error)
}

var markedVolumes = markedKind[Volume]{
	records: bucketVolumes, index: bucketVolumesDeleting, prefix: "vol-",
	record:      func(id string) Volume { return fullVolume(id, "name-"+id) },
	id:          func(v *Volume) string { return v.ID },
	deleting:    func(v *Volume) bool { return v.Deleting },
	setDeleting: func(v *Volume, d bool) { v.Deleting = d },
	insert:      (*Store).InsertVolume,
	put:         (*Store).PutVolume,
	get:         (*Store).VolumeRecord,
	mark:        (*Store).MarkVolumeDeleting,
	remove:      (*Store).DeleteVolume,
	removeSoon:  (*Store).DeleteVolumeSoon,
	marked:      (*Store).DeletingVolumes,
}

var markedSnapshots = markedKind[Snapshot]{
	records: bucketSnapshots, index: bucketSnapshotsDeleting, prefix: "snap-",
	record: func(id string) Snapshot {
		return Snapshot{ID: id, Name: "name-" + id, Backend: "dir", LocalID: "ls-" + id, SourceVolumeID: "vol-" + id,
			SizeBytes: 1 << 30, Context: map[string]string{"k": "v"}, CreatedAt: created, ReadyToUse: true}
	},
	id:          func(v *Snapshot) string { return v.ID },
	deleting:    func(v *Snapshot) bool { return v.Deleting },
	setDeleting: func(v *Snapshot, d bool) { v.Deleting = d },
	insert:      (*Store).InsertSnapshot,
	put:         (*Store).PutSnapshot,
	get:         (*Store).SnapshotRecord,
	mark:        (*Store).MarkSnapshotDeleting,
	remove:      (*Store).DeleteSnapshot,
	removeSoon:  (*Store).DeleteSnapshotSoon,
	marked:      (*Store).DeletingSnapshots,
}

// fill records n unmarked records, IDs prefix0 to prefix(n-1), and marks
// the ones named in marked.
func (k markedKind[T]) fill(tb testing.TB, s *Store, n int, marked ...string) {
	tb.Helper()
	for i := range n {
		if err := k.insert(s, k.record(k.prefix+strconv.Itoa(i))); err != nil {
			tb.Fatal(err)
		}
	}
	for _, id := range marked {
		if err := k.mark(s, id); err != nil {
			tb.Fatal(err)
		}
	}
}

// markedIDs is what the kind's Deleting* call answers, checked to be
// marked.
func (k markedKind[T]) markedIDs(t *testing.T, s *Store) []string {
	t.Helper()
	recs, err := k.marked(s)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, v := range recs {
		if !k.deleting(&v) {
			t.Errorf("answered %s, which is not marked", k.id(&v))
		}
		ids = append(ids, k.id(&v))
	}
	return ids
}

// indexed is what the file's index bucket holds, read from bbolt after a
// checkpoint of every write.
// check fails the test unless the marked records, and the index entries,
// are want; when says at what point of the test.
func (k markedKind[T]) check(t *testing.T, s *Store, when string, want ...string) {
	t.Helper()
	if when != "" {
		when += ", "
	}
	if got := k.markedIDs(t, s); !slices.Equal(got, want) {
		t.Errorf("%smarked: %v, want %v", when, got, want)
	}
	if got := k.indexed(t, s); !slices.Equal(got, want) {
		t.Errorf("%s%s holds %v, want %v", when, k.index, got, want)
	}
}

func (k markedKind[T]) indexed(t *testing.T, s *Store) []string {
	t.Helper()
	var ids []string
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(k.index)
		if b == nil {
			t.Fatalf("no %s bucket", k.index)
		}
		return b.ForEach(func(id, _ []byte) error {
			ids = append(ids, string(id))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// reopen closes s, runs change on its bbolt file, and opens it again.
func reopen(t *testing.T, s *Store, change func(tx *bolt.Tx) error) *Store {
	t.Helper()
	path := s.Path()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if change != nil {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(change); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The records marked Deleting are indexed, in the write that marks them
// and the one that removes or unmarks them, so start-up reads them without
// decoding every record; the index survives a reopen, and a removal or
// unmarking after it takes the entry out of the file's index too.
func TestDeletingIndex(t *testing.T) {
	t.Run("volumes", func(t *testing.T) { testDeletingIndex(t, markedVolumes) })
	t.Run("snapshots", func(t *testing.T) { testDeletingIndex(t, markedSnapshots) })
}

func testDeletingIndex[T any](t *testing.T, k markedKind[T]) {
	s := openStore(t)
	p := k.prefix
	k.fill(t, s, 50, p+"3", p+"17", p+"40", p+"41", p+"44", p+"45")
	if err := k.mark(s, p+"3"); err != nil { // again: no change
		t.Fatal(err)
	}
	if err := k.removeSoon(s, p+"17"); err != nil {
		t.Fatal(err)
	}
	if err := k.remove(s, p+"40"); err != nil {
		t.Fatal(err)
	}
	// A put of the record unmarked (as an undone deletion writes it)
	// takes it out of the index; a put of a marked record puts it in.
	unmark := func(id string) {
		t.Helper()
		v, err := k.get(s, id)
		if err != nil {
			t.Fatal(err)
		}
		k.setDeleting(&v, false)
		if err := k.put(s, v); err != nil {
			t.Fatal(err)
		}
	}
	unmark(p + "41")
	marked := k.record(p + "new")
	k.setDeleting(&marked, true)
	if err := k.put(s, marked); err != nil {
		t.Fatal(err)
	}
	want := []string{p + "3", p + "44", p + "45", p + "new"}
	k.check(t, s, "", want...)
	checkDB(t, s)
	s = reopen(t, s, nil)
	if got := k.markedIDs(t, s); !slices.Equal(got, want) {
		t.Errorf("after reopening, marked: %v, want %v", got, want)
	}
	// Entries that are in the file now, not only in the log.
	if err := k.removeSoon(s, p+"44"); err != nil {
		t.Fatal(err)
	}
	unmark(p + "45")
	want = []string{p + "3", p + "new"}
	k.check(t, s, "after reopening and changing", want...)
}

// A file without the index (written before it) gets it on Open, built
// from the records.
func TestDeletingIndexBuiltOnOpen(t *testing.T) {
	t.Run("volumes", func(t *testing.T) { testDeletingIndexBuiltOnOpen(t, markedVolumes) })
	t.Run("snapshots", func(t *testing.T) { testDeletingIndexBuiltOnOpen(t, markedSnapshots) })
}

func testDeletingIndexBuiltOnOpen[T any](t *testing.T, k markedKind[T]) {
	s := openStore(t)
	p := k.prefix
	k.fill(t, s, 20, p+"2", p+"12")
	s = reopen(t, s, func(tx *bolt.Tx) error { return tx.DeleteBucket(k.index) })
	want := []string{p + "12", p + "2"}
	k.check(t, s, "", want...)
}

// Reading the marked records reads only them: an unmarked record that
// does not decode (which every read of it reports as DATA_LOSS) is not
// read. Before the index, the read decoded every record of the kind.
func TestDeletingReadsOnlyMarked(t *testing.T) {
	t.Run("volumes", func(t *testing.T) { testDeletingReadsOnlyMarked(t, markedVolumes) })
	t.Run("snapshots", func(t *testing.T) { testDeletingReadsOnlyMarked(t, markedSnapshots) })
}

func testDeletingReadsOnlyMarked[T any](t *testing.T, k markedKind[T]) {
	s := openStore(t)
	p := k.prefix
	k.fill(t, s, 20, p+"5")
	s = reopen(t, s, func(tx *bolt.Tx) error { return tx.Bucket(k.records).Put([]byte(p+"9"), []byte{0xff}) })
	if _, err := k.get(s, p+"9"); abi.CodeOf(err) != abi.DataLoss {
		t.Fatalf("read of the damaged record: %v, want DATA_LOSS", err)
	}
	if got, want := k.markedIDs(t, s), []string{p + "5"}; !slices.Equal(got, want) {
		t.Errorf("marked: %v, want %v", got, want)
	}
}

// An index entry without its marked record is DATA_LOSS, not an answer
// that leaves a deletion unfinished or finishes one never asked for.
func TestDeletingIndexCorrupt(t *testing.T) {
	t.Run("volumes", func(t *testing.T) { testDeletingIndexCorrupt(t, markedVolumes) })
	t.Run("snapshots", func(t *testing.T) { testDeletingIndexCorrupt(t, markedSnapshots) })
}

func testDeletingIndexCorrupt[T any](t *testing.T, k markedKind[T]) {
	for _, id := range []string{k.prefix + "1", k.prefix + "none"} { // unmarked, absent
		t.Run(id, func(t *testing.T) {
			s := openStore(t)
			k.fill(t, s, 3, k.prefix+"2")
			s = reopen(t, s, func(tx *bolt.Tx) error { return tx.Bucket(k.index).Put([]byte(id), []byte{}) })
			recs, err := k.marked(s)
			if abi.CodeOf(err) != abi.DataLoss {
				t.Fatalf("marked: %d records, error %v; want DATA_LOSS", len(recs), err)
			}
		})
	}
}

// benchDeleting measures start-up's read of the records marked Deleting
// (marked) among 10,000 records in bbolt.
func benchDeleting[T any](b *testing.B, k markedKind[T], marked ...string) {
	path := filepath.Join(b.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	k.fill(b, s, 10000, marked...)
	if err := s.Close(); err != nil { // everything in bbolt, as at start-up
		b.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for b.Loop() {
		recs, err := k.marked(s)
		if err != nil {
			b.Fatal(err)
		}
		if len(recs) != len(marked) {
			b.Fatalf("%d records marked, want %d", len(recs), len(marked))
		}
	}
}

// BenchmarkDeletingVolumes: one volume marked among 10,000.
func BenchmarkDeletingVolumes(b *testing.B) { benchDeleting(b, markedVolumes, "vol-5000") }

// BenchmarkDeletingSnapshots: three snapshots marked among 10,000.
func BenchmarkDeletingSnapshots(b *testing.B) {
	benchDeleting(b, markedSnapshots, "snap-10", "snap-5000", "snap-9999")
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

// A file of an older schema version may have been written by a daemon that
// did not keep the indexes (its records changed without them): Open
// builds them anew from the records and writes the new version in the
// same transaction. Before, an index entry such a daemon left for a record
// it removed made every start-up read DATA_LOSS.
func TestDeletingIndexRebuiltOnUpgrade(t *testing.T) {
	t.Run("volumes", func(t *testing.T) { testDeletingIndexRebuiltOnUpgrade(t, markedVolumes) })
	t.Run("snapshots", func(t *testing.T) { testDeletingIndexRebuiltOnUpgrade(t, markedSnapshots) })
}

func testDeletingIndexRebuiltOnUpgrade[T any](t *testing.T, k markedKind[T]) {
	s := openStore(t)
	p := k.prefix
	k.fill(t, s, 3, p+"2")
	// What a version 2 daemon leaves: an entry for a record it removed,
	// none for one it marked.
	s = reopen(t, s, func(tx *bolt.Tx) error {
		if err := tx.Bucket(k.index).Put([]byte(p+"gone"), []byte{}); err != nil {
			return err
		}
		if err := tx.Bucket(k.index).Delete([]byte(p + "2")); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, binary.AppendUvarint(nil, 2))
	})
	want := []string{p + "2"}
	k.check(t, s, "", want...)
	// Upgraded once: a second Open keeps the index as it is.
	s = reopen(t, s, func(tx *bolt.Tx) error {
		if v, _ := binary.Uvarint(tx.Bucket(bucketMeta).Get(keySchema)); v != SchemaVersion {
			t.Errorf("schema version %d after the upgrade, want %d", v, SchemaVersion)
		}
		return nil
	})
	if got := k.indexed(t, s); !slices.Equal(got, want) {
		t.Errorf("after a second Open %s holds %v, want %v", k.index, got, want)
	}
}

// An upgrade that rebuilds the indexes meets a record it cannot decode:
// Open still succeeds, the index holds the other records, and reading the
// broken one answers DATA_LOSS naming it. Before, that one record kept the
// daemon from starting at all.
func TestUpgradeWithCorruptRecord(t *testing.T) {
	t.Run("volumes", func(t *testing.T) { testUpgradeWithCorruptRecord(t, markedVolumes) })
	t.Run("snapshots", func(t *testing.T) { testUpgradeWithCorruptRecord(t, markedSnapshots) })
}

func testUpgradeWithCorruptRecord[T any](t *testing.T, k markedKind[T]) {
	s := openStore(t)
	p := k.prefix
	k.fill(t, s, 3, p+"1", p+"2")
	s = reopen(t, s, func(tx *bolt.Tx) error {
		if err := tx.Bucket(k.records).Put([]byte(p+"1"), []byte{0xff, 0xff, 0xff}); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, binary.AppendUvarint(nil, 2))
	})
	// The broken record may be a deletion in progress: it is indexed as
	// one, and start-up's look at the deletions meets its DATA_LOSS.
	if got, want := k.indexed(t, s), []string{p + "1", p + "2"}; !slices.Equal(got, want) {
		t.Errorf("%s holds %v, want %v", k.index, got, want)
	}
	if _, err := k.marked(s); abi.CodeOf(err) != abi.DataLoss {
		t.Errorf("listing the deletions: %v, want DATA_LOSS", err)
	}
	_, err := k.get(s, p+"1")
	var ae *abi.Error
	if !errors.As(err, &ae) || ae.Code != abi.DataLoss || !strings.Contains(ae.Message, p+"1") {
		t.Errorf("reading the broken record: %v, want DATA_LOSS naming %s", err, p+"1")
	}
	if _, err := k.get(s, p+"0"); err != nil {
		t.Errorf("reading an intact record: %v", err)
	}
}

// The same for the ephemeral volumes' index: a record whose volume ID
// still reads is indexed by it, so the ID never passes for a free one; one
// with nothing readable is left out.
func TestEphemeralIndexSkipsCorruptRecord(t *testing.T) {
	s := openStore(t)
	for _, id := range []string{"csi-a", "csi-b", "csi-c"} {
		if err := s.PutEphemeral(Ephemeral{COVolumeID: id, VolumeID: "vol-" + id, Backend: "dir"}); err != nil {
			t.Fatal(err)
		}
	}
	s = reopen(t, s, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEphemeral)
		if err := b.Put([]byte("csi-a"), []byte{0xff, 0xff}); err != nil {
			return err
		}
		// Its fields whole, then a broken one.
		tail := append(append([]byte(nil), b.Get([]byte("csi-c"))...), 0xff, 0xff)
		if err := b.Put([]byte("csi-c"), tail); err != nil {
			return err
		}
		return tx.DeleteBucket(bucketEphemeralVolumes)
	})
	if _, err := s.GetEphemeral("csi-b"); err != nil {
		t.Errorf("the intact record: %v", err)
	}
	if e, err := s.EphemeralByVolumeID("vol-csi-b"); err != nil || e.COVolumeID != "csi-b" {
		t.Errorf("the intact record by its volume ID: %+v, %v", e, err)
	}
	for _, id := range []string{"csi-a", "csi-c"} {
		if _, err := s.GetEphemeral(id); abi.CodeOf(err) != abi.DataLoss {
			t.Errorf("the broken record %s: %v, want DATA_LOSS", id, err)
		}
	}
	if _, err := s.EphemeralByVolumeID("vol-csi-c"); abi.CodeOf(err) != abi.DataLoss {
		t.Errorf("the broken record by its volume ID: %v, want DATA_LOSS (not a free ID)", err)
	}
}

func TestEphemeralVolumeIDField(t *testing.T) {
	e := Ephemeral{COVolumeID: "csi-x", VolumeID: "vol-x", Backend: "dir"}
	b, err := encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := stringField(b, ephemeralVolumeIDField); err != nil || got != e.VolumeID {
		t.Fatalf("field %d = %q, %v; want %q", ephemeralVolumeIDField, got, err, e.VolumeID)
	}
}
