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
func (s *Store) PutSnapshot(v Snapshot) error {
	if err := checkSnapshot(&v); err != nil {
		return err
	}
	val, err := encodeSnapshot(&v)
	if err != nil {
		return fmt.Errorf("put snapshot %s: %w", v.ID, invalid(err))
	}
	err = s.write(func(tx *txn) error { return putSnapshot(tx, &v, val) })
	if err != nil {
		return fmt.Errorf("put snapshot %s: %w", v.ID, err)
	}
	return nil
}

// InsertSnapshot records a new snapshot: as PutSnapshot, but it fails with
// ErrIDTaken, and writes nothing, when v.ID is already recorded.
func (s *Store) InsertSnapshot(v Snapshot) error {
	if err := checkSnapshot(&v); err != nil {
		return err
	}
	val, err := encodeSnapshot(&v)
	if err != nil {
		return fmt.Errorf("insert snapshot %s: %w", v.ID, invalid(err))
	}
	err = s.write(func(tx *txn) error {
		if tx.Bucket(bucketSnapshots).Get([]byte(v.ID)) != nil {
			return refuse(ErrIDTaken)
		}
		return putSnapshot(tx, &v, val)
	})
	if err != nil {
		return fmt.Errorf("insert snapshot %s: %w", v.ID, err)
	}
	return nil
}

func putSnapshot(tx *txn, v *Snapshot, val []byte) error {
	snaps := tx.Bucket(bucketSnapshots)
	id := []byte(v.ID)
	old := snaps.Get(id)
	index, err := nameIndex(tx.Bucket(bucketSnapshotNames), v.ID, v.Name, old, snapshotNameField)
	if err != nil {
		return err
	}
	var oldSource string
	if old != nil {
		if oldSource, err = stringField(old, snapshotSourceField); err != nil {
			return corrupt("snapshot", v.ID, err)
		}
	}
	if err := index(); err != nil {
		return err
	}
	if oldSource != v.SourceVolumeID {
		bySource := tx.Bucket(bucketSnapshotSource)
		if oldSource != "" {
			if err := bySource.Delete(prefixKey(oldSource, v.ID)); err != nil {
				return err
			}
		}
		if v.SourceVolumeID != "" {
			if err := bySource.Put(prefixKey(v.SourceVolumeID, v.ID), nil); err != nil {
				return err
			}
		}
	}
	return snaps.Put(id, val)
}

// GetSnapshot returns the snapshot with the given ID, or ErrNotFound.
func (s *Store) GetSnapshot(id string) (Snapshot, error) {
	var v Snapshot
	found, err := s.get(bucketSnapshots, []byte(id), func(b []byte) (err error) {
		if v, err = decodeSnapshot(b); err != nil {
			return corrupt("snapshot", id, err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return v, nil
}

// SnapshotByName returns the snapshot with the given name, or ErrNotFound.
func (s *Store) SnapshotByName(name string) (Snapshot, error) {
	var v Snapshot
	var found bool
	err := s.view(func(tx *txn) error {
		id := tx.Bucket(bucketSnapshotNames).Get([]byte(name))
		if id == nil {
			return nil
		}
		b := tx.Bucket(bucketSnapshots).Get(id)
		if b == nil {
			return corrupt("snapshot name index", name, fmt.Errorf("names missing snapshot %s", id))
		}
		found = true
		var err error
		if v, err = decodeSnapshot(b); err != nil {
			return corrupt("snapshot", string(id), err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot named %q: %w", name, err)
	}
	return v, nil
}

// DeleteSnapshot removes the snapshot and its index entries, or returns
// ErrNotFound.
func (s *Store) DeleteSnapshot(id string) error {
	err := s.write(func(tx *txn) error {
		snaps := tx.Bucket(bucketSnapshots)
		old := snaps.Get([]byte(id))
		if old == nil {
			return refuse(ErrNotFound)
		}
		source, err := stringField(old, snapshotSourceField)
		if err != nil {
			return corrupt("snapshot", id, err)
		}
		if err := dropName(tx.Bucket(bucketSnapshotNames), id, old, snapshotNameField); err != nil {
			return err
		}
		if source != "" {
			if err := tx.Bucket(bucketSnapshotSource).Delete(prefixKey(source, id)); err != nil {
				return err
			}
		}
		return snaps.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return nil
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
	case f.SnapshotID != "":
		snaps, err = s.oneSnapshot(f, startToken, max)
	case f.SourceVolumeID != "":
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
				v, err := decodeSnapshot(b)
				if err != nil {
					return corrupt("snapshot", id, err)
				}
				snaps = append(snaps, v)
				return nil
			})
	default:
		next, err = s.page(listSnapshots, bucketSnapshots, nil, startToken, max, func(_ *txn, k, b []byte) error {
			v, err := decodeSnapshot(b)
			if err != nil {
				return corrupt("snapshot", string(k), err)
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
