package state

import "fmt"

// The node's records have no name index. A stage is kept by volume ID, a
// publication by volume ID and target path (prefixKey), so that a prefix
// scan finds one volume's publications.
var (
	stageTable = &table[Stage, *Stage]{
		kind: "stage", kinds: "stages", bucket: bucketStages, listing: listStages,
		check: func(v *Stage) error { return checkKey("volume ID", v.VolumeID) },
		key:   func(v *Stage) string { return v.VolumeID },
	}
	publishTable = &table[Publish, *Publish]{
		kind: "publish", kinds: "publishes", bucket: bucketPublishes, listing: listPublishes,
		check: checkPublish,
		key:   func(p *Publish) string { return publishKey(p.VolumeID, p.TargetPath) },
		label: func(key string) string {
			volumeID, targetPath, err := splitPrefixKey([]byte(key))
			if err != nil {
				return fmt.Sprintf("%q", key)
			}
			return volumeID + " at " + targetPath
		},
	}
)

func checkPublish(p *Publish) error {
	if err := checkKey("volume ID", p.VolumeID); err != nil {
		return err
	}
	return checkKey("target path", p.TargetPath)
}

func publishKey(volumeID, targetPath string) string {
	return string(prefixKey(volumeID, targetPath))
}

// PutStage records that volume st.VolumeID is staged on this node,
// replacing any earlier record for it, and returns once it is durable.
func (s *Store) PutStage(st Stage) error { return stageTable.put(s.write, st, false) }

// PutStageAsync is PutStage that does not wait for the disk: readers see
// the record at once, and wait returns when it is durable (or why it cannot
// be). It lets the caller do the node's slow work (a mount, say) while the
// record is being synced, and answer once both are done. A refused record
// is an error at once, and nothing was written.
func (s *Store) PutStageAsync(st Stage) (wait func() error, err error) {
	return stageTable.putAsync(s, st)
}

// GetStage returns the stage record of a volume, or ErrNotFound.
func (s *Store) GetStage(volumeID string) (Stage, error) { return stageTable.get(s, volumeID) }

// DeleteStage removes the stage record of a volume, or returns ErrNotFound.
func (s *Store) DeleteStage(volumeID string) error { return stageTable.delete(s.write, volumeID) }

// DeleteStageSoon is DeleteStage that does not wait for the disk, nor make
// it work at once: the deletion is visible at once and reaches the disk
// with the next waited write's sync or the checkpoint within a second.
// Unlike PutStageAsync it returns nothing to wait for: it is for deletions
// the node service need not wait for (host/RATIONALE.md, "Records").
func (s *Store) DeleteStageSoon(volumeID string) error {
	return stageTable.delete(s.writeSoon, volumeID)
}

// ListStages returns up to max stage records (0: all) in volume ID order,
// starting at startToken, and the token of the next page, "" after the last.
func (s *Store) ListStages(startToken string, max int) ([]Stage, string, error) {
	return stageTable.list(s, nil, startToken, max)
}

// PutPublishAsync records that volume p.VolumeID is published at
// p.TargetPath on this node, replacing any earlier record for that pair.
// Like PutStageAsync it does not wait for the disk: wait does.
func (s *Store) PutPublishAsync(p Publish) (wait func() error, err error) {
	return publishTable.putAsync(s, p)
}

// PutPublishSoon is PutPublishAsync with nothing to wait for: the record
// is visible at once and reaches the disk as DeleteStageSoon's deletion
// does. NodePublish uses it: start-up rebuilds a lost publication record
// from the mount table (host/RATIONALE.md, "Records").
func (s *Store) PutPublishSoon(p Publish) error {
	return publishTable.put(s.writeSoon, p, false)
}

// GetPublish returns the publish record of a volume at a target path, or
// ErrNotFound.
func (s *Store) GetPublish(volumeID, targetPath string) (Publish, error) {
	return publishTable.get(s, publishKey(volumeID, targetPath))
}

// DeletePublish removes the publish record of a volume at a target path, or
// returns ErrNotFound.
func (s *Store) DeletePublish(volumeID, targetPath string) error {
	return publishTable.delete(s.write, publishKey(volumeID, targetPath))
}

// DeletePublishSoon is DeletePublish that does not wait for the disk; see
// DeleteStageSoon.
func (s *Store) DeletePublishSoon(volumeID, targetPath string) error {
	return publishTable.delete(s.writeSoon, publishKey(volumeID, targetPath))
}

// PublishesOf returns every publish record of a volume, in target path
// order; NodeUnstageVolume uses it to refuse unstaging a volume still
// published.
func (s *Store) PublishesOf(volumeID string) ([]Publish, error) {
	pubs, _, err := publishTable.list(s, prefixKey(volumeID, ""), "", 0)
	if err != nil {
		return nil, fmt.Errorf("publishes of %s: %w", volumeID, err)
	}
	return pubs, nil
}

// ListPublishes returns up to max publish records (0: all) in key order
// (grouped by volume, by target path within a volume), starting at
// startToken, and the token of the next page, "" after the last.
func (s *Store) ListPublishes(startToken string, max int) ([]Publish, string, error) {
	return publishTable.list(s, nil, startToken, max)
}
