package host

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
)

func csiSnapshot(sn *state.Snapshot) *csi.Snapshot {
	out := &csi.Snapshot{
		SnapshotId: sn.ID, SourceVolumeId: sn.SourceVolumeID, SizeBytes: sn.SizeBytes,
		CreationTime: timestamppb.New(sn.CreatedAt), ReadyToUse: sn.ReadyToUse, GroupSnapshotId: sn.GroupID,
	}
	// sn.Topology is recorded but not returned: a plugin that returns
	// accessible_topology MUST advertise SNAPSHOT_ACCESSIBILITY_CONSTRAINTS,
	// which this one does not yet (RATIONALE.md).
	return out
}

// CreateSnapshot cuts a snapshot; a repeat with the same name and source
// answers the recorded snapshot, another source ALREADY_EXISTS.
func (s *Server) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	name, src := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, errf(codes.InvalidArgument, "name missing")
	}
	if src == "" {
		return nil, errf(codes.InvalidArgument, "source_volume_id missing")
	}
	unlock, err := s.lock(snameKey(name), volKey(src))
	if err != nil {
		return nil, err
	}
	defer unlock()
	// What an attempt the daemon died in (or could not clean up after)
	// cut while its pause was not sure goes first.
	if err := s.undoDeadSnapshot(ctx, name, src); err != nil {
		return nil, err
	}
	mreq := abi.CreateSnapshotRequest{
		Name: name, Parameters: req.GetParameters(),
		Requisite: topologiesFromCSI(req.GetAccessibilityRequirements().GetRequisite()),
		Preferred: topologiesFromCSI(req.GetAccessibilityRequirements().GetPreferred()),
	}
	sn, err := s.snapshotLocked(ctx, src, mreq, "", time.Time{})
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(sn)}, nil
}

// snapshotLocked creates (or finds) one snapshot; the caller holds the
// name and source volume locks. at is its point in time, now when zero.
func (s *Server) snapshotLocked(ctx context.Context, src string, mreq abi.CreateSnapshotRequest, group string, at time.Time) (*state.Snapshot, error) {
	name := mreq.Name
	// A deletion of a snapshot of this name that is not settled yet holds
	// the name: settle it first.
	if old, err := s.store.SnapshotRecordByName(name); err == nil && old.Deleting {
		if err := s.settleSnapshotDeletion(ctx, old); err != nil {
			return nil, err
		}
	}
	if old, err := s.store.SnapshotByName(name); err == nil {
		if old.SourceVolumeID != src {
			return nil, errf(codes.AlreadyExists, "snapshot %q exists for volume %q", name, old.SourceVolumeID)
		}
		if old.GroupID != group {
			// A group's member is never a plain snapshot, nor a member of
			// another group, whatever its name says.
			return nil, errf(codes.AlreadyExists, "snapshot %q exists as %s", name, describeGroup(old.GroupID))
		}
		return &old, nil
	} else if !errors.Is(err, state.ErrNotFound) {
		return nil, err
	}
	v, err := s.store.GetVolume(src)
	if err != nil {
		return nil, s.absent(err, "volume", src)
	}
	b, ok := s.backends.Load().get(v.Backend)
	if !ok {
		return nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", v.Backend, src)
	}
	var resp abi.CreateSnapshotResponse
	mreq.Source = volumeRef(&v)
	// A group's members are paused by the group (groupcontroller.go).
	journaled, err := s.cutSnapshot(ctx, b, &v, &mreq, &resp, group == "")
	if err != nil {
		return nil, err
	}
	if journaled {
		// Cut whole while paused: recorded or not below, nothing of it
		// needs undoing, and a retry may adopt it.
		defer s.dropSnapJournal(name)
	}
	tag := s.tagFor(b)
	if err := checkLocalID(b.name, tag, "snapshot", resp.LocalID); err != nil {
		return nil, err
	}
	if err := checkContext(b.name, "snapshot context", resp.Context); err != nil {
		return nil, err
	}
	for _, t := range resp.Topology {
		if err := checkTopology(b.name, "snapshot topology", t.Segments); err != nil {
			return nil, err
		}
	}
	if at.IsZero() {
		at = time.Now().UTC()
	}
	sn := state.Snapshot{
		ID: tag.id(b.name, resp.LocalID), Name: name, Backend: b.name, LocalID: resp.LocalID,
		SourceVolumeID: src, SizeBytes: resp.SizeBytes, Context: resp.Context,
		CreatedAt: at, ReadyToUse: resp.ReadyToUse, GroupID: group,
	}
	for _, t := range resp.Topology {
		sn.Topology = append(sn.Topology, t.Segments)
	}
	// InsertSnapshot refuses sn.ID recorded for another name; the other
	// spellings of the ID name the same storage.
	for _, id := range s.idSpellings(b.name, resp.LocalID) {
		if old, err := s.store.GetSnapshot(id); err == nil && id != sn.ID && old.Name != name {
			return nil, s.idTaken(b.name, "snapshot", id, name, func() (string, error) { return old.Name, nil })
		} else if err != nil && !errors.Is(err, state.ErrNotFound) {
			return nil, err
		}
	}
	if err := s.store.InsertSnapshot(sn); errors.Is(err, state.ErrIDTaken) {
		return nil, s.idTaken(b.name, "snapshot", sn.ID, name, func() (string, error) {
			old, err := s.store.GetSnapshot(sn.ID)
			return old.Name, err
		})
	} else if err != nil {
		return nil, fmt.Errorf("record snapshot %s: %w", sn.ID, err)
	}
	return &sn, nil
}

