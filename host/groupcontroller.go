package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
)

// Group snapshots are write-order consistent, as the spec demands: the
// host pauses the writes of every member in use on this node (a filesystem
// freeze, or a device-mapper suspend), cuts every member's snapshot with its
// backend's create_snapshot, and resumes the writes, within a bounded time
// and with the resume guaranteed on every path (hostcalls/node/quiesce). A member
// whose writes cannot be paused makes the group FAILED_PRECONDITION before
// anything is paused. RATIONALE.md, "Group snapshots", says why and what
// each backend gets.

// GroupControllerGetCapabilities advertises group snapshots.
func (s *Server) GroupControllerGetCapabilities(ctx context.Context, _ *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
		}},
	}}}, nil
}

func groupSnapshotName(group, volume string) string { return group + "/" + volume }

// CreateVolumeGroupSnapshot cuts one snapshot of every source volume at one
// point of their write stream. A repeat with the same name, sources and
// parameters answers the recorded group; other sources or parameters are
// ALREADY_EXISTS.
func (s *Server) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	name, srcs, params := req.GetName(), req.GetSourceVolumeIds(), req.GetParameters()
	if name == "" {
		return nil, errf(codes.InvalidArgument, "name missing")
	}
	if len(srcs) == 0 {
		return nil, errf(codes.InvalidArgument, "source_volume_ids missing")
	}
	srcs = slices.Clone(srcs)
	slices.Sort(srcs)
	if len(slices.Compact(slices.Clone(srcs))) != len(srcs) {
		return nil, errf(codes.InvalidArgument, "source_volume_ids repeat a volume")
	}
	keys := []string{groupKey(name)}
	for _, v := range srcs {
		keys = append(keys, volKey(v))
	}
	unlock, err := s.lock(keys...)
	if err != nil {
		return nil, err
	}
	defer unlock()
	gid := groupID(name)
	if g, err := s.store.GetGroup(gid); err == nil {
		if !slices.Equal(g.SourceVolumeIDs, srcs) {
			return nil, errf(codes.AlreadyExists, "group snapshot %q exists for other volumes", name)
		}
		if !maps.Equal(g.Parameters, params) {
			return nil, errf(codes.AlreadyExists, "group snapshot %q exists with other parameters", name)
		}
		return s.groupResponse(&g)
	} else if !errors.Is(err, state.ErrNotFound) {
		return nil, err
	}
	vols := make([]state.Volume, len(srcs))
	for i, v := range srcs {
		if vols[i], err = s.store.GetVolume(v); err != nil {
			return nil, s.absent(err, "volume", v)
		}
		b, ok := s.backends.Load().get(vols[i].Backend)
		if !ok {
			return nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", vols[i].Backend, v)
		}
		if !b.has(abi.OpCreateSnapshot) {
			return nil, errf(codes.Unimplemented, "backend %q of volume %q cannot snapshot", b.name, v)
		}
	}
	if err := s.undoDeadAttempt(ctx, name, gid, srcs); err != nil {
		return nil, err
	}
	targets, err := s.quiesceTargets(ctx, vols)
	if err != nil {
		return nil, err
	}
	// The journal is durable before anything is paused, so that a start
	// after a crash resumes what this attempt paused and the next attempt
	// removes what it cut.
	if err := s.journals.Write(quiesce.Journal{Group: name, Sources: srcs, Parameters: params, Targets: targets}); err != nil {
		return nil, err
	}
	g, err := s.cutGroup(ctx, gid, name, vols, params, targets)
	if err != nil {
		return nil, err
	}
	if err := s.store.PutGroup(*g); err != nil {
		return nil, fmt.Errorf("record group snapshot %s: %w", gid, err)
	}
	if err := s.journals.Remove(name); err != nil {
		s.log.Warn("group snapshot recorded, its journal stays", "group", name, "err", err)
	}
	return s.groupResponse(g)
}

