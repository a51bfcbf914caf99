package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// CSI ephemeral inline volumes (Kubernetes' volumeLifecycleModes:
// Ephemeral). The CO calls NodePublishVolume with a volume_id it chose, no
// staging path, and a volume context holding the pod's volume attributes
// plus "csi.storage.k8s.io/ephemeral": "true"; it never calls CreateVolume,
// NodeStageVolume or DeleteVolume. So the node does all of it: create the
// volume through the backend's create_volume, stage it at a path of its
// own, publish it; and NodeUnpublishVolume undoes the three.
//
// Only backends whose storage is the node's own (BackendInfo.Ephemeral)
// take part: anything a controller must place or publish cannot be made
// by one node alone. The CO's volume_id is not a wasmcsi ID, so an
// ephemeral record (host/state) maps it to the volume the node created,
// and NodeUnpublishVolume, NodeGetVolumeStats and NodeGetVolumeHealth look
// there first.
//
// Crash safety: the record is written, durably, before each phase's work
// (publishing, then deleting), with everything needed to find what the
// work may have left: the create_volume request (create_volume is
// idempotent by name, so repeating it names a volume a crash left
// unrecorded), the host's staging path and the target. A publish that
// fails undoes itself, so a failed NodePublishVolume leaves nothing, as the
// CO expects. A retried NodePublishVolume resumes a record in "publishing",
// and finishes one in "deleting" before starting afresh; a retried
// NodeUnpublishVolume finishes the teardown; and start-up (Recover) takes
// down whatever was left mid-way, before the daemon serves: no publish
// that never answered success has a workload using it.

const (
	// ephemeralContextKey marks a NodePublishVolume of an inline volume.
	ephemeralContextKey = "csi.storage.k8s.io/ephemeral"
	// coContextPrefix starts the keys the CO adds to a volume context
	// (pod name, namespace, UID, service account, ephemeral): they are
	// the CO's, not backend parameters.
	coContextPrefix = "csi.storage.k8s.io/"
	// EphemeralSizeKey is the volume attribute that sets an ephemeral
	// volume's capacity: bytes, or a Kubernetes quantity ("512Mi", "1Gi",
	// "2G"). Without it the backend's default size applies.
	EphemeralSizeKey = "size"
	// ephemeralNamePrefix starts the create_volume name of an inline
	// volume, so it does not meet a CreateVolume name the CO picked.
	ephemeralNamePrefix = "ephemeral-"
	// ephemeralUndoTimeout bounds the undo of a failed publish, which
	// runs even when the CO's deadline is what failed it.
	ephemeralUndoTimeout = time.Minute
)

func isEphemeral(req *csi.NodePublishVolumeRequest) bool {
	return req.GetVolumeContext()[ephemeralContextKey] == "true"
}

// ephemeralVolumeID returns the wasmcsi ID of the volume the CO knows as
// id when id names an ephemeral inline volume, and id otherwise.
func (s *Server) ephemeralVolumeID(id string) string {
	if e, err := s.store.GetEphemeral(id); err == nil && e.VolumeID != "" {
		return e.VolumeID
	}
	return id
}