// cutSnapshot calls the backend's create_snapshot. With pause set, a
// source staged on this node as a filesystem mounted from a device other
// than device-mapper is frozen for the call (hostcalls/node/quiesce, as
// a group's members are, with its guardian and freeze_timeout), so that
// the snapshot holds one moment of the volume, with what the filesystem
// had cached, even where the backend copies the volume's blocks one after
// the other while the workload writes. A device-mapper device is left to
// the backend (dm thin suspends the origin for its snapshot itself); a
// raw block volume or a directory has no pause (RATIONALE.md, "Snapshots
// of volumes in use").
//
// The pause is journaled first (snapJournals, by snapshot name), so that
// a start after a crash resumes it and the next attempt removes what the
// dead one cut; journaled reports that the journal stays until the caller
// has recorded the snapshot. A hold that ends before the cut does (its
// deadline, or someone's thaw) fails the call, and a cut the backend
// answered is removed, so that a retry cannot adopt it; if that removal
// fails the journal stays, without its resumed target, and the next
// attempt removes the cut first.
// A filesystem that cannot be frozen here (already frozen by someone
// else, as a backup tool's pre-hook does, or of a kind without freeze) is
// cut as it is.
func (s *Server) cutSnapshot(ctx context.Context, b *backend, v *state.Volume, mreq *abi.CreateSnapshotRequest, resp *abi.CreateSnapshotResponse, pause bool) (journaled bool, err error) {
	var target *quiesce.Target
	if pause && s.snapJournals != nil {
		if target, err = s.snapshotPause(ctx, v); err != nil {
			return false, err
		}
	}
	if target == nil {
		return false, b.call(ctx, abi.OpCreateSnapshot, mreq, resp)
	}
	// The cut must not wait for an instance while the writes are paused.
	ctx, unreserve, err := reserve(ctx, []*backend{b})
	if err != nil {
		return false, err
	}
	defer unreserve()
	name := mreq.Name
	targets := []quiesce.Target{*target}
	if err := s.snapJournals.Write(quiesce.Journal{Group: name, Sources: []string{v.ID}, Parameters: mreq.Parameters, Targets: targets}); err != nil {
		return false, err
	}
	hold, err := quiesce.Pause(ctx, targets, s.cfg.GroupSnapshot.FreezeTimeout, s.log)
	if err != nil {
		// Pause resumed whatever it had paused before it failed.
		if fe := (*fs.FrozenElsewhere)(nil); errors.As(err, &fe) {
			return s.cutFrozenElsewhere(ctx, b, v, mreq, resp, target)
		}
		s.dropSnapJournal(name)
		if abi.CodeOf(err) != abi.FailedPrecondition {
			return false, abi.Errorf(abi.Unavailable, "snapshot %q: pause the writes of volume %q: %v", name, v.ID, err)
		}
		s.log.Warn("snapshot cut without pausing its source's writes", "volume", v.ID, "snapshot", name, "err", err)
		return false, b.call(ctx, abi.OpCreateSnapshot, mreq, resp)
	}
	defer hold.Thaw() // a panic too
	cctx := ctx
	if d := hold.Deadline(); !d.IsZero() {
		var cancel context.CancelFunc
		cctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	err = b.call(cctx, abi.OpCreateSnapshot, mreq, resp)
	herr := hold.Release()
	guard, pausing, held := hold.Timing()
	s.log.Info("snapshot paused writes", "volume", v.ID, "snapshot", name, "target", target.String(),
		"guardian_start", guard, "pausing", pausing, "held", held, "ok", err == nil && herr == nil)
	if !hold.Resumed() {
		// A thaw failed (the guardian tries once more): the journal keeps
		// the target for the next attempt and the next start to resume.
		return false, abi.Errorf(abi.Unavailable, "snapshot %q: the writes of volume %q could not be resumed after the cut: %v", name, v.ID, herr)
	}
	if herr == nil {
		if err != nil {
			// Whatever the backend left was made while paused.
			s.dropSnapJournal(name)
			return false, err
		}
		return true, nil
	}
	// Not all of the cut (if any) happened while the writes were paused.
	// The journal now only says that something may need removing: its
	// target is resumed, and resuming it again later could end someone
	// else's freeze.
	if werr := s.snapJournals.Write(quiesce.Journal{Group: name, Sources: []string{v.ID}, Parameters: mreq.Parameters, Unpaused: err == nil}); werr != nil {
		s.log.Warn("rewrite snapshot journal without its resumed target", "snapshot", name, "err", werr)
	}
	msg := herr.Error()
	if rerr := (*abi.Error)(nil); errors.As(herr, &rerr) {
		msg = rerr.Message
	}
	if err != nil {
		msg += "; the snapshot: " + status.Convert(toStatus(err)).Message()
	}
	if abi.CodeOf(herr) == abi.DeadlineExceeded {
		msg += "; a volume in use whose snapshot is a copy needs a pool with reflinks (xfs, btrfs), a longer group_snapshot.freeze_timeout, or its workload stopped"
	}
	// A create_snapshot that failed left nothing it would answer for
	// later (abi/ABI.md): a copy it could not finish within its deadline
	// is never put in place. One that answered is removed through its
	// answer.
	var answered *abi.CreateSnapshotResponse
	if err == nil {
		answered = resp
	}
	return false, s.removeUnpausedCut(ctx, b, v, name, answered, abi.CodeOf(herr), msg)
}

// removeUnpausedCut removes the cut a create_snapshot of name answered
// (none when resp is nil) while v's writes were not paused, drops the
// journal and fails the call with code and msg. If the removal fails, the
// journal stays for the next attempt to remove the cut first, and the call
// is UNAVAILABLE.
func (s *Server) removeUnpausedCut(ctx context.Context, b *backend, v *state.Volume, name string, resp *abi.CreateSnapshotResponse, code abi.Code, msg string) error {
	if resp != nil {
		if derr := s.dropCut(context.WithoutCancel(ctx), b, v, name, resp); derr != nil {
			s.log.Error("remove a snapshot cut while its source's writes were not paused; the next attempt tries again", "volume", v.ID, "snapshot", name, "err", derr)
			return abi.Errorf(abi.Unavailable, "%s; what was cut could not be removed yet (%v): the next attempt removes it first", msg, derr)
		}
	}
	s.dropSnapJournal(name)
	return abi.Errorf(code, "%s", msg)
}

// cutFrozenElsewhere cuts a snapshot of v, whose filesystem someone else
// (a backup tool's pre-hook) holds frozen: quiesced already, and theirs to
// thaw. Their thaw during the cut would leave a copy of two moments, so the
// filesystem must still be frozen once the cut is made; if it is not, or
// that cannot be told, the cut is removed and the call fails ABORTED for
// the CO to retry. Meanwhile the journal holds no target (resuming it
// would end their freeze) and says that an unpaused cut may need removing.
func (s *Server) cutFrozenElsewhere(ctx context.Context, b *backend, v *state.Volume, mreq *abi.CreateSnapshotRequest, resp *abi.CreateSnapshotResponse, target *quiesce.Target) (journaled bool, err error) {
	name := mreq.Name
	if err := s.snapJournals.Write(quiesce.Journal{Group: name, Sources: []string{v.ID}, Parameters: mreq.Parameters, Unpaused: true}); err != nil {
		// The journal written before the freeze names the target, which
		// a retry or start would resume, ending their freeze.
		s.dropSnapJournal(name)
		return false, err
	}
	s.log.Info("snapshot cut in the freeze of whoever froze its source", "volume", v.ID, "snapshot", name, "target", target.String())
	if err := b.call(ctx, abi.OpCreateSnapshot, mreq, resp); err != nil {
		s.dropSnapJournal(name) // a failed create_snapshot leaves nothing (abi/ABI.md)
		return false, err
	}
	still, stuck, cerr := s.stillFrozenElsewhere(ctx, target)
	if cerr == nil && still {
		return true, nil
	}
	why := fmt.Sprintf("the filesystem of volume %q was thawed by whoever froze it while it was cut, so the cut may hold two moments", v.ID)
	if cerr != nil {
		why = fmt.Sprintf("whether the filesystem of volume %q stayed frozen while it was cut cannot be told (%v)", v.ID, cerr)
	}
	if stuck {
		// The look froze it and could not thaw it: the journal names
		// it again, for the next attempt and start to resume.
		derr := s.dropCut(context.WithoutCancel(ctx), b, v, name, resp)
		j := quiesce.Journal{Group: name, Sources: []string{v.ID}, Parameters: mreq.Parameters, Targets: []quiesce.Target{*target}, Unpaused: derr != nil}
		if werr := s.snapJournals.Write(j); werr != nil {
			s.log.Error("journal a freeze that could not be thawed; its guardian tries once more", "snapshot", name, "err", werr)
		}
		return false, abi.Errorf(abi.Unavailable, "snapshot %q: %s; the filesystem, frozen to tell, could not be thawed: the next attempt resumes it", name, why)
	}
	return false, s.removeUnpausedCut(ctx, b, v, name, resp, abi.Aborted, fmt.Sprintf("snapshot %q: %s; try again", name, why))
}

// stillFrozenElsewhere reports whether someone else still holds target
// frozen, by trying to freeze it: that fails while they do. The try goes
// through quiesce.Pause, whose guardian thaws it should the daemon die
// holding it, and what it froze it thaws at once; stuck reports that this
// thaw failed (the guardian tries once more). It cannot see a thaw and a
// new freeze both made during the cut.
func (s *Server) stillFrozenElsewhere(ctx context.Context, target *quiesce.Target) (still, stuck bool, err error) {
	hold, err := quiesce.Pause(context.WithoutCancel(ctx), []quiesce.Target{*target}, s.cfg.GroupSnapshot.FreezeTimeout, s.log)
	if fe := (*fs.FrozenElsewhere)(nil); errors.As(err, &fe) {
		return true, false, nil
	}
	if err != nil {
		return false, false, err
	}
	hold.Release()
	return false, !hold.Resumed(), nil
}

func (s *Server) dropSnapJournal(name string) {
	if err := s.snapJournals.Remove(name); err != nil {
		s.log.Warn("remove snapshot journal", "snapshot", name, "err", err)
	}
}

// undoDeadSnapshot finishes what an attempt of snapshot name left
// (its journal is still there). Its targets, if any, are resumed (start-up
// resumed them already and rewrote the journal without them). What an
// attempt the daemon stopped in while paused cut, if anything, is kept,
// since a cut is put in place only while its pause holds (a copy that
// outlasts it fails without a trace, abi/ABI.md), so a retry may adopt
// it. A journal marked Unpaused is that of a cut the backend answered
// after its pause ended and whose removal failed: it is removed now, found
// by name. The caller holds the name lock and the locks of the volumes
// held names; the dead attempt's other source, if any, is locked here.
func (s *Server) undoDeadSnapshot(ctx context.Context, name string, held ...string) error {
	if s.snapJournals == nil {
		return nil
	}
	j, ok, err := s.snapJournals.Read(name)
	if err != nil {
		return abi.Errorf(abi.Unavailable, "snapshot %q: %v", name, err)
	}
	if !ok {
		return nil
	}
	unlock, err := s.lockOthers(j.Sources, held)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := quiesce.ResumeAll(context.WithoutCancel(ctx), j.Targets); err != nil {
		return abi.Errorf(abi.Unavailable, "snapshot %q: an interrupted attempt left writes paused: %v", name, err)
	}
	if !j.Unpaused {
		return s.snapJournals.Remove(name)
	}
	if _, err := s.store.SnapshotByName(name); err == nil {
		return s.snapJournals.Remove(name) // recorded since
	} else if !errors.Is(err, state.ErrNotFound) {
		return err
	}
	for _, src := range j.Sources {
		// The cut exists (its removal failed), so asking for it by name
		// answers it at once; after a crash during a cut in someone
		// else's freeze it may not, and the backend cuts it anew only to
		// have it removed. A backend that no longer answers the name
		// (NOT_FOUND, INVALID_ARGUMENT) has nothing under it to remove.
		err := s.dropUnrecorded(context.WithoutCancel(ctx), src, name, j.Parameters)
		if c := abi.CodeOf(err); c == abi.NotFound || c == abi.InvalidArgument {
			s.log.Warn("snapshot cut while its source's writes were not paused: the backend no longer answers its name", "snapshot", name, "err", err)
		} else if err != nil {
			return abi.Errorf(abi.Unavailable, "snapshot %q: remove what an attempt cut while the writes were not paused: %v", name, err)
		}
	}
	return s.snapJournals.Remove(name)
}

// undoInterruptedSnapshots undoes, at start-up, every snapshot attempt
// the daemon died in while it paused the source's writes.
func (s *Server) undoInterruptedSnapshots(ctx context.Context) {
	if s.snapJournals == nil {
		return
	}
	js, err := s.snapJournals.All()
	if err != nil {
		s.log.Error("read snapshot journals", "err", err)
	}
	for _, j := range js {
		keys := []string{snameKey(j.Group)}
		for _, v := range j.Sources {
			keys = append(keys, volKey(v))
		}
		unlock, err := s.lock(keys...)
		if err != nil {
			s.log.Error("undo an interrupted snapshot attempt: busy; the next attempt of the snapshot does it", "snapshot", j.Group, "err", err)
			continue
		}
		if err := s.undoDeadSnapshot(ctx, j.Group, j.Sources...); err != nil {
			s.log.Error("undo an interrupted snapshot attempt; the next attempt of the snapshot tries again", "snapshot", j.Group, "err", err)
		}
		unlock()
	}
}

// snapshotPause is what pauses the writes to v for a snapshot of its own:
// its filesystem, when v is staged here with one mounted from a device
// other than device-mapper; nil otherwise.
func (s *Server) snapshotPause(ctx context.Context, v *state.Volume) (*quiesce.Target, error) {
	rec, err := s.deviceStagedHere(ctx, v.ID)
	if err != nil || rec == nil {
		return nil, err
	}
	if rec.Block {
		// A raw block device cannot be paused here (device-mapper's are
		// by their backend's own snapshot), but what the workload wrote
		// to it before the call must be in the cut.
		return nil, s.flushStaged(ctx, rec)
	}
	t, err := s.node.WritePause(rec.Device, rec.StagingPath, rec.Block, v.ID)
	if err != nil || t == nil || t.Kind != quiesce.Filesystem {
		return nil, err
	}
	return t, nil
}

// deviceStagedHere returns the stage of volume id when it is a device
// staged on this node and still in place; nil otherwise.
func (s *Server) deviceStagedHere(ctx context.Context, id string) (*state.Stage, error) {
	if s.cfg.Role == config.RoleController {
		return nil, nil // no stages here
	}
	rec, err := s.store.GetStage(id)
	if errors.Is(err, state.ErrNotFound) || (err == nil && rec.Device == "") {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	present, err := s.stagePresent(ctx, &rec)
	if err != nil || !present {
		return nil, err
	}
	return &rec, nil
}

// flushSource writes out what a workload on this node wrote to volume v
// and the kernel still caches (a filesystem's dirty pages, a raw device's
// own), so that a clone of what backs v holds every write made before
// the call. It does not pause the writes: on a pool that copies, a clone
// of a volume written meanwhile is not one moment (RATIONALE.md,
// "Snapshots of volumes in use").
func (s *Server) flushSource(ctx context.Context, v *state.Volume) error {
	rec, err := s.deviceStagedHere(ctx, v.ID)
	if err != nil || rec == nil {
		return err
	}
	return s.flushStaged(ctx, rec)
}

// flushStaged writes out what the page cache holds of stage rec (its raw
// block device's own cache, or its filesystem's), which a snapshot or
// clone cuts unpaused: a workload leaves its writes there, out of reach of
// a clone or copy of what backs the device (node.Flush).
func (s *Server) flushStaged(ctx context.Context, rec *state.Stage) error {
	if err := s.node.Flush(ctx, rec.Device, rec.StagingPath, rec.Block); err != nil {
		if c := abi.CodeOf(err); c == abi.DeadlineExceeded || c == abi.Canceled {
			return err
		}
		return abi.Errorf(abi.Unavailable, "volume %q: write out what its workload wrote to %s before the cut: %v", rec.VolumeID, rec.Device, err)
	}
	return nil
}

func describeGroup(id string) string {
	if id == "" {
		return "a snapshot of its own"
	}
	return "a member of group snapshot " + id
}

// DeleteSnapshot deletes a snapshot; one that does not exist is success.
func (s *Server) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "snapshot_id missing")
	}
	unlock, err := s.lock(snapKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	sn, err := s.store.SnapshotRecord(id)
	if errors.Is(err, state.ErrNotFound) {
		if err := s.elsewhere(codes.FailedPrecondition, "snapshot", id); err != nil {
			return nil, err
		}
		return &csi.DeleteSnapshotResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	if sn.Deleting && s.settle.settling(snapKey(id)) {
		// The module deleted it; only the record's removal waits.
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err := s.settleCopiesOf(ctx, snapKey(id), "snapshot", id); err != nil {
		return nil, err
	}
	if sn.GroupID != "" {
		if _, err := s.store.GetGroup(sn.GroupID); err == nil {
			// The spec's "Snapshot is part of a group": INVALID_ARGUMENT.
			return nil, errf(codes.InvalidArgument, "snapshot %q belongs to group snapshot %q: delete the group", id, sn.GroupID)
		}
		// A member of a group that is gone: deleted as the group's
		// members are, waiting for the record's removal.
		if err := s.deleteSnapshotLocked(ctx, &sn); err != nil {
			return nil, err
		}
		return &csi.DeleteSnapshotResponse{}, nil
	}
	// As DeleteVolume: the durable mark is the one sync the CO waits for;
	// the record goes once the module's pool changes are durable.
	b, ok := s.backends.Load().get(sn.Backend)
	if !ok {
		return nil, errf(codes.FailedPrecondition, "backend %q of snapshot %q is not loaded", sn.Backend, sn.ID)
	}
	if !sn.Deleting {
		if err := s.store.MarkSnapshotDeleting(id); err != nil {
			return nil, err
		}
	}
	var dirs hostcalls.DirSyncs
	if err := s.callDeleteSnapshot(s.deferSyncs(ctx, b, &dirs), b, &sn); err != nil {
		sn.Deleting = false
		if perr := s.store.PutSnapshot(sn); perr != nil {
			s.log.Error("unmark a snapshot whose deletion failed", "snapshot", id, "err", perr)
		}
		return nil, err
	}
	s.settle.add(snapKey(id), dirs.Dirs(), func() error { return ignoreNotFound(s.store.DeleteSnapshotSoon(id)) })
	return &csi.DeleteSnapshotResponse{}, nil
}

// callDeleteSnapshot asks the snapshot's module to delete it.
func (s *Server) callDeleteSnapshot(ctx context.Context, b *backend, sn *state.Snapshot) error {
	var src *state.Volume
	if v, err := s.store.GetVolume(sn.SourceVolumeID); err == nil {
		src = &v
	}
	return b.call(ctx, abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: snapshotRef(sn, src)}, &abi.Empty{})
}

// settleSnapshotDeletion finishes the deletion of sn, marked deleting,
// before its name is used again, as settleDeletion does for volumes.
func (s *Server) settleSnapshotDeletion(ctx context.Context, sn state.Snapshot) error {
	if s.settle.settling(snapKey(sn.ID)) {
		if err := s.settle.flush(ctx); err != nil {
			return err
		}
		if _, err := s.store.SnapshotRecord(sn.ID); errors.Is(err, state.ErrNotFound) {
			return nil
		}
	}
	unlock, err := s.lock(snapKey(sn.ID))
	if err != nil {
		return err
	}
	defer unlock()
	sn, err = s.store.SnapshotRecord(sn.ID)
	if errors.Is(err, state.ErrNotFound) || (err == nil && !sn.Deleting) {
		return nil
	} else if err != nil {
		return err
	}
	if s.settle.settling(snapKey(sn.ID)) {
		// As in settleDeletion: a batch holds the removal of its record.
		return errf(codes.Aborted, "the deletion of snapshot %q of this name is not settled yet", sn.ID)
	}
	b, ok := s.backends.Load().get(sn.Backend)
	if !ok {
		return errf(codes.FailedPrecondition, "snapshot %q of this name is being deleted and its backend %q is not loaded", sn.ID, sn.Backend)
	}
	var dirs hostcalls.DirSyncs
	if err := s.callDeleteSnapshot(s.deferSyncs(ctx, b, &dirs), b, &sn); err != nil {
		return fmt.Errorf("finish the deletion of snapshot %s of this name: %w", sn.ID, err)
	}
	if err := s.syncPools(dirs.Dirs(), b.name); err != nil {
		return fmt.Errorf("finish the deletion of snapshot %s of this name: %w", sn.ID, err)
	}
	if err := s.store.DeleteSnapshot(sn.ID); err != nil && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("finish the deletion of snapshot %s of this name: %w", sn.ID, err)
	}
	return nil
}

