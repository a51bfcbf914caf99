package state

import "fmt"

const volumeNameField = 2

var volumeTable = &table[Volume, *Volume]{
	kind: "volume", kinds: "volumes", bucket: bucketVolumes, listing: listVolumes, check: checkVolume,
	key:   func(v *Volume) string { return v.ID },
	names: bucketVolumeNames, name: func(v *Volume) string { return v.Name }, nameField: volumeNameField,
	hidden:      func(v *Volume) bool { return v.Deleting },
	hide:        func(v *Volume) { v.Deleting = true },
	hiddenIndex: bucketVolumesDeleting,
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
func (s *Store) PutVolume(v Volume) error { return volumeTable.put(s.write, v, false) }

// InsertVolume records a new volume: as PutVolume, but it fails with
// ErrIDTaken, and writes nothing, when v.ID is already recorded (under any
// name), in the same transaction as the write.
func (s *Store) InsertVolume(v Volume) error { return volumeTable.put(s.write, v, true) }

// InsertVolumeSoon is InsertVolume that returns once readers see the
// record, without waiting for the disk: for a record whose intent is
// logged durably, so that start-up rebuilds it if a crash loses it.
func (s *Store) InsertVolumeSoon(v Volume) error { return volumeTable.put(s.writeSoon, v, true) }

// GetVolume returns the volume with the given ID, or ErrNotFound, also
// for a volume marked Deleting.
func (s *Store) GetVolume(id string) (Volume, error) { return volumeTable.get(s, id) }

// VolumeByName returns the volume with the given name, or ErrNotFound,
// also for a volume marked Deleting.
func (s *Store) VolumeByName(name string) (Volume, error) { return volumeTable.byName(s, name) }

// VolumeRecord is GetVolume that also returns a volume marked Deleting.
func (s *Store) VolumeRecord(id string) (Volume, error) { return volumeTable.getAny(s, id) }

// VolumeRecordByName is VolumeByName that also returns a volume marked
// Deleting.
func (s *Store) VolumeRecordByName(name string) (Volume, error) {
	return volumeTable.byNameAny(s, name)
}

// VolumeIntentKey is the key of the intent of a CreateVolume of name.
func VolumeIntentKey(name string) string { return "volume/" + name }

// MarkVolumeDeleting sets Deleting on the volume's record and returns
// once that is durable. From then on the volume is gone to every reader
// but VolumeRecord, VolumeRecordByName and DeletingVolumes, and it keeps
// its name until DeleteVolumeSoon removes it.
func (s *Store) MarkVolumeDeleting(id string) error {
	if err := volumeTable.markHidden(s, id); err != nil {
		return fmt.Errorf("mark volume %s deleting: %w", id, err)
	}
	return nil
}

// DeletingVolumes returns every volume marked Deleting: the deletions
// start-up finishes. It reads the volumes_deleting index, so its cost is
// that of the marked volumes, whatever the number of volumes.
func (s *Store) DeletingVolumes() ([]Volume, error) {
	vols, err := volumeTable.allHidden(s)
	if err != nil {
		return nil, fmt.Errorf("list volumes being deleted: %w", err)
	}
	return vols, nil
}

// DeleteVolume removes the volume and its name index entry, or returns
// ErrNotFound (which an idempotent DeleteVolume treats as success). Its
// snapshots stay.
func (s *Store) DeleteVolume(id string) error { return volumeTable.delete(s.write, id) }

// DeleteVolumeSoon is DeleteVolume that does not wait for the disk: for a
// volume marked Deleting, whose deletion start-up finishes if a crash
// loses the removal.
func (s *Store) DeleteVolumeSoon(id string) error { return volumeTable.delete(s.writeSoon, id) }

// ListVolumes returns up to max volumes (0: all) in ID order, starting at
// startToken ("" for the first page), and the token of the next page, ""
// after the last.
func (s *Store) ListVolumes(startToken string, max int) ([]Volume, string, error) {
	return volumeTable.list(s, nil, startToken, max)
}