// publishEphemeral serves a NodePublishVolume of an inline ephemeral
// volume: validation first, then create, stage and publish under the
// record.
func (s *Server) publishEphemeral(ctx context.Context, req *csi.NodePublishVolumeRequest, c abi.Capability) (*csi.NodePublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if req.GetStagingTargetPath() != "" {
		return nil, errf(codes.InvalidArgument, "volume %q is an ephemeral inline volume: the CO does not stage it, so staging_target_path must be empty", id)
	}
	if c.Block {
		return nil, errf(codes.InvalidArgument, "ephemeral inline volumes are mount volumes, not block volumes")
	}
	b, params, err := s.backendForParams(req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	if !b.info.Ephemeral {
		return nil, errf(codes.InvalidArgument, "backend %q cannot serve ephemeral inline volumes: its storage is not this node's own (BackendInfo.Ephemeral)", b.name)
	}
	if err := b.supportsCapability(c); err != nil {
		return nil, errf(codes.InvalidArgument, "%v", err)
	}
	var required int64
	for k, v := range params {
		switch {
		case k == EphemeralSizeKey:
			if required, err = parseQuantity(v); err != nil {
				return nil, errf(codes.InvalidArgument, "volume attribute %q: %v", EphemeralSizeKey, err)
			}
			delete(params, k)
		case strings.HasPrefix(k, coContextPrefix):
			delete(params, k)
		}
	}
	if err := b.checkParameters(params); err != nil {
		return nil, err
	}
	size, err := b.sizeFor(required, 0, 0)
	if err != nil {
		return nil, err
	}
	if c.FsType == "" {
		c.FsType = b.info.DefaultFsType
	}
	want := state.Ephemeral{
		COVolumeID: id, Phase: state.EphemeralPublishing, Backend: b.name,
		Name: ephemeralNamePrefix + id, Parameters: params, RequiredBytes: size,
		Capability: state.Capability{FsType: c.FsType, MountFlags: c.MountFlags, AccessMode: int32(c.AccessMode)},
		ReadOnly:   req.GetReadonly() || readOnlyMode(c.AccessMode), TargetPath: target,
		StagingPath: s.ephemeralStagingPath(id), CreatedAt: time.Now().UTC(),
	}

	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := s.store.GetEphemeral(id)
	switch {
	case errors.Is(err, state.ErrNotFound):
		rec = want
	case err != nil:
		return nil, err
	case rec.Phase == state.EphemeralDeleting:
		// A teardown a crash or a failure interrupted: finish it, then
		// publish afresh.
		if err := s.teardownEphemeral(ctx, &rec); err != nil {
			return nil, err
		}
		rec = want
	case rec.TargetPath != target:
		return nil, errf(codes.FailedPrecondition, "ephemeral volume %q is published at %q", id, rec.TargetPath)
	default:
		if err := sameEphemeral(&rec, &want); err != nil {
			return nil, errf(codes.AlreadyExists, "ephemeral volume %q is published at %q with other arguments: %v", id, target, err)
		}
	}
	if rec.Phase != state.EphemeralPublished {
		if err := s.store.PutEphemeral(rec); err != nil {
			return nil, fmt.Errorf("record ephemeral volume %s: %w", id, err)
		}
	}
	if err := s.runEphemeral(ctx, b, &rec); err != nil {
		if rec.Phase != state.EphemeralPublished {
			s.undoEphemeral(ctx, &rec)
		}
		return nil, err
	}
	if rec.Phase != state.EphemeralPublished {
		rec.Phase = state.EphemeralPublished
		if err := s.store.PutEphemeral(rec); err != nil {
			return nil, fmt.Errorf("record ephemeral volume %s: %w", id, err)
		}
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// sameEphemeral compares a recorded inline volume with a repeated request.
func sameEphemeral(have, want *state.Ephemeral) error {
	switch {
	case have.Backend != want.Backend:
		return fmt.Errorf("backend %q, not %q", have.Backend, want.Backend)
	case have.RequiredBytes != want.RequiredBytes:
		return fmt.Errorf("%d bytes, not %d", have.RequiredBytes, want.RequiredBytes)
	case have.ReadOnly != want.ReadOnly:
		return fmt.Errorf("read-only %v", have.ReadOnly)
	case have.Capability.FsType != want.Capability.FsType || have.Capability.AccessMode != want.Capability.AccessMode ||
		!slices.Equal(have.Capability.MountFlags, want.Capability.MountFlags):
		return errors.New("another capability")
	case !maps.Equal(have.Parameters, want.Parameters):
		return errors.New("other volume attributes")
	}
	return nil
}

// runEphemeral creates, stages and publishes the volume of rec; every
// step finds what an earlier, interrupted run did.
func (s *Server) runEphemeral(ctx context.Context, b *backend, rec *state.Ephemeral) error {
	if rec.VolumeID == "" {
		if err := s.createEphemeral(ctx, b, rec); err != nil {
			return err
		}
		if err := s.store.PutEphemeral(*rec); err != nil {
			return fmt.Errorf("record ephemeral volume %s: %w", rec.COVolumeID, err)
		}
	}
	c := abi.Capability{FsType: rec.Capability.FsType, MountFlags: rec.Capability.MountFlags, AccessMode: abi.AccessMode(rec.Capability.AccessMode)}
	stage, err := s.store.GetStage(rec.VolumeID)
	switch {
	case errors.Is(err, state.ErrNotFound):
		stage = state.Stage{
			VolumeID: rec.VolumeID, StagingPath: rec.StagingPath, Backend: b.name, FsType: c.FsType,
			MountFlags: c.MountFlags, AccessMode: int32(c.AccessMode), VolumeContext: rec.Context, StagedAt: time.Now().UTC(),
		}
		if err := s.stage(ctx, b, &stage, nil, nil, true); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		if err := s.ensureStaged(ctx, b, &stage, nil, nil); err != nil {
			return err
		}
	}
	return s.publishAt(ctx, &stage, rec.TargetPath, c, rec.ReadOnly)
}

// createEphemeral runs create_volume for rec and keeps its answer in rec.
func (s *Server) createEphemeral(ctx context.Context, b *backend, rec *state.Ephemeral) error {
	mreq := abi.CreateVolumeRequest{
		Name: rec.Name, Parameters: rec.Parameters, RequiredBytes: rec.RequiredBytes,
		Capabilities: []abi.Capability{{FsType: rec.Capability.FsType, MountFlags: rec.Capability.MountFlags, AccessMode: abi.AccessMode(rec.Capability.AccessMode)}},
	}
	var resp abi.CreateVolumeResponse
	if err := b.call(ctx, abi.OpCreateVolume, &mreq, &resp); err != nil {
		return err
	}
	if err := checkCreatedVolume(b.name, nil, &resp); err != nil {
		return err
	}
	if resp.CapacityBytes < rec.RequiredBytes {
		return errf(codes.Internal, "backend %q provisioned %d bytes for a request of %d", b.name, resp.CapacityBytes, rec.RequiredBytes)
	}
	// Deleting through an ID another record holds, as the undo of a failed
	// publish or the teardown would, destroys that volume.
	if err := s.checkVolumeIDFree(b.name, resp.LocalID, rec.Name, true); err != nil {
		return err
	}
	rec.VolumeID, rec.CapacityBytes, rec.Context = makeID(b.name, "", resp.LocalID), resp.CapacityBytes, resp.Context
	return nil
}

// undoEphemeral takes down what a failed publish made, on a context of its
// own: the CO's deadline may be what failed it. What it cannot undo stays
// recorded as deleting for a retry or the next start-up.
func (s *Server) undoEphemeral(ctx context.Context, rec *state.Ephemeral) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ephemeralUndoTimeout)
	defer cancel()
	if err := s.teardownEphemeral(ctx, rec); err != nil {
		s.log.Warn("undo of a failed ephemeral publish", "volume", rec.COVolumeID, "err", err)
	}
}

// unpublishEphemeral serves NodeUnpublishVolume of an inline volume: its
// one target goes, and with it the stage and the volume. Another target
// path is only unmounted, as for any volume.
func (s *Server) unpublishEphemeral(ctx context.Context, rec *state.Ephemeral, target string) error {
	if target != rec.TargetPath {
		// Not published there: OK, and what is there is not the volume's.
		s.log.Info("NodeUnpublish of an inline volume at another target: nothing touched", "volume", rec.COVolumeID, "target", target, "published", rec.TargetPath)
		return nil
	}
	return s.teardownEphemeral(ctx, rec)
}

// unpublishGoneEphemeral answers a NodeUnpublishVolume whose volume ID no
// record names and wasmcsi cannot have issued: only the CO's IDs of inline
// volumes take that shape, so this is a repeat after a teardown that
// completed (its answer lost to a crash or a timeout), and NodeUnpublish
// must be idempotent; kubelet retries an unpublish that fails, NOT_FOUND
// included, for as long as the pod's volume is there. Success needs the
// target unmounted, though: a mount there is nothing this node knows.
func (s *Server) unpublishGoneEphemeral(id, target string) error {
	mounted, err := s.node.IsMounted(target)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if mounted {
		return errf(codes.NotFound, "volume %q not found: no record names it, and %q is mounted by something else", id, target)
	}
	return nil
}

// teardownEphemeral unpublishes, unstages and deletes the volume of rec
// and then forgets the record. It records the deleting phase first and
// runs each step so that it succeeds when already done.
func (s *Server) teardownEphemeral(ctx context.Context, rec *state.Ephemeral) error {
	if rec.Phase != state.EphemeralDeleting {
		rec.Phase = state.EphemeralDeleting
		if err := s.store.PutEphemeral(*rec); err != nil {
			return fmt.Errorf("record ephemeral volume %s: %w", rec.COVolumeID, err)
		}
	}
	b, ok := s.backends.Load().get(rec.Backend)
	if !ok {
		return errf(codes.FailedPrecondition, "backend %q of ephemeral volume %q is not loaded", rec.Backend, rec.COVolumeID)
	}
	if err := s.node.Unpublish(ctx, rec.TargetPath); err != nil {
		return err
	}
	if rec.VolumeID == "" {
		// create_volume never answered (a crash), or refused: a volume
		// may exist. create_volume is idempotent by name, so asking again
		// names it (or makes it, to be deleted below); a refusal says
		// there is none.
		err := s.createEphemeral(ctx, b, rec)
		switch {
		case refusal(err):
			return s.forgetEphemeral(rec)
		case err != nil:
			return fmt.Errorf("find the volume of ephemeral %s: %w", rec.COVolumeID, err)
		}
		if err := s.store.PutEphemeral(*rec); err != nil {
			return fmt.Errorf("record ephemeral volume %s: %w", rec.COVolumeID, err)
		}
	}
	if err := s.store.DeletePublishSoon(rec.VolumeID, rec.TargetPath); err != nil && !errors.Is(err, state.ErrNotFound) {
		return err
	}
	if stage, err := s.store.GetStage(rec.VolumeID); err == nil {
		if err := s.unstage(ctx, &stage); err != nil {
			return err
		}
		if err := s.store.DeleteStageSoon(rec.VolumeID); err != nil && !errors.Is(err, state.ErrNotFound) {
			return fmt.Errorf("delete stage record %s: %w", rec.VolumeID, err)
		}
	} else if !errors.Is(err, state.ErrNotFound) {
		return err
	} else if err := s.node.Unmount(ctx, rec.StagingPath); err != nil {
		return err
	} else if err := s.unstageUnrecorded(ctx, b, rec.VolumeID, rec.Context); err != nil {
		return err
	}
	_, _, local, _ := splitID(rec.VolumeID)
	mreq := abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: local, Context: rec.Context, CapacityBytes: rec.CapacityBytes}}
	if err := b.call(ctx, abi.OpDeleteVolume, &mreq, &abi.Empty{}); err != nil && abi.CodeOf(err) != abi.NotFound {
		return err
	}
	return s.forgetEphemeral(rec)
}

