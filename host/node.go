package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// The node service. A module's node_stage only says which device or
// directory holds the volume; the host does the generic steps (format when
// blank, mount, bind, block publish, stats, filesystem growth) the same way
// for every backend, and records each stage and publication so that a
// repeated call, a daemon restart or a reboot finds what to re-create
// instead of failing or mounting twice.
//
// When stage and publication records are written, synced and deleted, and
// why NodeUnstage marks its record first: host/RATIONALE.md, "Records".

// nodeBackend resolves the backend of a node request; a volume ID that is
// not ours, or whose backend is not loaded, is NOT_FOUND on this node.
func (s *Server) nodeBackend(id string) (*backend, error) {
	b, _, ok := s.backendFor(id)
	if !ok {
		return nil, errf(codes.NotFound, "volume %q not found: no loaded backend owns it", id)
	}
	return b, nil
}

func nodeVolumeRef(id string, volCtx map[string]string) abi.VolumeRef {
	_, _, local, _ := splitID(id)
	return abi.VolumeRef{LocalID: local, Context: volCtx}
}

// NodeStageVolume asks the backend for the volume's device or directory and
// mounts it at the staging path.
func (s *Server) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if err := s.nodePath("staging_target_path", staging); err != nil {
		return nil, err
	}
	c, err := capabilityFromCSI(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	b, err := s.nodeBackend(id)
	if err != nil {
		return nil, err
	}
	if err := s.nodeCapability(b, id, c); err != nil {
		return nil, err
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if old, err := s.store.GetStage(id); err == nil {
		if old.StagingPath != staging {
			return nil, errf(codes.FailedPrecondition, "volume %q is staged at %q", id, old.StagingPath)
		}
		if !stagedAs(&old, c) {
			return nil, errf(codes.AlreadyExists, "volume %q is staged at %q with another capability", id, staging)
		}
		if err := s.ensureStaged(ctx, b, &old, req.GetPublishContext(), req.GetSecrets()); err != nil {
			return nil, err
		}
		return &csi.NodeStageVolumeResponse{}, nil
	} else if !errors.Is(err, state.ErrNotFound) {
		return nil, err
	}
	if err := s.notOnThisNode(b, id); err != nil {
		return nil, err
	}
	if err := s.checkPublishedHere(id, req.GetPublishContext()); err != nil {
		return nil, err
	}
	rec := state.Stage{
		VolumeID: id, StagingPath: staging, Backend: b.name, Block: c.Block,
		FsType: c.FsType, MountFlags: c.MountFlags, AccessMode: int32(c.AccessMode),
		VolumeContext: req.GetVolumeContext(), StagedAt: time.Now().UTC(),
	}
	if !c.Block && rec.FsType == "" {
		rec.FsType = b.info.DefaultFsType
	}
	if err := s.stage(ctx, b, &rec, req.GetPublishContext(), req.GetSecrets(), true); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// nodeCapability checks the capability of a NodeStage or NodePublish
// against what the volume can be: what its backend offers and, where this
// daemon also holds the volume's controller record, the access type it was
// created for (a volume made for block access must not be formatted by a
// mount stage). Both are the spec's "Exceeds capabilities", which on these
// two RPCs is FAILED_PRECONDITION.
func (s *Server) nodeCapability(b *backend, id string, c abi.Capability) error {
	if err := b.supportsCapability(c); err != nil {
		return errf(codes.FailedPrecondition, "exceeds the volume's capabilities: %v", err)
	}
	v, err := s.store.GetVolume(id)
	if errors.Is(err, state.ErrNotFound) {
		return nil // a node without the controller's records
	} else if err != nil {
		return err
	}
	if !slices.ContainsFunc(v.Capabilities, func(h state.Capability) bool { return h.Block == c.Block }) {
		return errf(codes.FailedPrecondition, "exceeds the volume's capabilities: volume %q was not created for %s access", id, accessType(c.Block))
	}
	return nil
}

func accessType(block bool) string {
	if block {
		return "block"
	}
	return "mount"
}

// stagedAs reports whether a repeated NodeStage asks for the stage that
// exists: the same access type, fs type (when named), read-only-ness and
// mount flags. Anything else would need another mount at the same path,
// which is the spec's ALREADY_EXISTS.
func stagedAs(old *state.Stage, c abi.Capability) bool {
	return old.Block == c.Block &&
		(c.Block || c.FsType == "" || c.FsType == old.FsType) &&
		readOnlyMode(abi.AccessMode(old.AccessMode)) == readOnlyMode(c.AccessMode) &&
		slices.Equal(old.MountFlags, c.MountFlags)
}

// stage runs the backend's node_stage and the generic steps, and releases
// what the backend set up when a generic step fails. With record set, the
// stage record is written as soon as the backend has named the device or
// directory, synced while the generic steps run, and removed again when
// they fail; without it the caller records the stage. One memo spans the
// module's call and the device's claim after it (hostcalls.Memo), so the
// claim need not describe again the device node_stage just set up.
func (s *Server) stage(ctx context.Context, b *backend, rec *state.Stage, publishCtx, secrets map[string]string, record bool) error {
	if !b.has(abi.OpNodeStage) {
		return errf(codes.FailedPrecondition, "backend %q has no node_stage: it cannot serve volumes on nodes", b.name)
	}
	ctx = hostcalls.WithMemo(ctx)
	c := abi.Capability{Block: rec.Block, FsType: rec.FsType, MountFlags: rec.MountFlags, AccessMode: abi.AccessMode(rec.AccessMode)}
	mreq := abi.NodeStageRequest{Volume: nodeVolumeRef(rec.VolumeID, rec.VolumeContext), PublishContext: publishCtx, StagingPath: rec.StagingPath, Capability: c, Secrets: secrets}
	var resp abi.NodeStageResponse
	if err := b.call(ctx, abi.OpNodeStage, &mreq, &resp); err != nil {
		if record && unanswered(err) && s.undoUnansweredStage(ctx, b, rec) {
			// A code the CO counts as "uncertain" (kubelet then calls
			// NodeUnstage when it gives the stage up, which INTERNAL
			// would not make it do).
			return abi.Errorf(abi.Unavailable, "volume %q is partly staged, and NodeUnstage releases it: %s", rec.VolumeID, status.Convert(toStatus(err)).Message())
		}
		return err
	}
	if (resp.Device == "") == (resp.Directory == "") {
		return errf(codes.Internal, "backend %q node_stage must name exactly one of device or directory", b.name)
	}
	rec.Device, rec.Directory, rec.Context = resp.Device, resp.Directory, resp.Context
	rec.BackendFlags, rec.DeviceFile = resp.MountFlags, ""
	var err error
	if rec.Directory != "" {
		rec.Directory, err = s.confineDirectory(b, rec.Directory)
	} else {
		rec.Device, rec.DeviceFile, err = s.confineDevice(ctx, b, rec.Device)
	}
	if err != nil {
		s.release(ctx, b, rec)
		return err
	}
	durable := func() error { return nil }
	if record {
		durable, err = s.store.PutStageAsync(*rec)
		if err == nil {
			// In the log file before anything is mounted, its sync beside
			// the mount: a daemon killed once the mount is made finds the
			// record that names its device, and NodeUnstage releases it
			// whatever the backend (ownership without a record can be
			// proven only for pool files and folders).
			err = s.store.Written()
		}
		if err != nil {
			s.release(ctx, b, rec)
			return fmt.Errorf("record stage of %s: %w", rec.VolumeID, err)
		}
	}
	switch {
	case rec.Directory != "" && rec.Block:
		err = errf(codes.InvalidArgument, "backend %q serves directories, not block devices", b.name)
	case rec.Directory != "":
		err = s.bindDirectory(ctx, b, rec.Directory, rec.StagingPath, readOnlyMode(abi.AccessMode(rec.AccessMode)))
	case rec.Block:
		err = s.node.CheckDevice(rec.Device)
	default:
		err = s.node.FormatAndMount(ctx, rec.Device, rec.StagingPath, rec.FsType, append(slices.Clone(rec.MountFlags), rec.BackendFlags...), readOnlyMode(abi.AccessMode(rec.AccessMode)))
	}
	if err != nil {
		s.release(ctx, b, rec)
		if record {
			if derr := s.store.DeleteStage(rec.VolumeID); derr != nil {
				s.log.Warn("remove stage record after failed stage", "volume", rec.VolumeID, "err", derr)
			}
		}
		return err
	}
	if err := durable(); err != nil {
		return fmt.Errorf("record stage of %s: %w", rec.VolumeID, err)
	}
	return nil
}

// ensureStaged re-creates a recorded stage whose mount or device is gone
// (daemon restart, reboot); it does nothing when all is in place.
func (s *Server) ensureStaged(ctx context.Context, b *backend, rec *state.Stage, publishCtx, secrets map[string]string) error {
	ok, err := s.stagePresent(ctx, rec)
	if err != nil {
		return err
	}
	if ok {
		if rec.Unstaging || rec.LostReported {
			// An unstage the crash cut short, or a stage put back
			// behind the daemon's back: the stage stands.
			rec.Unstaging, rec.LostReported = false, false
			return s.store.PutStage(*rec)
		}
		return nil
	}
	rec.Unstaging, rec.LostReported = false, false
	s.log.Info("re-staging volume", "volume", rec.VolumeID, "staging", rec.StagingPath)
	// The record stays as it was until the stage is back: a failure here
	// must not lose it.
	if err := s.stage(ctx, b, rec, publishCtx, secrets, false); err != nil {
		return err
	}
	return s.store.PutStage(*rec)
}

// unanswered reports whether a module call failed without the module's
// own answer: the host stopped it (its deadline, its context, a trap, a
// host call that panicked), or it answered that something unexpected
// happened. Such a node_stage may have set up part of the stage.
func unanswered(err error) bool {
	switch abi.CodeOf(err) {
	case abi.DeadlineExceeded, abi.Canceled, abi.Internal, abi.Unknown:
		return true
	}
	return false
}

// stageUndoTimeout bounds the undo of a node_stage cut off, which runs
// after the call's own context has ended.
const stageUndoTimeout = 30 * time.Second

// undoUnansweredStage undoes a new stage whose node_stage was cut off. It
// may have set up part of the stage (a loop device, an iSCSI session) and
// named none of it, so no record would let a NodeUnstage release it, and
// a node daemon has no controller record to tell the backend which
// volume's storage that is. node_unstage gets the volume's context from
// the NodeStage request instead; if it fails too, the stage is recorded
// without a device, so that NodeUnstage or a repeated NodeStage takes it
// from there; undoUnansweredStage then reports true.
func (s *Server) undoUnansweredStage(ctx context.Context, b *backend, rec *state.Stage) (recorded bool) {
	if !b.has(abi.OpNodeUnstage) {
		return false
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stageUndoTimeout)
	defer cancel()
	volCtx := rec.VolumeContext
	if len(volCtx) == 0 {
		volCtx = s.controllerContext(rec.VolumeID) // a CO that passes none
	}
	mreq := abi.NodeUnstageRequest{Volume: nodeVolumeRef(rec.VolumeID, volCtx)}
	err := b.call(hostcalls.WithMemo(uctx), abi.OpNodeUnstage, &mreq, &abi.Empty{})
	if c := abi.CodeOf(err); err == nil || c == abi.InvalidArgument || c == abi.NotFound {
		return false
	}
	s.log.Warn("undo a node_stage that was cut off: recording the stage for NodeUnstage to release", "volume", rec.VolumeID, "err", err)
	partial := *rec
	partial.VolumeContext = volCtx // what NodeUnstage passes node_unstage
	if perr := s.store.PutStage(partial); perr != nil {
		s.log.Error("record a stage that was cut off; what it set up stays until the volume is staged again", "volume", rec.VolumeID, "err", perr)
		return false
	}
	return true
}

// release undoes node_stage after a failure, whatever the call's own
// context: a step cut off by its deadline must still be undone.
func (s *Server) release(ctx context.Context, b *backend, rec *state.Stage) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stageUndoTimeout)
	defer cancel()
	// Only a mount of what node_stage named is this stage's: a stage that
	// failed because something else is mounted at the path leaves it.
	if s.stageMount(rec) {
		if err := s.node.Unmount(ctx, rec.StagingPath); err != nil {
			s.log.Warn("unmount after failed stage", "path", rec.StagingPath, "err", err)
		}
	}
	if !b.has(abi.OpNodeUnstage) {
		return
	}
	mreq := abi.NodeUnstageRequest{Volume: nodeVolumeRef(rec.VolumeID, rec.VolumeContext), Device: rec.Device, Directory: rec.Directory, StageContext: rec.Context}
	if err := b.call(ctx, abi.OpNodeUnstage, &mreq, &abi.Empty{}); err != nil {
		s.log.Warn("node_unstage after failed stage", "volume", rec.VolumeID, "err", err)
	}
}

