package state

import "fmt"

// The node's records are written asynchronously (PutStageAsync) and have no
// name index; they share the tables' reads and deletes.
var (
	stageTable   = &table[Stage]{kind: "stage", bucket: bucketStages, decode: decode[Stage]}
	publishTable = &table[Publish]{kind: "publish", bucket: bucketPublishes, decode: decode[Publish]}
)

// PutStage records that volume st.VolumeID is staged on this node,
// replacing any earlier record for it.
func (s *Store) PutStage(st Stage) error {
	wait, err := s.PutStageAsync(st)
	if err != nil {
		return err
	}
	if err := wait(); err != nil {
		return fmt.Errorf("put stage %s: %w", st.VolumeID, err)
	}
	return nil
}

// PutStageAsync is PutStage that does not wait for the disk: readers see
// the record at once, and wait returns when it is durable (or why it cannot
// be). It lets the caller do the node's slow work (a mount, say) while the
// record is being synced, and answer once both are done. A refused record
// is an error at once, and nothing was written.
func (s *Store) PutStageAsync(st Stage) (wait func() error, err error) {
	if err := checkKey("volume ID", st.VolumeID); err != nil {
		return nil, err
	}
	val, err := encode[Stage](&st)
	if err != nil {
		return nil, fmt.Errorf("put stage %s: %w", st.VolumeID, invalid(err))
	}
	wait, err = s.writeAsync(func(tx *txn) error {
		return tx.Bucket(bucketStages).Put([]byte(st.VolumeID), val)
	})
	if err != nil {
		return nil, fmt.Errorf("put stage %s: %w", st.VolumeID, err)
	}
	return wait, nil
}

// GetStage returns the stage record of a volume, or ErrNotFound.
func (s *Store) GetStage(volumeID string) (Stage, error) { return stageTable.get(s, volumeID) }

// DeleteStage removes the stage record of a volume, or returns ErrNotFound.
func (s *Store) DeleteStage(volumeID string) error {
	return s.deleteStage(volumeID, s.write)
}

// DeleteStageSoon is DeleteStage that does not wait for the disk, nor make
// it work at once: the deletion is visible at once and reaches the disk
// with the next waited write's sync or the checkpoint within a second.
// Unlike PutStageAsync it returns nothing to wait for: it is for deletions
// the node service need not wait for (host/RATIONALE.md, "Records").
func (s *Store) DeleteStageSoon(volumeID string) error {
	return s.deleteStage(volumeID, s.writeSoon)
}

func (s *Store) deleteStage(volumeID string, write func(func(tx *txn) error) error) error {
	return stageTable.delete(write, volumeID)
}

// ListStages returns up to max stage records (0: all) in volume ID order,
// starting at startToken, and the token of the next page, "" after the last.
func (s *Store) ListStages(startToken string, max int) (stages []Stage, next string, err error) {
	next, err = s.page(listStages, bucketStages, nil, startToken, max, stageTable.collect(&stages))
	if err != nil {
		return nil, "", fmt.Errorf("list stages: %w", err)
	}
	return stages, next, nil
}

// PutPublishAsync records that volume p.VolumeID is published at
// p.TargetPath on this node, replacing any earlier record for that pair.
// Like PutStageAsync it does not wait for the disk: wait does.
func (s *Store) PutPublishAsync(p Publish) (wait func() error, err error) {
	if err := checkKey("volume ID", p.VolumeID); err != nil {
		return nil, err
	}
	if err := checkKey("target path", p.TargetPath); err != nil {
		return nil, err
	}
	val, err := encode[Publish](&p)
	if err != nil {
		return nil, fmt.Errorf("put publish %s at %s: %w", p.VolumeID, p.TargetPath, invalid(err))
	}
	key := prefixKey(p.VolumeID, p.TargetPath)
	wait, err = s.writeAsync(func(tx *txn) error {
		return tx.Bucket(bucketPublishes).Put(key, val)
	})
	if err != nil {
		return nil, fmt.Errorf("put publish %s at %s: %w", p.VolumeID, p.TargetPath, err)
	}
	return wait, nil
}

// GetPublish returns the publish record of a volume at a target path, or
// ErrNotFound.
func (s *Store) GetPublish(volumeID, targetPath string) (Publish, error) {
	var p Publish
	found, err := s.get(bucketPublishes, prefixKey(volumeID, targetPath), func(b []byte) (err error) {
		if p, err = decode[Publish](b); err != nil {
			return corrupt("publish", volumeID+" at "+targetPath, err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Publish{}, fmt.Errorf("publish %s at %s: %w", volumeID, targetPath, err)
	}
	return p, nil
}

// DeletePublish removes the publish record of a volume at a target path, or
// returns ErrNotFound.
func (s *Store) DeletePublish(volumeID, targetPath string) error {
	return s.deletePublish(volumeID, targetPath, s.write)
}

// DeletePublishSoon is DeletePublish that does not wait for the disk; see
// DeleteStageSoon.
func (s *Store) DeletePublishSoon(volumeID, targetPath string) error {
	return s.deletePublish(volumeID, targetPath, s.writeSoon)
}

func (s *Store) deletePublish(volumeID, targetPath string, write func(func(tx *txn) error) error) error {
	key := prefixKey(volumeID, targetPath)
	err := write(func(tx *txn) error {
		b := tx.Bucket(bucketPublishes)
		if b.Get(key) == nil {
			return refuse(ErrNotFound)
		}
		return b.Delete(key)
	})
	if err != nil {
		return fmt.Errorf("delete publish %s at %s: %w", volumeID, targetPath, err)
	}
	return nil
}

// PublishesOf returns every publish record of a volume, in target path
// order; NodeUnstageVolume uses it to refuse unstaging a volume still
// published.
func (s *Store) PublishesOf(volumeID string) ([]Publish, error) {
	pubs, _, err := s.listPublishes(prefixKey(volumeID, ""), "", 0)
	if err != nil {
		return nil, fmt.Errorf("publishes of %s: %w", volumeID, err)
	}
	return pubs, nil
}

// ListPublishes returns up to max publish records (0: all) in key order
// (grouped by volume, by target path within a volume), starting at
// startToken, and the token of the next page, "" after the last.
func (s *Store) ListPublishes(startToken string, max int) (pubs []Publish, next string, err error) {
	pubs, next, err = s.listPublishes(nil, startToken, max)
	if err != nil {
		return nil, "", fmt.Errorf("list publishes: %w", err)
	}
	return pubs, next, nil
}

func (s *Store) listPublishes(prefix []byte, startToken string, max int) (pubs []Publish, next string, err error) {
	next, err = s.page(listPublishes, bucketPublishes, prefix, startToken, max, publishTable.collect(&pubs))
	return pubs, next, err
}
