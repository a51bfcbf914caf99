package host

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
)

// The SnapshotMetadata service. A backend's snapshot_data names the file
// that holds a snapshot's data (inside its granted roots); the host lists
// the file's allocated ranges (SEEK_DATA/SEEK_HOLE) or the ranges whose
// contents differ between two snapshots, and streams them in messages of at
// most max_results entries.

// defaultMaxResults is the batch size when the CO leaves max_results 0.
const defaultMaxResults = 256

// snapshotSource resolves a snapshot ID to its data file's pool and name.
func (s *Server) snapshotSource(ctx context.Context, id string) (*filepool.Pool, string, int64, int64, error) {
	sn, err := s.store.GetSnapshot(id)
	if err != nil {
		return nil, "", 0, 0, notFoundOr(err, "snapshot %q", id)
	}
	b, ok := s.backends.Load().get(sn.Backend)
	if !ok {
		return nil, "", 0, 0, errf(codes.FailedPrecondition, "backend %q of snapshot %q is not loaded", sn.Backend, id)
	}
	var src *state.Volume
	if v, err := s.store.GetVolume(sn.SourceVolumeID); err == nil {
		src = &v
	}
	var resp abi.SnapshotDataResponse
	if err := b.call(ctx, abi.OpSnapshotData, &abi.SnapshotDataRequest{Snapshot: snapshotRef(&sn, src)}, &resp); err != nil {
		return nil, "", 0, 0, err
	}
	path, err := hostcalls.Confine(b.mod.Grant().Roots, resp.Path, false)
	if err != nil {
		return nil, "", 0, 0, errf(codes.Internal, "backend %q named snapshot data %q outside its roots", b.name, resp.Path)
	}
	pool, err := filepool.Open(filepath.Dir(path))
	if err != nil {
		return nil, "", 0, 0, err
	}
	size := resp.SizeBytes
	if size == 0 {
		size = sn.SizeBytes
	}
	bs := resp.BlockSize
	if bs <= 0 {
		bs = 4096
	}
	return pool, filepath.Base(path), size, bs, nil
}

func batch(max int32) int {
	if max <= 0 {
		return defaultMaxResults
	}
	return int(max)
}

func toBlockMetadata(rs []filepool.Range) []*csi.BlockMetadata {
	out := make([]*csi.BlockMetadata, 0, len(rs))
	for _, r := range rs {
		out = append(out, &csi.BlockMetadata{ByteOffset: r.Offset, SizeBytes: r.Length})
	}
	return out
}

// GetMetadataAllocated streams the allocated ranges of a snapshot.
func (s *Server) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	ctx := stream.Context()
	if req.GetSnapshotId() == "" {
		return errf(codes.InvalidArgument, "snapshot_id missing")
	}
	if req.GetMaxResults() < 0 {
		return errf(codes.InvalidArgument, "max_results is negative")
	}
	pool, name, size, _, err := s.snapshotSource(ctx, req.GetSnapshotId())
	if err != nil {
		return err
	}
	defer pool.Close()
	off := req.GetStartingOffset()
	if off < 0 || off > size {
		return errf(codes.OutOfRange, "starting_offset %d outside the volume's %d bytes", off, size)
	}
	for {
		rs, next, err := pool.AllocatedRanges(ctx, name, off, batch(req.GetMaxResults()))
		if err != nil {
			return err
		}
		if len(rs) > 0 || off == req.GetStartingOffset() {
			if err := stream.Send(&csi.GetMetadataAllocatedResponse{
				BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: size, BlockMetadata: toBlockMetadata(rs),
			}); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		off = next
	}
}

// checkDeltaPair checks that a delta is asked between two snapshots of
// one volume, the base cut before the target, as the spec defines the
// target ("a second snapshot in the same volume, created after the base
// snapshot"): a delta across volumes, backwards or of a snapshot with
// itself means nothing a backup can apply, and is INVALID_ARGUMENT.
func (s *Server) checkDeltaPair(baseID, targetID string) error {
	base, err := s.store.GetSnapshot(baseID)
	if err != nil {
		return notFoundOr(err, "snapshot %q", baseID)
	}
	target, err := s.store.GetSnapshot(targetID)
	if err != nil {
		return notFoundOr(err, "snapshot %q", targetID)
	}
	switch {
	case base.SourceVolumeID != target.SourceVolumeID:
		return errf(codes.InvalidArgument, "snapshots %q and %q are of different volumes (%q, %q)", baseID, targetID, base.SourceVolumeID, target.SourceVolumeID)
	case baseID == targetID:
		return errf(codes.InvalidArgument, "base and target are the same snapshot %q", baseID)
	case !base.CreatedAt.Before(target.CreatedAt):
		return errf(codes.InvalidArgument, "base snapshot %q (%s) is not older than target %q (%s)", baseID, base.CreatedAt.Format(time.RFC3339Nano), targetID, target.CreatedAt.Format(time.RFC3339Nano))
	}
	return nil
}

// GetMetadataDelta streams the ranges that changed from the base snapshot
// to the target snapshot, in fixed blocks.
func (s *Server) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	ctx := stream.Context()
	if req.GetBaseSnapshotId() == "" || req.GetTargetSnapshotId() == "" {
		return errf(codes.InvalidArgument, "base_snapshot_id and target_snapshot_id are required")
	}
	if req.GetMaxResults() < 0 {
		return errf(codes.InvalidArgument, "max_results is negative")
	}
	if err := s.checkDeltaPair(req.GetBaseSnapshotId(), req.GetTargetSnapshotId()); err != nil {
		return err
	}
	base, baseName, _, _, err := s.snapshotSource(ctx, req.GetBaseSnapshotId())
	if err != nil {
		return err
	}
	defer base.Close()
	target, targetName, size, bs, err := s.snapshotSource(ctx, req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	defer target.Close()
	if base.Root() != target.Root() {
		return errf(codes.InvalidArgument, "snapshots %q and %q are not in one pool", req.GetBaseSnapshotId(), req.GetTargetSnapshotId())
	}
	off := req.GetStartingOffset()
	if off < 0 || off > size {
		return errf(codes.OutOfRange, "starting_offset %d outside the volume's %d bytes", off, size)
	}
	off -= off % bs
	first := true
	for {
		rs, next, err := target.ChangedRanges(ctx, baseName, targetName, off, batch(req.GetMaxResults()), bs)
		if err != nil {
			var ae *abi.Error
			if errors.As(err, &ae) {
				return err
			}
			return errf(codes.Internal, "%v", err)
		}
		if len(rs) > 0 || first {
			if err := stream.Send(&csi.GetMetadataDeltaResponse{
				BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: size, BlockMetadata: toBlockMetadata(rs),
			}); err != nil {
				return err
			}
		}
		first = false
		if next == 0 {
			return nil
		}
		off = next
	}
}