// forgetEphemeral removes what is left of an inline volume that has no
// volume any more: its staging folder and its record.
func (s *Server) forgetEphemeral(rec *state.Ephemeral) error {
	if err := os.Remove(rec.StagingPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove staging path of ephemeral %s: %w", rec.COVolumeID, err)
	}
	if err := s.store.DeleteEphemeral(rec.COVolumeID); err != nil && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("delete ephemeral record %s: %w", rec.COVolumeID, err)
	}
	return nil
}

// refusal reports whether a module's error is a final answer about the
// request (it created nothing), not a failure that a retry may get past.
func refusal(err error) bool {
	switch abi.CodeOf(err) {
	case abi.InvalidArgument, abi.OutOfRange, abi.FailedPrecondition, abi.AlreadyExists,
		abi.ResourceExhausted, abi.PermissionDenied, abi.Unimplemented, abi.NotFound:
		return true
	}
	return false
}

// Recover takes down the ephemeral inline volumes a crash left mid-way:
// those recorded as publishing (NodePublishVolume never answered success,
// so no workload uses them, and the CO's retry creates them afresh) and
// those recorded as deleting. Start-up runs it before serving; what it
// cannot take down stays recorded and is logged.
func (s *Server) Recover(ctx context.Context) {
	if s.cfg.Role == "controller" {
		return
	}
	recs, err := s.store.ListEphemerals()
	if err != nil {
		s.log.Warn("recover ephemeral volumes", "err", err)
		return
	}
	for i := range recs {
		rec := &recs[i]
		if rec.Phase == state.EphemeralPublished {
			continue
		}
		unlock, err := s.lock(volKey(rec.COVolumeID))
		if err != nil {
			continue
		}
		phase := rec.Phase
		err = s.teardownEphemeral(ctx, rec)
		unlock()
		if err != nil {
			s.log.Warn("recover ephemeral volume", "volume", rec.COVolumeID, "phase", phase, "err", err)
			continue
		}
		s.log.Info("took down an ephemeral volume left mid-way", "volume", rec.COVolumeID, "phase", phase, "target", rec.TargetPath)
	}
}

// ephemeralStagingPath is where the host stages the inline volume the CO
// calls id: under the state folder, named by a digest so that any ID
// makes a short, clean path.
func (s *Server) ephemeralStagingPath(id string) string {
	sum := sha256.Sum256([]byte(id))
	return filepath.Join(s.cfg.StateDir, "ephemeral", hex.EncodeToString(sum[:16]))
}

// parseQuantity reads a byte count written as Kubernetes writes
// quantities: digits with an optional binary (Ki, Mi, Gi, Ti, Pi, Ei) or
// decimal (k, M, G, T, P, E) suffix, e.g. "1073741824", "512Mi", "2G".
func parseQuantity(s string) (int64, error) {
	num, unit := s, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50}, {"Ei", 1 << 60},
		{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18},
	} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, unit = n, u.mult
			break
		}
	}
	if num == "" || strings.Trim(num, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a size: want bytes or a quantity such as 512Mi or 2Gi", s)
	}
	n, ok := new(big.Int).SetString(num, 10)
	if !ok {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	n.Mul(n, big.NewInt(unit))
	if !n.IsInt64() {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n.Int64(), nil
}
