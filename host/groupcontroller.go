package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// Group snapshots: the host snapshots each source volume with its backend's
// create_snapshot while holding every volume's lock, so no other CSI call
// changes any member in between. Crash consistency across volumes is what
// the backends give (a reflink or thin snapshot is atomic per volume).

// GroupControllerGetCapabilities advertises group snapshots.
func (s *Server) GroupControllerGetCapabilities(ctx context.Context, _ *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
		}},
	}}}, nil
}

func groupSnapshotName(group, volume string) string { return group + "/" + volume }

// CreateVolumeGroupSnapshot snapshots every source volume. A repeat with the
// same name and sources answers the recorded group.
func (s *Server) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	name, srcs := req.GetName(), req.GetSourceVolumeIds()
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
		return s.groupResponse(&g)
	} else if !errors.Is(err, state.ErrNotFound) {
		return nil, err
	}
	for _, v := range srcs {
		if _, err := s.store.GetVolume(v); err != nil {
			return nil, notFoundOr(err, "volume %q", v)
		}
	}
	g := state.Group{ID: gid, Name: name, SourceVolumeIDs: srcs, CreatedAt: time.Now().UTC()}
	var made []*state.Snapshot
	for _, v := range srcs {
		sn, err := s.snapshotLocked(ctx, v, abi.CreateSnapshotRequest{Name: groupSnapshotName(name, v), Parameters: req.GetParameters()}, gid)
		if err != nil {
			for _, m := range made { // undo: a group is all or nothing
				if derr := s.deleteSnapshotLocked(ctx, m); derr != nil {
					s.log.Error("undo group snapshot member", "snapshot", m.ID, "err", derr)
				}
			}
			return nil, err
		}
		made = append(made, sn)
		g.SnapshotIDs = append(g.SnapshotIDs, sn.ID)
	}
	if err := s.store.PutGroup(g); err != nil {
		return nil, fmt.Errorf("record group snapshot %s: %w", gid, err)
	}
	return s.groupResponse(&g)
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
