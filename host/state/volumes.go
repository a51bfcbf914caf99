package state

import (
	"fmt"
)

const volumeNameField = 2

func checkVolume(v *Volume) error {
	if err := checkKey("volume ID", v.ID); err != nil {
		return err
	}
	if v.Name != "" {
		return checkKey("volume name", v.Name)
	}
	return nil
}

// PutVolume creates or replaces the volume v.ID and its name index entry. It
// fails with ErrNameTaken if v.Name belongs to another volume.
func (s *Store) PutVolume(v Volume) error {
	if err := checkVolume(&v); err != nil {
		return err
	}
	val, err := encodeVolume(&v)
	if err != nil {
		return fmt.Errorf("put volume %s: %w", v.ID, invalid(err))
	}
	err = s.write(func(tx *txn) error { return putVolume(tx, &v, val) })
	if err != nil {
		return fmt.Errorf("put volume %s: %w", v.ID, err)
	}
	return nil
}

// InsertVolume records a new volume: as PutVolume, but it fails with
// ErrIDTaken, and writes nothing, when v.ID is already recorded (under any
// name), in the same transaction as the write.
func (s *Store) InsertVolume(v Volume) error {
	if err := checkVolume(&v); err != nil {
		return err
	}
	val, err := encodeVolume(&v)
	if err != nil {
		return fmt.Errorf("insert volume %s: %w", v.ID, invalid(err))
	}
	err = s.write(func(tx *txn) error {
		if tx.Bucket(bucketVolumes).Get([]byte(v.ID)) != nil {
			return refuse(ErrIDTaken)
		}
		return putVolume(tx, &v, val)
	})
	if err != nil {
		return fmt.Errorf("insert volume %s: %w", v.ID, err)
	}
	return nil
}

func putVolume(tx *txn, v *Volume, val []byte) error {
	vols := tx.Bucket(bucketVolumes)
	id := []byte(v.ID)
	index, err := nameIndex(tx.Bucket(bucketVolumeNames), v.ID, v.Name, vols.Get(id), volumeNameField)
	if err != nil {
		return err
	}
	if err := index(); err != nil {
		return err
	}
	return vols.Put(id, val)
}

// GetVolume returns the volume with the given ID, or ErrNotFound.
func (s *Store) GetVolume(id string) (Volume, error) {
	var v Volume
	found, err := s.get(bucketVolumes, []byte(id), func(b []byte) (err error) {
		if v, err = decodeVolume(b); err != nil {
			return corrupt("volume", id, err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	return v, nil
}

// VolumeByName returns the volume with the given name, or ErrNotFound.
func (s *Store) VolumeByName(name string) (Volume, error) {
	var v Volume
	var found bool
	err := s.view(func(tx *txn) error {
		id := tx.Bucket(bucketVolumeNames).Get([]byte(name))
		if id == nil {
			return nil
		}
		b := tx.Bucket(bucketVolumes).Get(id)
		if b == nil {
			return corrupt("volume name index", name, fmt.Errorf("names missing volume %s", id))
		}
		found = true
		var err error
		if v, err = decodeVolume(b); err != nil {
			return corrupt("volume", string(id), err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Volume{}, fmt.Errorf("volume named %q: %w", name, err)
	}
	return v, nil
}

// DeleteVolume removes the volume and its name index entry, or returns
// ErrNotFound (which an idempotent DeleteVolume treats as success). Its
// snapshots stay.
func (s *Store) DeleteVolume(id string) error {
	err := s.write(func(tx *txn) error {
		vols := tx.Bucket(bucketVolumes)
		old := vols.Get([]byte(id))
		if old == nil {
			return refuse(ErrNotFound)
		}
		if err := dropName(tx.Bucket(bucketVolumeNames), id, old, volumeNameField); err != nil {
			return err
		}
		return vols.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}

// ListVolumes returns up to max volumes (0: all) in ID order, starting at
// startToken ("" for the first page), and the token of the next page, ""
// after the last.
func (s *Store) ListVolumes(startToken string, max int) (vols []Volume, next string, err error) {
	next, err = s.page(listVolumes, bucketVolumes, nil, startToken, max, func(_ *txn, k, b []byte) error {
		v, err := decodeVolume(b)
		if err != nil {
			return corrupt("volume", string(k), err)
		}
		vols = append(vols, v)
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("list volumes: %w", err)
	}
	return vols, next, nil
}
