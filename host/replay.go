package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// finishInterrupted finishes, before the daemon serves, the controller
// operations a crash left unsettled (RATIONALE.md, "Records"): every
// logged create is run again, with its logged request brought to the
// volume's record where one survived, and its volume recorded, unless a
// deletion of its name supersedes it; then every volume or snapshot
// marked deleting is deleted again through its module and its record
// removed, but for a source of a logged create that could not be
// finished. Both are finished, never undone, because the CO may
// have had its answer. What cannot be finished now (a backend not
// loaded, a module error) stays logged: it is tried at the next start,
// and the CO's next call for the volume or name settles it.
func (s *Server) finishInterrupted(ctx context.Context) {
	// A list that cannot be read is left for the next start; the others
	// are still finished, but for the logged creates, which wait for the
	// marked volumes: a marked deletion may supersede one.
	dels, err := s.store.DeletingVolumes()
	if err != nil {
		s.log.Error("read volumes being deleted; logged creates wait for them", "err", err)
	}
	volumesRead := err == nil
	snaps, err := s.store.DeletingSnapshots()
	if err != nil {
		s.log.Error("read snapshots being deleted", "err", err)
	}
	var intents []state.Intent
	if volumesRead {
		if intents, err = s.store.ListIntents(); err != nil {
			s.log.Error("read logged operations", "err", err)
		}
	}
	if len(dels) == 0 && len(snaps) == 0 && len(intents) == 0 {
		return
	}
	// What each backend repeated completes once its pool folders are
	// synced, backend by backend: one whose storage fails holds back only
	// its own completions. Dropping an intent that names no backend's
	// change waits for nothing.
	type repeatedBy struct {
		dirs     hostcalls.DirSyncs
		complete []func() error
	}
	byBackend := map[string]*repeatedBy{}
	group := func(name string) *repeatedBy {
		g := byBackend[name]
		if g == nil {
			g = &repeatedBy{}
			byBackend[name] = g
		}
		return g
	}
	var free []func() error
	deleting := map[string]bool{}
	for _, v := range dels {
		deleting[v.Name] = true
	}
	// Creates first: a logged clone or restore is made again from its
	// source, which a marked deletion would take. What a create start-up
	// cannot finish now still needs its source, whose deletion waits too
	// (RATIONALE.md, "Records": replay in dependency order).
	needed := map[string]bool{}
	for _, in := range intents {
		drop := func() error { return s.store.DropIntentSoon(in.Key, in.CreatedAt) }
		name, ok := strings.CutPrefix(in.Key, state.VolumeIntentKey(""))
		if !ok || in.Op != string(abi.OpCreateVolume) {
			s.log.Error("logged operation of an unknown kind left alone", "key", in.Key, "op", in.Op)
			continue
		}
		if deleting[name] {
			// Logged before the deletion of its volume, which settles it.
			free = append(free, drop)
			continue
		}
		wait := func() {
			for _, src := range copySources(&in) {
				needed[src] = true
				if s.unfinishedCopies == nil {
					s.unfinishedCopies = map[string][]state.Intent{}
				}
				s.unfinishedCopies[src] = append(s.unfinishedCopies[src], in)
			}
		}
		b, ok := s.backends.Load().get(in.Backend)
		if !ok {
			s.log.Warn("logged create waits for its backend", "name", name, "backend", in.Backend)
			wait()
			continue
		}
		var mreq abi.CreateVolumeRequest
		if err := mreq.UnmarshalWire(in.Request); err != nil {
			s.log.Error("logged create does not decode; dropped", "name", name, "err", err)
			free = append(free, drop)
			continue
		}
		if err := s.convergeToRecord(name, &mreq); err != nil {
			s.log.Error("finish a logged create; the next CreateVolume of its name or start tries again", "name", name, "err", err)
			wait()
			continue
		}
		g := group(b.name)
		v, err := s.createAndRecord(s.deferSyncs(ctx, b, &g.dirs), b, &in, &mreq)
		if err != nil {
			s.log.Error("finish a logged create; the next CreateVolume of its name or start tries again", "name", name, "err", err)
			wait()
			continue
		}
		s.log.Info("finished a logged create", "name", name, "volume", v.ID)
		g.complete = append(g.complete, drop)
	}
	for _, v := range dels {
		b, ok := s.backends.Load().get(v.Backend)
		if !ok {
			s.log.Warn("volume being deleted waits for its backend", "volume", v.ID, "backend", v.Backend)
			continue
		}
		if needed[volKey(v.ID)] {
			s.log.Warn("volume being deleted waits for a logged copy of it", "volume", v.ID)
			continue
		}
		g := group(b.name)
		if err := b.call(s.deferSyncs(ctx, b, &g.dirs), abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: volumeRef(&v)}, &abi.Empty{}); err != nil {
			s.log.Error("finish the deletion of a volume; the next DeleteVolume or start tries again", "volume", v.ID, "err", err)
			continue
		}
		s.log.Info("finished the deletion of a volume", "volume", v.ID)
		g.complete = append(g.complete, func() error { return ignoreNotFound(s.store.DeleteVolumeSoon(v.ID)) })
	}
	for _, sn := range snaps {
		b, ok := s.backends.Load().get(sn.Backend)
		if !ok {
			s.log.Warn("snapshot being deleted waits for its backend", "snapshot", sn.ID, "backend", sn.Backend)
			continue
		}
		if needed[snapKey(sn.ID)] {
			s.log.Warn("snapshot being deleted waits for a logged restore of it", "snapshot", sn.ID)
			continue
		}
		g := group(b.name)
		if err := s.callDeleteSnapshot(s.deferSyncs(ctx, b, &g.dirs), b, &sn); err != nil {
			s.log.Error("finish the deletion of a snapshot; the next DeleteSnapshot or start tries again", "snapshot", sn.ID, "err", err)
			continue
		}
		s.log.Info("finished the deletion of a snapshot", "snapshot", sn.ID)
		g.complete = append(g.complete, func() error { return ignoreNotFound(s.store.DeleteSnapshotSoon(sn.ID)) })
	}
	// A repeated create that found its volume may not have touched, nor
	// reported, the pool folder whose sync the crash cut off: every pool
	// folder of the backend is synced, then its operations complete.
	for _, name := range slices.Sorted(maps.Keys(byBackend)) {
		g := byBackend[name]
		if err := s.syncPools(g.dirs.Dirs(), name); err != nil {
			s.log.Error("the operations finished now complete at the next start", "backend", name, "err", err)
			continue
		}
		free = append(free, g.complete...)
	}
	for _, c := range free {
		if err := c(); err != nil {
			s.log.Error("complete a finished operation", "err", err)
		}
	}
}

