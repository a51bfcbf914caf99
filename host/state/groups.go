package state

var groupTable = &table[Group, *Group]{
	kind: "group", bucket: bucketGroups, check: checkGroup,
	key: func(g *Group) string { return g.ID },
}

func checkGroup(g *Group) error {
	if err := checkKey("group ID", g.ID); err != nil {
		return err
	}
	if g.Name != "" {
		return checkKey("group name", g.Name)
	}
	return nil
}

// PutGroup creates or replaces the volume group snapshot g.ID. The member
// snapshots are separate records (PutSnapshot). Groups have no name index:
// the host derives a group's ID from its name, so the ID is the lookup.
func (s *Store) PutGroup(g Group) error { return groupTable.put(s.write, g, false) }

// GetGroup returns the group with the given ID, or ErrNotFound.
func (s *Store) GetGroup(id string) (Group, error) { return groupTable.get(s, id) }

// DeleteGroup removes the group, or returns ErrNotFound. Its member
// snapshots stay.
func (s *Store) DeleteGroup(id string) error { return groupTable.delete(s.write, id) }