// stageMount reports whether the staging path of rec is mounted from the
// device or directory rec names.
func (s *Server) stageMount(rec *state.Stage) bool {
	switch {
	case rec.Device != "":
		return s.node.StagedAt(rec.StagingPath, rec.Device)
	case rec.Directory != "":
		return s.node.BindOf(rec.StagingPath, rec.Directory)
	}
	return false
}

// NodeUnstageVolume unmounts the staging path and lets the backend release
// the storage. A volume that is not staged is success.
func (s *Server) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if err := nodePath("staging_target_path", staging); err != nil {
		return nil, err
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := s.store.GetStage(id)
	if perr := s.teardownPath("staging_target_path", staging, func() (bool, error) {
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			return false, err // the records cannot say: never refuse as "outside the roots"
		}
		return err == nil && rec.StagingPath == staging, nil
	}); perr != nil {
		return nil, perr
	}
	if errors.Is(err, state.ErrNotFound) {
		b, err := s.nodeBackend(id)
		if err != nil {
			return nil, err // no record, and no backend of ours owns the ID
		}
		if err := s.unmountUnrecordedStage(ctx, b, id, staging); err != nil {
			return nil, err
		}
		if err := s.unstageUnrecorded(ctx, b, id, s.controllerContext(id)); err != nil {
			return nil, err
		}
		return &csi.NodeUnstageVolumeResponse{}, nil
	} else if err == nil && rec.StagingPath != staging {
		// Staged, but elsewhere: not staged at this path, which the spec
		// answers with OK. Whatever is mounted there is not this volume's.
		s.log.Info("NodeUnstage of a path the volume is not staged at: nothing touched", "volume", id, "staging", staging, "recorded", rec.StagingPath)
		return &csi.NodeUnstageVolumeResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	pubs, err := s.livePublications(ctx, &rec)
	if err != nil {
		return nil, err
	}
	if len(pubs) > 0 {
		return nil, errf(codes.FailedPrecondition, "volume %q is still published at %q", id, pubs[0].TargetPath)
	}
	// The record is marked as being unstaged, synced while the stage is
	// taken down, before the answer; the deletion that follows need not be.
	marked := rec
	marked.Unstaging = true
	durable, err := s.store.PutStageAsync(marked)
	if err != nil {
		return nil, fmt.Errorf("mark stage of %s: %w", id, err)
	}
	if err := s.unstage(ctx, &rec); err != nil {
		if perr := s.store.PutStage(rec); perr != nil {
			s.log.Warn("unmark stage record after failed unstage", "volume", id, "err", perr)
		}
		return nil, err
	}
	if err := durable(); err != nil {
		return nil, fmt.Errorf("mark stage of %s: %w", id, err)
	}
	if err := s.store.DeleteStageSoon(id); err != nil && !errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("delete stage record %s: %w", id, err)
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// unstage unmounts the staging path and lets the backend release the
// storage.
func (s *Server) unstage(ctx context.Context, rec *state.Stage) error {
	b, ok := s.backends.Load().get(rec.Backend)
	if err := s.unmountStage(ctx, b, rec); err != nil {
		return err
	}
	if !ok {
		return errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", rec.Backend, rec.VolumeID)
	}
	if !b.has(abi.OpNodeUnstage) {
		return nil
	}
	if rec.Device == "" && rec.Directory == "" {
		// A stage recorded after a cut-off node_stage names nothing,
		// as a volume with no record does.
		return s.unstageUnrecorded(ctx, b, rec.VolumeID, rec.VolumeContext)
	}
	mreq := abi.NodeUnstageRequest{Volume: nodeVolumeRef(rec.VolumeID, rec.VolumeContext), Device: rec.Device, Directory: rec.Directory, StageContext: rec.Context}
	// The memo lets the module's host calls share what they learn (a
	// loop device loop_find described, which loop_detach then detaches).
	return b.call(hostcalls.WithMemo(ctx), abi.OpNodeUnstage, &mreq, &abi.Empty{})
}

// unmountStage unmounts the mounts at the staging path that are the
// recorded stage's, topmost first (a stage repeated over itself stacks
// them), and stops at the first that is not: a mount of something else,
// over or under the stage, is not the volume's to take. A record that
// names nothing (written after a cut-off node_stage) is the volume's
// mount only where unmountUnrecordedStage finds it so; b is nil when
// the volume's backend is not loaded.
func (s *Server) unmountStage(ctx context.Context, b *backend, rec *state.Stage) error {
	if rec.Device == "" && rec.Directory == "" {
		if b == nil {
			return errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", rec.Backend, rec.VolumeID)
		}
		return s.unmountUnrecordedStage(ctx, b, rec.VolumeID, rec.StagingPath)
	}
	for i := 0; i < maxStackedStages && s.stageMount(rec); i++ {
		if err := s.node.UnmountTop(ctx, rec.StagingPath); err != nil {
			return err
		}
	}
	if s.stageMount(rec) {
		return errf(codes.Internal, "staging path %q of volume %q: still mounted after %d unmounts", rec.StagingPath, rec.VolumeID, maxStackedStages)
	}
	if mounted, _ := s.node.IsMounted(rec.StagingPath); mounted {
		s.log.Warn("NodeUnstage: the mount at the staging path is not the volume's stage, left as it is", "volume", rec.VolumeID, "staging", rec.StagingPath)
	}
	return nil
}

// maxStackedStages bounds the stage mounts unmountStage takes off one
// staging path.
const maxStackedStages = 64

// controllerContext returns the context of volume id where this daemon
// is its controller too, else nil.
func (s *Server) controllerContext(id string) map[string]string {
	if v, err := s.store.GetVolume(id); err == nil {
		return v.Context
	}
	return nil
}

// unmountUnrecordedStage unmounts the staging path of a volume with no
// stage record (or one whose record names nothing) only where the mount
// there is this volume's (node.OwnedMount: a bind of the pool folder or
// file named for the volume's local ID, or a loop device backed by such a
// file) and the path, its links resolved, is no recorded staging path or
// publication target of any volume. A new stage's record is written
// before its mount but synced after it, so a crash in between leaves such
// a mount, and the CO's NodeUnstage must release it; anything else
// mounted there (an unrelated filesystem, a stage or publication of
// another volume) is not this volume's and stays. Listing the node's
// records happens only on this path, a NodeUnstage with no record of its
// own.
func (s *Server) unmountUnrecordedStage(ctx context.Context, b *backend, id, staging string) error {
	_, _, local, _ := splitID(id)
	real, owned, err := s.node.OwnedMount(ctx, b.mod.Grant().Roots, staging, local)
	if err != nil {
		return err
	}
	if !owned {
		if mounted, _ := s.node.IsMounted(staging); mounted {
			s.log.Warn("NodeUnstage of a volume with no stage record: the mount at the staging path is not the volume's, nothing touched", "volume", id, "staging", staging)
		}
		return nil
	}
	// A recorded path is compared resolved too: a record or the request
	// may name it through a link.
	recorded := func(p string) bool {
		if p == staging || p == real {
			return true
		}
		r, err := filepath.EvalSymlinks(p)
		return err == nil && r == real
	}
	for token := ""; ; {
		stages, next, err := s.store.ListStages(token, 256)
		if err != nil {
			return err
		}
		for _, o := range stages {
			if o.VolumeID != id && recorded(o.StagingPath) {
				s.log.Warn("NodeUnstage of a volume with no stage record names the staging path of another: nothing touched", "volume", id, "staging", staging, "staged", o.VolumeID)
				return nil
			}
		}
		if token = next; token == "" {
			break
		}
	}
	for token := ""; ; {
		pubs, next, err := s.store.ListPublishes(token, 256)
		if err != nil {
			return err
		}
		for _, o := range pubs {
			if recorded(o.TargetPath) {
				s.log.Warn("NodeUnstage of a volume with no stage record names a publication target: nothing touched", "volume", id, "staging", staging, "published", o.VolumeID)
				return nil
			}
		}
		if token = next; token == "" {
			break
		}
	}
	// Only the volume's own mounts go, topmost first (a stage repeated
	// over itself stacks them): a mount of something else under them
	// is not the volume's to take.
	roots := b.mod.Grant().Roots
	for i := 0; i < maxStackedStages && owned; i++ {
		if err := s.node.UnmountTop(ctx, real); err != nil {
			return err
		}
		if _, owned, err = s.node.OwnedMount(ctx, roots, real, local); err != nil {
			return err
		}
	}
	if owned {
		return errf(codes.Internal, "staging path %q of volume %q: still mounted after %d unmounts", staging, id, maxStackedStages)
	}
	return nil
}

// unstageUnrecorded lets the backend release what a NodeStage cut off by a
// crash may have set up (a loop device, a session) before the stage record
// was written: no stage was acknowledged, and node_unstage succeeds where
// there is nothing to release. A backend that cannot tell the volume's
// storage from its ID and volCtx (INVALID_ARGUMENT, NOT_FOUND) has
// nothing it could release.
func (s *Server) unstageUnrecorded(ctx context.Context, b *backend, id string, volCtx map[string]string) error {
	if !b.has(abi.OpNodeUnstage) {
		return nil
	}
	mreq := abi.NodeUnstageRequest{Volume: nodeVolumeRef(id, volCtx)}
	err := b.call(ctx, abi.OpNodeUnstage, &mreq, &abi.Empty{})
	if c := abi.CodeOf(err); c == abi.InvalidArgument || c == abi.NotFound {
		s.log.Info("node_unstage of a volume with no stage record", "volume", id, "err", err)
		return nil
	}
	return err
}

// livePublications returns the recorded publications of a staged volume
// whose target is still a mount point, and forgets the others: a reboot,
// an unmount behind the daemon's back or a record deletion lost in a crash
// leaves such records, and they must not keep the volume from being
// unstaged. The read-only device of a forgotten read-only block
// publication goes with it, unless a live one still uses it.
func (s *Server) livePublications(ctx context.Context, rec *state.Stage) ([]state.Publish, error) {
	id := rec.VolumeID
	pubs, err := s.store.PublishesOf(id)
	if err != nil {
		return nil, err
	}
	live := pubs[:0]
	var forgotten *state.Publish
	for _, p := range pubs {
		mounted, err := s.node.IsMounted(p.TargetPath)
		if err != nil {
			return nil, err
		}
		// A publication start-up adopted from the mount table that the CO
		// never published again is not the CO's: it unpublished all it
		// knows of before it unstages. Such a mount is most often a copy
		// that mount propagation keeps of the staging mount (a kubelet
		// folder bind-mounted at a second place), which lives exactly as
		// long as the stage: counting it would refuse every NodeUnstage.
		// Unmounting the staging path takes the copy with it.
		if mounted && !p.Adopted() {
			live = append(live, p)
			continue
		}
		if mounted {
			s.log.Info("forgetting adopted publication the CO did not publish again", "volume", id, "target", p.TargetPath)
		} else {
			s.log.Info("forgetting publication whose target is not mounted", "volume", id, "target", p.TargetPath)
		}
		if p.Block && p.ReadOnly {
			forgotten = &p
		}
		if err := s.store.DeletePublishSoon(id, p.TargetPath); err != nil && !errors.Is(err, state.ErrNotFound) {
			return nil, err
		}
	}
	if forgotten != nil && !slices.ContainsFunc(live, func(p state.Publish) bool { return p.Block && p.ReadOnly }) {
		if err := s.node.ReleaseReadOnlyDevice(ctx, rec.Device, forgotten.Device); err != nil {
			return nil, err
		}
	}
	return live, nil
}

// NodePublishVolume binds the staged volume (or its device node) to the
// target path.
func (s *Server) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if err := s.nodePath("target_path", target); err != nil {
		return nil, err
	}
	c, err := capabilityFromCSI(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if isEphemeral(req) {
		// Inline ephemeral volumes come without a staging path by design:
		// they are exempt from the check below (ephemeral.go).
		return s.publishEphemeral(ctx, req, c)
	}
	if err := checkPublishStagingPath(req); err != nil {
		return nil, err
	}
	if err := s.inPathRoots("staging_target_path", staging); err != nil {
		return nil, err
	}
	b, err := s.nodeBackend(id)
	if err != nil {
		return nil, err
	}
	if err := s.nodeCapability(b, id, c); err != nil {
		return nil, err
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := s.store.GetStage(id)
	if errors.Is(err, state.ErrNotFound) {
		if err := s.notOnThisNode(b, id); err != nil {
			return nil, err
		}
	}
	if errors.Is(err, state.ErrNotFound) || (err == nil && rec.StagingPath != staging) {
		return nil, errf(codes.FailedPrecondition, "volume %q is not staged at %q", id, staging)
	} else if err != nil {
		return nil, err
	}
	if rec.Block != c.Block {
		return nil, errf(codes.FailedPrecondition, "exceeds the volume's capabilities: volume %q is staged for %s access", id, accessType(rec.Block))
	}
	if err := s.ensureStaged(ctx, b, &rec, req.GetPublishContext(), req.GetSecrets()); err != nil {
		return nil, err
	}
	readOnly := req.GetReadonly() || readOnlyMode(c.AccessMode)
	if err := s.publishAt(ctx, &rec, target, c, readOnly); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishAt publishes the staged volume rec at target: a repeat with the
// same arguments converges on the recorded publication, a new one is
// recorded before its bind and forgotten again when the bind fails.
func (s *Server) publishAt(ctx context.Context, rec *state.Stage, target string, c abi.Capability, readOnly bool) error {
	id := rec.VolumeID
	pubs, err := s.store.PublishesOf(id)
	if err != nil {
		return err
	}
	for _, p := range pubs {
		if p.TargetPath == target {
			// A record start-up rebuilt from the mount table (no time)
			// kept no mount flags, which the mount does not show: the
			// first repeat supplies them.
			adopted := p.Adopted()
			if p.ReadOnly != readOnly || p.Block != c.Block || !adopted && !slices.Equal(p.MountFlags, c.MountFlags) {
				return errf(codes.AlreadyExists, "volume %q is published at %q with other arguments", id, target)
			}
			if adopted {
				p.MountFlags, p.PublishedAt = c.MountFlags, time.Now().UTC()
				if err := s.store.PutPublishSoon(p); err != nil {
					return fmt.Errorf("record publication of %s at %s: %w", id, target, err)
				}
			}
			return s.publish(ctx, rec, &p)
		}
	}
	if c.AccessMode == abi.AccessSingleNodeSingleWriter && len(pubs) > 0 {
		return errf(codes.FailedPrecondition, "volume %q allows a single writer and is published at %q", id, pubs[0].TargetPath)
	}
	// The record comes first, so that DeleteVolume and a concurrent
	// unpublish see it, but is not waited for: a crash that loses it
	// leaves a mount that start-up records again (reconcile.go).
	p := state.Publish{VolumeID: id, TargetPath: target, StagingPath: rec.StagingPath, ReadOnly: readOnly, Block: c.Block, MountFlags: c.MountFlags, PublishedAt: time.Now().UTC()}
	if err := s.store.PutPublishSoon(p); err != nil {
		return fmt.Errorf("record publication of %s at %s: %w", id, target, err)
	}
	if err := s.publish(ctx, rec, &p); err != nil {
		if p.Block && p.ReadOnly {
			if rerr := s.releaseReadOnly(ctx, rec, &p); rerr != nil {
				s.log.Warn("release read-only device after failed publish", "volume", id, "target", target, "err", rerr)
			}
		}
		if derr := s.store.DeletePublishSoon(id, target); derr != nil {
			s.log.Warn("remove publication record after failed publish", "volume", id, "target", target, "err", derr)
		}
		return err
	}
	return nil
}

// checkPublishStagingPath checks the staging path of a NodePublishVolume.
// The node advertises STAGE_UNSTAGE_VOLUME, so a publish without one is the
// spec's "Staging target path not set": FAILED_PRECONDITION, the CO must
// stage first.
func checkPublishStagingPath(req *csi.NodePublishVolumeRequest) error {
	if req.GetStagingTargetPath() == "" {
		return errf(codes.FailedPrecondition, "staging_target_path not set: this node stages volumes (STAGE_UNSTAGE_VOLUME); call NodeStageVolume first")
	}
	return optionalNodePath("staging_target_path", req.GetStagingTargetPath())
}

// publish binds the staged volume at p's target: the staging path for
// mount access, the device node for block access. A read-only block
// publication binds a read-only loop device over the staged device
// instead, since a read-only bind of a device node leaves the device
// writable; p.Device records it, and when it changes (first publish, or a
// reboot took the old one) publish records p again before the bind (not
// waited for either: start-up finds the device from the mount, and one
// that no record names is an orphan it releases).
func (s *Server) publish(ctx context.Context, rec *state.Stage, p *state.Publish) error {
	if !p.Block {
		return s.node.Bind(ctx, rec.StagingPath, p.TargetPath, p.ReadOnly, false)
	}
	dev := rec.Device
	if p.ReadOnly {
		var err error
		if dev, err = s.node.ReadOnlyDevice(ctx, rec.Device); err != nil {
			return err
		}
		if p.Device != dev {
			p.Device = dev
			if err := s.store.PutPublishSoon(*p); err != nil {
				return fmt.Errorf("record publication of %s at %s: %w", p.VolumeID, p.TargetPath, err)
			}
		}
	}
	return s.node.Bind(ctx, dev, p.TargetPath, p.ReadOnly, true)
}

// releaseReadOnly detaches the read-only device of block publication p
// unless another read-only block publication of the volume shares it.
func (s *Server) releaseReadOnly(ctx context.Context, rec *state.Stage, p *state.Publish) error {
	pubs, err := s.store.PublishesOf(p.VolumeID)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(pubs, func(o state.Publish) bool { return o.TargetPath != p.TargetPath && o.Block && o.ReadOnly }) {
		return nil
	}
	return s.node.ReleaseReadOnlyDevice(ctx, rec.Device, p.Device)
}

// NodeUnpublishVolume unmounts the target path and removes it. A target
// that is not mounted is success.
func (s *Server) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if err := nodePath("target_path", target); err != nil {
		return nil, err
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.teardownPath("target_path", target, func() (bool, error) {
		if _, err := s.store.GetPublish(id, target); err == nil {
			return true, nil
		} else if !errors.Is(err, state.ErrNotFound) {
			return false, err
		}
		e, err := s.store.GetEphemeral(id)
		if errors.Is(err, state.ErrNotFound) {
			return false, nil
		}
		return err == nil && e.TargetPath == target, err
	}); err != nil {
		return nil, err
	}
	if e, err := s.store.GetEphemeral(id); err == nil {
		if err := s.unpublishEphemeral(ctx, &e, target); err != nil {
			return nil, err
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	} else if !errors.Is(err, state.ErrNotFound) {
		return nil, err
	} else if _, _, _, ok := splitID(id); !ok {
		if err := s.unpublishGoneEphemeral(id, target); err != nil {
			return nil, err
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	p, perr := s.store.GetPublish(id, target)
	if perr != nil && !errors.Is(perr, state.ErrNotFound) {
		return nil, perr
	}
	if _, err := s.nodeBackend(id); err != nil && perr != nil {
		// No backend of ours owns the ID and no publication was recorded
		// under it (its module since removed): the volume does not exist
		// here.
		return nil, err
	}
	if perr != nil {
		// No record: the target is this volume's only where the mount
		// there publishes its recorded stage (a publication whose record
		// a crash lost, by the rules start-up adopts such mounts by).
		// Anything else there, mounted or not, is not this volume's: it
		// is not published at target, which is OK, and nothing is touched.
		found, ok, err := s.unrecordedPublication(ctx, id, target)
		if err != nil {
			return nil, err
		}
		if !ok {
			s.log.Info("NodeUnpublish of a target with no publication of the volume: nothing touched", "volume", id, "target", target)
			return &csi.NodeUnpublishVolumeResponse{}, nil
		}
		p, perr = found, nil
	}
	if err := s.node.Unpublish(ctx, target); err != nil {
		return nil, err
	}
	// The read-only device goes before the record: a crash between the two
	// leaves a record whose retry finds the device gone, never a device
	// that no record names.
	if perr == nil && p.Block && p.ReadOnly {
		if rec, serr := s.store.GetStage(id); serr == nil {
			if err := s.releaseReadOnly(ctx, &rec, &p); err != nil {
				return nil, err
			}
		} else if !errors.Is(serr, state.ErrNotFound) {
			return nil, serr
		}
	}
	if err := s.store.DeletePublishSoon(id, target); err != nil && !errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("delete publication record %s at %s: %w", id, target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// unrecordedPublication finds a publication of volume id at target that
// no record names: a mount at target that binds the volume's recorded
// stage, by the rules start-up reconciliation adopts with
// (unrecordedPublications).
func (s *Server) unrecordedPublication(ctx context.Context, id, target string) (state.Publish, bool, error) {
	rec, err := s.store.GetStage(id)
	if errors.Is(err, state.ErrNotFound) {
		return state.Publish{}, false, nil
	} else if err != nil {
		return state.Publish{}, false, err
	}
	if mounted, err := s.node.IsMounted(target); err != nil || !mounted {
		return state.Publish{}, false, err
	}
	var roots []string
	for _, m := range s.cfg.Modules {
		roots = append(roots, m.Roots...)
	}
	seen, err := s.node.Observe(ctx, roots)
	if err != nil {
		return state.Publish{}, false, err
	}
	for _, p := range s.unrecordedPublications([]state.Stage{rec}, seen, roots, map[string]bool{}) {
		if p.TargetPath == target {
			return p, true, nil
		}
	}
	return state.Publish{}, false, nil
}

// volumeOnPath finds the stage record of a volume and checks that path is
// its staging path or one of its publication targets.
func (s *Server) volumeOnPath(id, path string) (*state.Stage, bool, error) {
	id = s.ephemeralVolumeID(id)
	rec, err := s.store.GetStage(id)
	if errors.Is(err, state.ErrNotFound) {
		return nil, false, errf(codes.NotFound, "volume %q is not staged on this node", id)
	} else if err != nil {
		return nil, false, err
	}
	if path == rec.StagingPath {
		return &rec, rec.Block, nil
	}
	p, err := s.store.GetPublish(id, path)
	if errors.Is(err, state.ErrNotFound) {
		return nil, false, errf(codes.NotFound, "volume %q is not at %q", id, path)
	} else if err != nil {
		return nil, false, err
	}
	return &rec, p.Block, nil
}

// NodeGetVolumeStats reports bytes and inodes of a mounted volume, or the
// size of a block volume.
func (s *Server) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if err := lookupNodePath(id, path); err != nil {
		return nil, err
	}
	if err := optionalNodePath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	rec, block, err := s.volumeOnPath(id, path)
	if err != nil {
		return nil, err
	}
	if block {
		size, err := s.node.DeviceSize(rec.Device)
		if err != nil {
			return nil, errf(codes.NotFound, "device of volume %q: %v", id, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	st, err := s.node.Usage(path)
	if err != nil {
		return nil, errf(codes.NotFound, "stats of %q: %v", path, err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Available: st.AvailableBytes, Used: st.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Available: st.FreeInodes, Used: st.UsedInodes},
	}}, nil
}

// NodeExpandVolume lets the backend make the device show its new size and
// grows the filesystem on it.
func (s *Server) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if err := lookupNodePath(id, path); err != nil {
		return nil, err
	}
	if err := optionalNodePath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	var capability *abi.Capability
	if req.GetVolumeCapability() != nil {
		c, err := capabilityFromCSI(req.GetVolumeCapability())
		if err != nil {
			return nil, err
		}
		capability = &c
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, block, err := s.volumeOnPath(id, path)
	if err != nil {
		return nil, err
	}
	b, ok := s.backends.Load().get(rec.Backend)
	if !ok {
		return nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", rec.Backend, id)
	}
	if c := capability; c != nil {
		// "Exceeds capabilities" is INVALID_ARGUMENT on the expand RPCs.
		if err := b.supportsCapability(*c); err != nil {
			return nil, errf(codes.InvalidArgument, "exceeds the volume's capabilities: %v", err)
		}
		if c.Block != block {
			return nil, errf(codes.InvalidArgument, "exceeds the volume's capabilities: volume %q is at %q for %s access", id, path, accessType(block))
		}
	}
	var capacity int64
	if b.has(abi.OpNodeExpand) {
		var resp abi.NodeExpandResponse
		mreq := abi.NodeExpandRequest{Volume: nodeVolumeRef(id, rec.VolumeContext), Device: rec.Device, RequiredBytes: req.GetCapacityRange().GetRequiredBytes(), StageContext: rec.Context}
		if err := b.call(ctx, abi.OpNodeExpand, &mreq, &resp); err != nil {
			return nil, err
		}
		capacity = resp.CapacityBytes
	}
	if rec.Device != "" && !block && !rec.Block {
		if err := s.node.GrowFS(ctx, rec.Device, rec.StagingPath, rec.FsType); err != nil {
			return nil, err
		}
	}
	if rec.Block {
		// A read-only loop device over the staged device keeps its size
		// until told.
		if err := s.node.ResizeReadOnlyDevice(ctx, rec.Device); err != nil {
			return nil, err
		}
	}
	if rec.Device != "" && capacity == 0 {
		if capacity, err = s.node.DeviceSize(rec.Device); err != nil {
			return nil, err
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: capacity}, nil
}

// NodeGetCapabilities lists what the node service does.
func (s *Server) NodeGetCapabilities(ctx context.Context, _ *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	set := s.backends.Load()
	types := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
	}
	if set.any(func(b *backend) bool { return b.info.NodeExpansion }) {
		types = append(types, csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
	}
	if set.any(func(b *backend) bool {
		return b.supportsMode(abi.AccessSingleNodeMultiWriter) || b.supportsMode(abi.AccessSingleNodeSingleWriter)
	}) {
		types = append(types, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	}
	slices.Sort(types)
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return resp, nil
}

// NodeGetInfo reports the node ID (with what backends tell the controller
// about this node), the union of the backends' topology segments and the
// smallest per-node volume limit any backend has. A backend whose
// node_info fails is left out (logged): its context and its segments are
// missing, so the CO places none of its topology-pinned volumes here while
// it fails, and every other backend keeps serving; failing the call would
// fail the node's registration for all of them. So is a backend whose
// context would make the node ID longer than CSI's 256 bytes: the smallest
// contexts are taken first, so one module's oversized context cannot push
// out the others'.
func (s *Server) NodeGetInfo(ctx context.Context, _ *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	type answer struct {
		b    *backend
		resp abi.NodeInfoResponse
		size int // what its context adds to the node ID
	}
	var answers []answer
	var maxVolumes int64
	for _, b := range s.backends.Load().all() {
		if m := b.info.MaxVolumesPerNode; m > 0 && (maxVolumes == 0 || m < maxVolumes) {
			maxVolumes = m
		}
		if !b.has(abi.OpNodeInfo) {
			continue
		}
		var resp abi.NodeInfoResponse
		if err := b.call(ctx, abi.OpNodeInfo, &abi.Empty{}, &resp); err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("backend %s node_info: %w", b.name, err)
			}
			s.log.Error("node_info failed: NodeGetInfo leaves the backend's node context and topology out", "backend", b.name, "err", err)
			continue
		}
		if resp.Topology != nil {
			if err := checkTopology(b.name, "node_info topology", resp.Topology.Segments); err != nil {
				s.log.Error("node_info answered a topology CSI does not allow: NodeGetInfo leaves the backend's node context and topology out", "backend", b.name, "err", err)
				continue
			}
		}
		answers = append(answers, answer{b: b, resp: resp, size: len(makeNodeID("", resp.Context))})
	}
	bySize := slices.Clone(answers)
	slices.SortStableFunc(bySize, func(x, y answer) int { return x.size - y.size })
	fits, trial := map[*backend]bool{}, map[string]string{}
	for _, a := range bySize {
		next := maps.Clone(trial)
		maps.Copy(next, a.resp.Context)
		if n := len(makeNodeID(s.cfg.NodeID, next)); n > maxNodeIDLen {
			s.log.Error("node_info context does not fit in a node ID: NodeGetInfo leaves the backend's node context and topology out",
				"backend", a.b.name, "context_bytes", a.size, "node_id_bytes", n, "max", maxNodeIDLen)
			continue
		}
		trial, fits[a.b] = next, true
	}
	nodeCtx := map[string]string{}
	segments := map[string]string{}
	for _, a := range answers { // in backend order, as without the check
		if !fits[a.b] {
			continue
		}
		maps.Copy(nodeCtx, a.resp.Context)
		if a.resp.Topology != nil {
			maps.Copy(segments, a.resp.Topology.Segments)
		}
	}
	id := makeNodeID(s.cfg.NodeID, nodeCtx)
	if len(id) > maxNodeIDLen {
		return nil, errf(codes.Internal, "node ID of %d bytes is longer than CSI's %d: the node name %q is too long", len(id), maxNodeIDLen, truncate(s.cfg.NodeID, 64))
	}
	out := &csi.NodeGetInfoResponse{NodeId: id, MaxVolumesPerNode: maxVolumes}
	if len(segments) > 0 {
		out.AccessibleTopology = &csi.Topology{Segments: segments}
	}
	return out, nil
}