// cutGroup pauses targets, cuts every member's snapshot and resumes the
// writes. On any failure it resumes them first and then removes the
// snapshots it cut (a group is all or nothing), and removes the journal
// once nothing of the attempt is left.
func (s *Server) cutGroup(ctx context.Context, gid, name string, vols []state.Volume, params map[string]string, targets []quiesce.Target) (*state.Group, error) {
	if len(targets) > 0 {
		// The cuts must not wait for instances while the writes are paused.
		var backends []*backend
		for i := range vols {
			if b, ok := s.backends.Load().get(vols[i].Backend); ok {
				backends = append(backends, b)
			}
		}
		rctx, unreserve, err := reserve(ctx, backends)
		if err != nil {
			s.dropJournal(name)
			return nil, err
		}
		defer unreserve()
		ctx = rctx
	}
	hold, err := quiesce.Pause(ctx, targets, s.cfg.GroupSnapshot.FreezeTimeout, s.log)
	if err != nil {
		s.dropJournal(name)
		return nil, err
	}
	defer hold.Thaw() // a panic too
	// Every member holds this moment: the last pause.
	g := &state.Group{ID: gid, Name: name, Parameters: params, CreatedAt: time.Now().UTC()}
	cctx := ctx
	if d := hold.Deadline(); !d.IsZero() {
		var cancel context.CancelFunc
		cctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	var made []*state.Snapshot
	for i := range vols {
		var sn *state.Snapshot
		mreq := abi.CreateSnapshotRequest{Name: groupSnapshotName(name, vols[i].ID), Parameters: params}
		if sn, err = s.snapshotLocked(cctx, vols[i].ID, mreq, gid, g.CreatedAt); err != nil {
			break
		}
		made = append(made, sn)
		g.SourceVolumeIDs = append(g.SourceVolumeIDs, vols[i].ID)
		g.SnapshotIDs = append(g.SnapshotIDs, sn.ID)
	}
	var rerr *abi.Error
	if errors.As(hold.Release(), &rerr) {
		switch {
		case err == nil:
			err = rerr
		case rerr.Code == abi.DeadlineExceeded:
			// A hold that ran out explains a member's failure better
			// than the member's own deadline error does.
			err = abi.Errorf(rerr.Code, "%s; the member being cut: %s", rerr.Message, status.Convert(toStatus(err)).Message())
		}
	}
	if len(targets) > 0 {
		guard, pausing, held := hold.Timing()
		s.log.Info("group snapshot paused writes", "group", name, "targets", len(targets),
			"guardian_start", guard, "pausing", pausing, "held", held, "ok", err == nil)
	}
	if err == nil {
		return g, nil
	}
	clean := true
	for _, m := range made {
		if derr := s.deleteSnapshotLocked(context.WithoutCancel(ctx), m); derr != nil {
			s.log.Error("undo group snapshot member", "snapshot", m.ID, "err", derr)
			clean = false
		}
	}
	if clean {
		s.dropJournal(name)
	}
	return nil, err
}

func (s *Server) dropJournal(name string) {
	if err := s.journals.Remove(name); err != nil {
		s.log.Warn("remove group snapshot journal", "group", name, "err", err)
	}
}

// undoDeadAttempt removes what an earlier attempt of group name left when
// the daemon died during it (its journal is still there): snapshots cut
// at another moment than this attempt's must not join its group. A member
// the backend cut but the daemon did not record yet is found by asking the
// backend for it again by name (create_snapshot is idempotent on the name)
// and deleted. srcs are the volumes the caller holds locks on; the dead
// attempt's other volumes are locked here.
func (s *Server) undoDeadAttempt(ctx context.Context, name, gid string, srcs []string) error {
	j, ok, err := s.journals.Read(name)
	if err != nil || !ok {
		return err
	}
	// Nothing of the attempt may stay paused: start-up resumed it, unless
	// that failed.
	if _, err := quiesce.ResumeAll(context.WithoutCancel(ctx), j.Targets); err != nil {
		return fmt.Errorf("group snapshot %q: an interrupted attempt left writes paused: %w", name, err)
	}
	if _, err := s.store.GetGroup(gid); err == nil {
		// The attempt was recorded; only the journal's removal was lost.
		return s.journals.Remove(name)
	} else if !errors.Is(err, state.ErrNotFound) {
		return err
	}
	unlock, err := s.lockOthers(j.Sources, srcs)
	if err != nil {
		return err
	}
	defer unlock()
	for _, v := range j.Sources {
		mname := groupSnapshotName(name, v)
		sn, err := s.store.SnapshotByName(mname)
		switch {
		case err == nil && sn.GroupID == gid:
			err = s.deleteSnapshotLocked(ctx, &sn)
		case err == nil: // not the group's: a snapshot some other call named so
		case errors.Is(err, state.ErrNotFound):
			err = s.dropUnrecorded(ctx, v, mname, j.Parameters)
		}
		if err != nil {
			return fmt.Errorf("undo an interrupted attempt of group snapshot %q: %w", name, err)
		}
	}
	s.log.Info("undid an interrupted group snapshot attempt", "group", name, "volumes", len(j.Sources))
	return s.journals.Remove(name)
}

// lockOthers locks the volumes of sources the caller does not hold
// (held), as a dead attempt's journal names them, and returns their unlock.
func (s *Server) lockOthers(sources, held []string) (func(), error) {
	var keys []string
	for _, v := range sources {
		if !slices.Contains(held, v) {
			keys = append(keys, volKey(v))
		}
	}
	if len(keys) == 0 {
		return func() {}, nil
	}
	return s.lock(keys...)
}

// undoInterruptedGroups undoes, at start-up, every group snapshot attempt
// the daemon died in, so that what they cut does not linger when the CO
// gives up on the group; a retry of such a group then finds nothing to undo.
// A group that is busy already (a CO call won the race) is left to that
// call.
func (s *Server) undoInterruptedGroups(ctx context.Context) {
	js, err := s.journals.All()
	if err != nil {
		s.log.Error("read group snapshot journals", "err", err)
	}
	for _, j := range js {
		keys := []string{groupKey(j.Group)}
		for _, v := range j.Sources {
			keys = append(keys, volKey(v))
		}
		unlock, err := s.lock(keys...)
		if err != nil {
			continue
		}
		if err := s.undoDeadAttempt(ctx, j.Group, groupID(j.Group), j.Sources); err != nil {
			s.log.Error("undo an interrupted group snapshot attempt; the next attempt of the group tries again", "group", j.Group, "err", err)
		}
		unlock()
	}
}

// dropUnrecorded deletes the snapshot the backend of volume id may hold
// under name without a record of it here.
func (s *Server) dropUnrecorded(ctx context.Context, id, name string, params map[string]string) error {
	v, err := s.store.GetVolume(id)
	if errors.Is(err, state.ErrNotFound) {
		s.log.Warn("cannot look for an unrecorded group member: its volume is gone", "volume", id, "snapshot", name)
		return nil
	} else if err != nil {
		return err
	}
	b, ok := s.backends.Load().get(v.Backend)
	if !ok {
		return errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", v.Backend, id)
	}
	var resp abi.CreateSnapshotResponse
	if err := b.call(ctx, abi.OpCreateSnapshot, &abi.CreateSnapshotRequest{Name: name, Source: volumeRef(&v), Parameters: params}, &resp); err != nil {
		return err
	}
	return s.dropCut(ctx, b, &v, name, &resp)
}

// dropCut deletes the snapshot a create_snapshot of name answered, unless
// its ID is recorded (under any spelling): then it is another snapshot's
// storage, which a backend answered for this name too, and stays.
func (s *Server) dropCut(ctx context.Context, b *backend, v *state.Volume, name string, resp *abi.CreateSnapshotResponse) error {
	for _, id := range s.idSpellings(b.name, resp.LocalID) {
		if old, err := s.store.GetSnapshot(id); err == nil {
			s.log.Warn("an unrecorded snapshot's storage is recorded for another snapshot; kept", "snapshot", name, "recorded", old.Name, "id", id)
			return nil
		} else if !errors.Is(err, state.ErrNotFound) {
			return err
		}
	}
	sn := state.Snapshot{LocalID: resp.LocalID, Context: resp.Context, SizeBytes: resp.SizeBytes}
	return b.call(ctx, abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: snapshotRef(&sn, v)}, &abi.Empty{})
}