func (s *Server) deleteSnapshotLocked(ctx context.Context, sn *state.Snapshot) error {
	b, ok := s.backends.Load().get(sn.Backend)
	if !ok {
		return errf(codes.FailedPrecondition, "backend %q of snapshot %q is not loaded", sn.Backend, sn.ID)
	}
	if err := s.callDeleteSnapshot(ctx, b, sn); err != nil {
		return err
	}
	if err := s.store.DeleteSnapshot(sn.ID); err != nil {
		return fmt.Errorf("delete record %s: %w", sn.ID, err)
	}
	return nil
}

// ListSnapshots pages through the records, optionally filtered by snapshot
// or source volume.
func (s *Server) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, errf(codes.InvalidArgument, "max_entries is negative")
	}
	if id := req.GetSnapshotId(); id != "" {
		sn, err := s.store.GetSnapshot(id)
		if errors.Is(err, state.ErrNotFound) {
			// An empty list says the snapshot does not exist; one another
			// node's daemon holds does.
			if err := s.elsewhere(codes.FailedPrecondition, "snapshot", id); err != nil {
				return nil, err
			}
			return &csi.ListSnapshotsResponse{}, nil
		} else if err == nil && req.GetSourceVolumeId() != "" && sn.SourceVolumeID != req.GetSourceVolumeId() {
			return &csi.ListSnapshotsResponse{}, nil
		} else if err != nil {
			return nil, err
		}
		return &csi.ListSnapshotsResponse{Entries: []*csi.ListSnapshotsResponse_Entry{{Snapshot: csiSnapshot(&sn)}}}, nil
	}
	filter := state.SnapshotFilter{SourceVolumeID: req.GetSourceVolumeId()}
	entries, next, err := listPage(req.GetStartingToken(), int(req.GetMaxEntries()), func(token string, max int) ([]*csi.ListSnapshotsResponse_Entry, string, error) {
		snaps, next, err := s.store.ListSnapshots(filter, token, max)
		if err != nil {
			return nil, "", err
		}
		out := make([]*csi.ListSnapshotsResponse_Entry, 0, len(snaps))
		for i := range snaps {
			out = append(out, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(&snaps[i])})
		}
		return out, next, nil
	})
	if errors.Is(err, state.ErrBadToken) {
		return nil, errf(codes.Aborted, "starting_token %q is not valid", req.GetStartingToken())
	} else if err != nil {
		return nil, err
	}
	if src := req.GetSourceVolumeId(); src != "" && len(entries) == 0 && req.GetStartingToken() == "" {
		// No snapshot of a volume another node's daemon holds is not the
		// same as none of a volume that is gone.
		if _, err := s.store.GetVolume(src); errors.Is(err, state.ErrNotFound) {
			if err := s.elsewhere(codes.FailedPrecondition, "volume", src); err != nil {
				return nil, err
			}
		}
	}
	return &csi.ListSnapshotsResponse{Entries: entries, NextToken: next}, nil
}

// GetSnapshot returns one snapshot.
func (s *Server) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "snapshot_id missing")
	}
	sn, err := s.store.GetSnapshot(id)
	if err != nil {
		return nil, s.absent(err, "snapshot", id)
	}
	return &csi.GetSnapshotResponse{Snapshot: csiSnapshot(&sn)}, nil
}
