package state

import "fmt"

const volumeNameField = 2

var volumeTable = &table[Volume]{
	kind: "volume", bucket: bucketVolumes,
	encode: encodeVolume, decode: decodeVolume, check: checkVolume,
	id:    func(v *Volume) string { return v.ID },
	names: bucketVolumeNames, name: func(v *Volume) string { return v.Name }, nameField: volumeNameField,
}

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
func (s *Store) PutVolume(v Volume) error { return volumeTable.put(s, v, false) }

// InsertVolume records a new volume: as PutVolume, but it fails with
// ErrIDTaken, and writes nothing, when v.ID is already recorded (under any
// name), in the same transaction as the write.
func (s *Store) InsertVolume(v Volume) error { return volumeTable.put(s, v, true) }

// GetVolume returns the volume with the given ID, or ErrNotFound.
func (s *Store) GetVolume(id string) (Volume, error) { return volumeTable.get(s, id) }

// VolumeByName returns the volume with the given name, or ErrNotFound.
func (s *Store) VolumeByName(name string) (Volume, error) { return volumeTable.byName(s, name) }

// DeleteVolume removes the volume and its name index entry, or returns
// ErrNotFound (which an idempotent DeleteVolume treats as success). Its
// snapshots stay.
func (s *Store) DeleteVolume(id string) error { return volumeTable.delete(s.write, id) }

// ListVolumes returns up to max volumes (0: all) in ID order, starting at
// startToken ("" for the first page), and the token of the next page, ""
// after the last.
func (s *Store) ListVolumes(startToken string, max int) (vols []Volume, next string, err error) {
	next, err = s.page(listVolumes, bucketVolumes, nil, startToken, max, volumeTable.collect(&vols))
	if err != nil {
		return nil, "", fmt.Errorf("list volumes: %w", err)
	}
	return vols, next, nil
}