func (s *Server) groupResponse(g *state.Group) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	gs, err := s.csiGroup(g)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: gs}, nil
}

func (s *Server) csiGroup(g *state.Group) (*csi.VolumeGroupSnapshot, error) {
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.ID, CreationTime: timestamppb.New(g.CreatedAt), ReadyToUse: true}
	for _, id := range g.SnapshotIDs {
		sn, err := s.store.GetSnapshot(id)
		if err != nil {
			return nil, fmt.Errorf("group %s member %s: %w", g.ID, id, err)
		}
		out.Snapshots = append(out.Snapshots, csiSnapshot(&sn))
		out.ReadyToUse = out.ReadyToUse && sn.ReadyToUse
	}
	return out, nil
}

// DeleteVolumeGroupSnapshot deletes the group and its snapshots; a group
// that does not exist is success.
func (s *Server) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "group_snapshot_id missing")
	}
	g, err := s.store.GetGroup(id)
	if errors.Is(err, state.ErrNotFound) {
		if err := s.groupElsewhere(id, req.GetSnapshotIds()); err != nil {
			return nil, err
		}
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	if ids := req.GetSnapshotIds(); len(ids) > 0 {
		want, have := slices.Sorted(slices.Values(ids)), slices.Sorted(slices.Values(g.SnapshotIDs))
		if !slices.Equal(want, have) {
			return nil, errf(codes.InvalidArgument, "snapshot_ids do not match group snapshot %q", id)
		}
	}
	keys := []string{groupKey(g.Name)}
	for _, sid := range g.SnapshotIDs {
		keys = append(keys, snapKey(sid))
	}
	unlock, err := s.lock(keys...)
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, sid := range g.SnapshotIDs {
		sn, err := s.store.GetSnapshot(sid)
		if errors.Is(err, state.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		if err := s.deleteSnapshotLocked(ctx, &sn); err != nil {
			return nil, err
		}
	}
	if err := s.store.DeleteGroup(id); err != nil {
		return nil, fmt.Errorf("delete record %s: %w", id, err)
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

// GetVolumeGroupSnapshot returns one group.
func (s *Server) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "group_snapshot_id missing")
	}
	g, err := s.store.GetGroup(id)
	if errors.Is(err, state.ErrNotFound) {
		if err := s.groupElsewhere(id, req.GetSnapshotIds()); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, notFoundOr(err, "group snapshot %q", id)
	}
	if ids := req.GetSnapshotIds(); len(ids) > 0 && !slices.Equal(slices.Sorted(slices.Values(ids)), slices.Sorted(slices.Values(g.SnapshotIDs))) {
		return nil, errf(codes.InvalidArgument, "snapshot_ids do not match group snapshot %q", id)
	}
	gs, err := s.csiGroup(&g)
	if err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: gs}, nil
}

// groupElsewhere answers a call on a group snapshot this daemon holds no
// record of: group IDs are the host's and name no node, but its members'
// IDs do, and a group of another node's volumes is recorded by that
// node's daemon (FAILED_PRECONDITION, as elsewhere). nil when no member
// names another node.
func (s *Server) groupElsewhere(id string, members []string) error {
	for _, sid := range members {
		if owner := s.owner(sid); owner != "" {
			return errf(codes.FailedPrecondition, "group snapshot %q of snapshot %q was made by the wasmcsi daemon of %s, which alone holds its records; this is node %q: send its calls to the plugin on that node (see deploy/README.md)",
				id, sid, owner, s.cfg.NodeID)
		}
	}
	return nil
}
