package host

import (
	"context"
	"errors"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// Storage no record explains. A module whose storage lives outside pool
// folders (LVM's volume groups) can be left holding a volume or snapshot
// the daemon never recorded: a create_snapshot whose record a crash cut
// off (CreateSnapshot logs no intent), a create the module answered with
// an error after its storage was made. Start-up asks each backend that
// has list_owned for what its storage holds, after the logged creates and
// marked deletions are finished (replay.go), and looks every item up by
// key: a volume or snapshot record under any of the IDs this daemon gives
// it, or, for a volume, a logged create of its name that start-up could
// not finish. What nothing explains is reported, and with
// reconcile.clean_storage (a switch of its own: deleting storage is not
// releasing a mount) deleted through the module, unless a record of any
// backend or node names the same local ID: two modules granted one
// volume group, a renamed module or a changed node ID leave records under
// other IDs, and those items are reported, never deleted. The module lists
// only its own storage (the lvm family shows it no LV without its tag).
// The cost is one module call and a key lookup per item of the backends
// that have list_owned, and with clean_storage one pass over the records.

// sweepOwned runs the check for every loaded backend with list_owned.
func (s *Server) sweepOwned(ctx context.Context) []Finding {
	set := s.backends.Load()
	if set == nil {
		return nil
	}
	var out []Finding
	for _, name := range set.names {
		b, ok := set.get(name)
		if !ok || !b.has(abi.OpListOwned) {
			continue
		}
		if b.info.Ephemeral {
			// Inline volumes are recorded elsewhere (ephemeral_volumes),
			// per node; the check does not cover them.
			s.log.Warn("list_owned skipped: the backend serves inline volumes", "backend", name)
			continue
		}
		found, err := s.sweepBackend(ctx, b)
		if err != nil {
			s.log.Error("check the storage of a backend against the records", "backend", name, "err", err)
		}
		out = append(out, found...)
	}
	return out
}

func (s *Server) sweepBackend(ctx context.Context, b *backend) ([]Finding, error) {
	var resp abi.ListOwnedResponse
	if err := b.call(ctx, abi.OpListOwned, &abi.ListOwnedRequest{}, &resp); err != nil {
		return nil, err
	}
	// Unfinished creates of this backend: a nameless item may be one.
	intents, err := s.store.ListIntents()
	if err != nil {
		return nil, err
	}
	pending := map[string]bool{}
	for _, in := range intents {
		if in.Backend == b.name {
			pending[in.Key] = true
		}
	}
	clean := s.cfg.Reconcile.CleanStorage
	var elsewhere map[string]bool // local IDs any record names, for clean
	var out []Finding
	for _, it := range resp.Items {
		recorded, err := s.recorded(b.name, &it)
		if err != nil {
			return out, err
		}
		if recorded {
			continue
		}
		if !it.Snapshot && (it.Name == "" && len(pending) > 0 || it.Name != "" && pending[state.VolumeIntentKey(it.Name)]) {
			s.log.Warn("storage of a logged create kept for its next try", "backend", b.name, "local", it.LocalID, "name", it.Name)
			continue
		}
		kind, what := "orphan-volume", "volume"
		if it.Snapshot {
			kind, what = "orphan-snapshot", "snapshot"
		}
		f := Finding{Kind: kind, Path: b.name + idSeparator + it.LocalID,
			Detail: "the module's storage holds a " + what + " no record names (CO name " + quoteName(it.Name) + ")"}
		if clean && elsewhere == nil {
			if elsewhere, err = s.recordedLocalIDs(); err != nil {
				return out, err
			}
		}
		if clean && elsewhere[it.LocalID] {
			f.Detail += "; kept: a record of another backend or node names the same local ID"
		} else if clean {
			var err error
			if it.Snapshot {
				err = b.call(ctx, abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: abi.SnapshotRef{LocalID: it.LocalID, Context: it.Context, SizeBytes: it.SizeBytes}}, &abi.Empty{})
			} else {
				err = b.call(ctx, abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: it.LocalID, Context: it.Context, CapacityBytes: it.SizeBytes}}, &abi.Empty{})
			}
			if err != nil {
				f.Detail += "; removing it failed: " + err.Error()
			} else {
				f.Detail += "; removed"
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// recorded reports whether a volume or snapshot record names the item,
// under the ID this daemon gives it with its node tag in either form or
// without one (another role's records).
func (s *Server) recorded(backend string, it *abi.OwnedItem) (bool, error) {
	tags := []string{"", s.tag.hashed}
	if s.tag.readable != "" {
		tags = append(tags, s.tag.readable)
	}
	for _, tag := range tags {
		id := makeID(backend, tag, it.LocalID)
		var err error
		if it.Snapshot {
			_, err = s.store.GetSnapshot(id)
		} else {
			_, err = s.store.GetVolume(id)
		}
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, state.ErrNotFound):
			return false, err
		}
	}
	return false, nil
}

// recordedLocalIDs returns the local ID of every volume and snapshot
// record, whatever its backend and node tag.
func (s *Server) recordedLocalIDs() (map[string]bool, error) {
	ids := map[string]bool{}
	for tok := ""; ; {
		vols, next, err := s.store.ListVolumes(tok, 1024)
		if err != nil {
			return nil, err
		}
		for _, v := range vols {
			if _, _, local, ok := splitID(v.ID); ok {
				ids[local] = true
			}
		}
		if tok = next; tok == "" {
			break
		}
	}
	for tok := ""; ; {
		snaps, next, err := s.store.ListSnapshots(state.SnapshotFilter{}, tok, 1024)
		if err != nil {
			return nil, err
		}
		for _, sn := range snaps {
			if _, _, local, ok := splitID(sn.ID); ok {
				ids[local] = true
			}
		}
		if tok = next; tok == "" {
			break
		}
	}
	return ids, nil
}

func quoteName(n string) string {
	if n == "" {
		return "unknown"
	}
	return "\"" + n + "\""
}
