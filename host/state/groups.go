package state

import "fmt"

// PutGroup creates or replaces the volume group snapshot g.ID. The member
// snapshots are separate records (PutSnapshot). Groups have no name index:
// the host derives a group's ID from its name, so the ID is the lookup.
func (s *Store) PutGroup(g Group) error {
	if err := checkKey("group ID", g.ID); err != nil {
		return err
	}
	if g.Name != "" {
		if err := checkKey("group name", g.Name); err != nil {
			return err
		}
	}
	val, err := encodeGroup(&g)
	if err != nil {
		return fmt.Errorf("put group %s: %w", g.ID, invalid(err))
	}
	err = s.write(func(tx *txn) error {
		return tx.Bucket(bucketGroups).Put([]byte(g.ID), val)
	})
	if err != nil {
		return fmt.Errorf("put group %s: %w", g.ID, err)
	}
	return nil
}

// GetGroup returns the group with the given ID, or ErrNotFound.
func (s *Store) GetGroup(id string) (Group, error) {
	var g Group
	found, err := s.get(bucketGroups, []byte(id), func(b []byte) (err error) {
		if g, err = decodeGroup(b); err != nil {
			return corrupt("group", id, err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Group{}, fmt.Errorf("group %s: %w", id, err)
	}
	return g, nil
}

// DeleteGroup removes the group, or returns ErrNotFound. Its member
// snapshots stay.
func (s *Store) DeleteGroup(id string) error {
	err := s.write(func(tx *txn) error {
		groups := tx.Bucket(bucketGroups)
		old := groups.Get([]byte(id))
		if old == nil {
			return refuse(ErrNotFound)
		}
		return groups.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("delete group %s: %w", id, err)
	}
	return nil
}