// copySources are the keys (snapKey, volKey) of what a logged create
// copies.
func copySources(in *state.Intent) []string {
	var out []string
	if in.SourceSnapshotID != "" {
		out = append(out, snapKey(in.SourceSnapshotID))
	}
	if in.SourceVolumeID != "" {
		out = append(out, volKey(in.SourceVolumeID))
	}
	return out
}

// convergeToRecord makes the logged create_volume request of name ask for
// the volume its record describes, when the record survived: the CO may
// have expanded or modified the volume since, and replaying the older
// request would undo that (localdir set its quota back) or find the
// storage changed (loopfile's file grown). Capacity and mutable
// parameters come from the record, with no limit (an expansion may have
// gone past the create's); everything else a create fixes for good. With
// no record the logged request is the volume as the CO knows it, since
// every change of a volume waits for its record first (recordDurable).
func (s *Server) convergeToRecord(name string, mreq *abi.CreateVolumeRequest) error {
	rec, err := s.store.VolumeByName(name)
	if errors.Is(err, state.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	mreq.RequiredBytes, mreq.LimitBytes = rec.CapacityBytes, 0
	mreq.MutableParameters = rec.MutableParameters
	return nil
}

// ignoreNotFound is err unless it says the record is gone already.
func ignoreNotFound(err error) error {
	if errors.Is(err, state.ErrNotFound) {
		return nil
	}
	return err
}

// syncPools syncs the folders dirs and every pool folder of the modules
// named: a repeated create or delete that found its work done may not
// have touched, nor reported, the folder whose sync is still to come.
func (s *Server) syncPools(dirs []string, modules ...string) error {
	folders := slices.Clone(dirs)
	for _, name := range modules {
		m := s.cfg.Modules[name]
		if !slices.Contains(m.HostCalls, "dir") && !slices.Contains(m.HostCalls, "file") {
			continue
		}
		for _, r := range m.Roots {
			if filepath.IsAbs(r) && !strings.HasPrefix(r, "/dev/") && !slices.Contains(folders, r) {
				folders = append(folders, r)
			}
		}
	}
	for _, f := range folders {
		if err := syncFolder(f); err != nil {
			return fmt.Errorf("sync pool folder %s: %w", f, err)
		}
	}
	return nil
}
