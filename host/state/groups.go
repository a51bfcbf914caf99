package state

import "fmt"

const groupNameField = 2

// PutGroup creates or replaces the volume group snapshot g.ID and its name
// index entry. It fails with ErrNameTaken if g.Name belongs to another group.
// The member snapshots are separate records (PutSnapshot).
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
		groups := tx.Bucket(bucketGroups)
		id := []byte(g.ID)
		index, err := nameIndex(tx.Bucket(bucketGroupNames), g.ID, g.Name, groups.Get(id), groupNameField)
		if err != nil {
			return err
		}
		if err := index(); err != nil {
			return err
		}
		return groups.Put(id, val)
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

// GroupByName returns the group with the given name, or ErrNotFound.
func (s *Store) GroupByName(name string) (Group, error) {
	var g Group
	var found bool
	err := s.view(func(tx *txn) error {
		id := tx.Bucket(bucketGroupNames).Get([]byte(name))
		if id == nil {
			return nil
		}
		b := tx.Bucket(bucketGroups).Get(id)
		if b == nil {
			return corrupt("group name index", name, fmt.Errorf("names missing group %s", id))
		}
		found = true
		var err error
		if g, err = decodeGroup(b); err != nil {
			return corrupt("group", string(id), err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Group{}, fmt.Errorf("group named %q: %w", name, err)
	}
	return g, nil
}

// DeleteGroup removes the group and its name index entry, or returns
// ErrNotFound. Its member snapshots stay.
func (s *Store) DeleteGroup(id string) error {
	err := s.write(func(tx *txn) error {
		groups := tx.Bucket(bucketGroups)
		old := groups.Get([]byte(id))
		if old == nil {
			return refuse(ErrNotFound)
		}
		if err := dropName(tx.Bucket(bucketGroupNames), id, old, groupNameField); err != nil {
			return err
		}
		return groups.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("delete group %s: %w", id, err)
	}
	return nil
}

// ListGroups returns up to max groups (0: all) in ID order, starting at
// startToken, and the token of the next page, "" after the last.
func (s *Store) ListGroups(startToken string, max int) (groups []Group, next string, err error) {
	next, err = s.page(listGroups, bucketGroups, nil, startToken, max, func(_ *txn, k, b []byte) error {
		g, err := decodeGroup(b)
		if err != nil {
			return corrupt("group", string(k), err)
		}
		groups = append(groups, g)
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("list groups: %w", err)
	}
	return groups, next, nil
}
