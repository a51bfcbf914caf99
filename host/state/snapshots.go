package state

import (
	"errors"
	"fmt"

	"github.com/wasmcsi/wasmcsi/abi"
)

const (
	snapshotNameField   = 2
	snapshotSourceField = 5
)

var snapshotTable = &table[Snapshot, *Snapshot]{
	kind: "snapshot", kinds: "snapshots", bucket: bucketSnapshots, listing: listSnapshots, check: checkSnapshot,
	key:   func(v *Snapshot) string { return v.ID },
	names: bucketSnapshotNames, name: func(v *Snapshot) string { return v.Name }, nameField: snapshotNameField,
	index: indexSnapshotSource, unindex: unindexSnapshotSource,
	hidden:      func(v *Snapshot) bool { return v.Deleting },
	hide:        func(v *Snapshot) { v.Deleting = true },
	hiddenIndex: bucketSnapshotsDeleting,
}

// indexSnapshotSource keeps the source volume index of a put snapshot.
func indexSnapshotSource(tx *txn, v *Snapshot, old []byte) (func() error, error) {
	var oldSource string
	if old != nil {
		var err error
		if oldSource, err = stringField(old, snapshotSourceField); err != nil {
			return nil, corrupt("snapshot", v.ID, err)
		}
	}
	return func() error {
		if oldSource == v.SourceVolumeID {
			return nil
		}
		bySource := tx.Bucket(bucketSnapshotSource)
		if oldSource != "" {
			if err := bySource.Delete(prefixKey(oldSource, v.ID)); err != nil {
				return err
			}
		}
		if v.SourceVolumeID != "" {
			return bySource.Put(prefixKey(v.SourceVolumeID, v.ID), nil)
		}
		return nil
	}, nil
}

// unindexSnapshotSource drops a deleted snapshot's source index entry.
func unindexSnapshotSource(tx *txn, id string, old []byte) (func() error, error) {
	source, err := stringField(old, snapshotSourceField)
	if err != nil {
		return nil, corrupt("snapshot", id, err)
	}
	return func() error {
		if source == "" {
			return nil
		}
		return tx.Bucket(bucketSnapshotSource).Delete(prefixKey(source, id))
	}, nil
}

func checkSnapshot(v *Snapshot) error {
	if err := checkKey("snapshot ID", v.ID); err != nil {
		return err
	}
	if v.Name != "" {
		if err := checkKey("snapshot name", v.Name); err != nil {
			return err
		}
	}
	if len(v.SourceVolumeID) > maxKey {
		return checkKey("source volume ID", v.SourceVolumeID)
	}
	return nil
}

// PutSnapshot creates or replaces the snapshot v.ID with its name and source
// volume index entries. It fails with ErrNameTaken if v.Name belongs to
// another snapshot.
func (s *Store) PutSnapshot(v Snapshot) error { return snapshotTable.put(s.write, v, false) }

// InsertSnapshot records a new snapshot: as PutSnapshot, but it fails with
// ErrIDTaken, and writes nothing, when v.ID is already recorded.
func (s *Store) InsertSnapshot(v Snapshot) error { return snapshotTable.put(s.write, v, true) }

// GetSnapshot returns the snapshot with the given ID, or ErrNotFound.
func (s *Store) GetSnapshot(id string) (Snapshot, error) { return snapshotTable.get(s, id) }

// SnapshotByName returns the snapshot with the given name, or ErrNotFound.
func (s *Store) SnapshotByName(name string) (Snapshot, error) { return snapshotTable.byName(s, name) }

// DeleteSnapshot removes the snapshot and its index entries, or returns
// ErrNotFound.
func (s *Store) DeleteSnapshot(id string) error { return snapshotTable.delete(s.write, id) }

// DeleteSnapshotSoon is DeleteSnapshot that does not wait for the disk:
// for a snapshot marked Deleting, as DeleteVolumeSoon.
func (s *Store) DeleteSnapshotSoon(id string) error { return snapshotTable.delete(s.writeSoon, id) }

// SnapshotRecord is GetSnapshot that also returns a snapshot marked
// Deleting.
func (s *Store) SnapshotRecord(id string) (Snapshot, error) { return snapshotTable.getAny(s, id) }

// SnapshotRecordByName is SnapshotByName that also returns a snapshot
// marked Deleting.
func (s *Store) SnapshotRecordByName(name string) (Snapshot, error) {
	return snapshotTable.byNameAny(s, name)
}

// MarkSnapshotDeleting sets Deleting on the snapshot's record and returns
// once that is durable, as MarkVolumeDeleting: from then on the snapshot
// is gone to every reader but SnapshotRecord, SnapshotRecordByName and
// DeletingSnapshots.
func (s *Store) MarkSnapshotDeleting(id string) error {
	if err := snapshotTable.markHidden(s, id); err != nil {
		return fmt.Errorf("mark snapshot %s deleting: %w", id, err)
	}
	return nil
}

// DeletingSnapshots returns every snapshot marked Deleting: the deletions
// start-up finishes. It reads the snapshots_deleting index, so its cost is
// that of the marked snapshots, whatever the number of snapshots.
func (s *Store) DeletingSnapshots() ([]Snapshot, error) {
	snaps, err := snapshotTable.allHidden(s)
	if err != nil {
		return nil, fmt.Errorf("list snapshots being deleted: %w", err)
	}
	return snaps, nil
}

// SnapshotFilter narrows ListSnapshots as CSI's ListSnapshotsRequest does.
// Empty fields do not filter.
type SnapshotFilter struct {
	SnapshotID     string
	SourceVolumeID string
}

// ListSnapshots returns up to max snapshots (0: all) in ID order that match
// f, starting at startToken ("" for the first page), and the token of the
// next page, "" after the last. A token is only valid with the filter it
// was issued for.
func (s *Store) ListSnapshots(f SnapshotFilter, startToken string, max int) (snaps []Snapshot, next string, err error) {
	switch {
	case f.SnapshotID == "" && f.SourceVolumeID == "":
		return snapshotTable.list(s, nil, startToken, max)
	case f.SnapshotID != "":
		snaps, err = s.oneSnapshot(f, startToken, max)
	default: // by source volume
		next, err = s.page(listSnapshotsBySource, bucketSnapshotSource, prefixKey(f.SourceVolumeID, ""), startToken, max,
			func(tx *txn, k, _ []byte) error {
				_, id, err := splitPrefixKey(k)
				if err != nil {
					return corrupt("snapshot source index", string(k), err)
				}
				b := tx.Bucket(bucketSnapshots).Get([]byte(id))
				if b == nil {
					return corrupt("snapshot source index", string(k), fmt.Errorf("indexes missing snapshot %s", id))
				}
				v, err := snapshotTable.decodeAt(id, b)
				if err != nil {
					return err
				}
				if v.Deleting {
					return errSkip
				}
				snaps = append(snaps, v)
				return nil
			})
	}
	if err != nil {
		return nil, "", fmt.Errorf("list snapshots: %w", err)
	}
	return snaps, next, nil
}

// oneSnapshot answers a listing filtered by snapshot ID: at most one entry
// and never a next page, so any token is foreign to it.
func (s *Store) oneSnapshot(f SnapshotFilter, token string, max int) ([]Snapshot, error) {
	if token != "" {
		return nil, ErrBadToken
	}
	if max < 0 {
		return nil, abi.Errorf(abi.InvalidArgument, "negative max entries")
	}
	v, err := s.GetSnapshot(f.SnapshotID)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case f.SourceVolumeID != "" && v.SourceVolumeID != f.SourceVolumeID:
		return nil, nil
	}
	return []Snapshot{v}, nil
}
