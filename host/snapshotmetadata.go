package host

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls/node"
)

// The SnapshotMetadata service. A backend's snapshot_data says where a
// snapshot's data is: a file inside its granted roots, whose allocated
// ranges (SEEK_DATA/SEEK_HOLE) or ranges whose contents differ between two
// snapshots the host lists, or a thin device of a device-mapper thin pool
// the module may use, whose mapped or changed blocks the host reads from
// the pool's metadata (hostcalls/dm). Either way the ranges stream in
// messages of at most max_results entries, and never more than
// maxMaxResults: a message is built whole in memory, and one of millions of
// ranges would outgrow the 4 MiB gRPC clients accept by default.
//
// A thin device's ranges come from the pool's metadata snapshot, which the
// pool holds while they are read and which serialises every other reader
// of that pool's metadata. They are spooled to an unlinked temporary file
// as they are read (16 bytes a range, never held in memory), the snapshot
// is released, and only then are they sent: a slow or stalled client
// holds its own stream, not the pool's metadata.

const (
	// defaultMaxResults is the batch size when the CO leaves max_results 0.
	defaultMaxResults = 256
	// maxMaxResults bounds a larger max_results (about 30 KiB a message).
	maxMaxResults = 1024
)

// snapshotSource is where one snapshot's data is: a file (pool, name) or
// a thin device (thin, thinID).
type snapshotSource struct {
	size int64
	// A file of a pool, read in blocks of blockSize.
	file      *node.SnapshotFile
	blockSize int64
	// A thin device of a pool; ranges come in the pool's blocks.
	thin   *node.ThinPool
	thinID uint32
}

func (src *snapshotSource) close() {
	if src.file != nil {
		src.file.Close()
	}
}

// snapshotSource resolves a snapshot ID to where its data is.
func (s *Server) snapshotSource(ctx context.Context, id string) (*snapshotSource, error) {
	sn, err := s.store.GetSnapshot(id)
	if err != nil {
		return nil, s.absent(err, "snapshot", id)
	}
	b, ok := s.backends.Load().get(sn.Backend)
	if !ok {
		return nil, errf(codes.FailedPrecondition, "backend %q of snapshot %q is not loaded", sn.Backend, id)
	}
	var src *state.Volume
	if v, err := s.store.GetVolume(sn.SourceVolumeID); err == nil {
		src = &v
	}
	var resp abi.SnapshotDataResponse
	if err := b.call(ctx, abi.OpSnapshotData, &abi.SnapshotDataRequest{Snapshot: snapshotRef(&sn, src)}, &resp); err != nil {
		return nil, err
	}
	size := resp.SizeBytes
	if size == 0 {
		size = sn.SizeBytes
	}
	if resp.ThinPool != "" {
		g := b.mod.Grant()
		pool, err := s.node.ThinPool(ctx, fmt.Sprintf("backend %q", b.name), g.HostCalls, g.Roots, resp.ThinPool)
		if err != nil {
			return nil, err
		}
		return &snapshotSource{size: size, thin: pool, thinID: resp.ThinID}, nil
	}
	file, err := s.node.OpenSnapshotFile(fmt.Sprintf("backend %q", b.name), b.mod.Grant().Roots, resp.Path)
	if err != nil {
		return nil, err
	}
	bs := resp.BlockSize
	if bs <= 0 {
		bs = 4096
	}
	return &snapshotSource{size: size, file: file, blockSize: bs}, nil
}

// rangeSender batches ranges into messages of at most max entries and
// sends at least one message, empty when there is nothing to report.
type rangeSender struct {
	max   int
	batch []*csi.BlockMetadata
	sent  bool
	send  func([]*csi.BlockMetadata) error
}

func (r *rangeSender) add(off, length int64) error {
	r.batch = append(r.batch, &csi.BlockMetadata{ByteOffset: off, SizeBytes: length})
	if len(r.batch) < r.max {
		return nil
	}
	return r.flush()
}

func (r *rangeSender) flush() error {
	batch := r.batch
	r.batch, r.sent = nil, true
	return r.send(batch)
}

func (r *rangeSender) finish() error {
	if len(r.batch) > 0 || !r.sent {
		return r.flush()
	}
	return nil
}

// thinRanges streams a thin device's block ranges (from list, in bytes)
// from off on, cut at the volume's size. list runs to its end before the
// first message is sent: its ranges go through a spool (see above).
func thinRanges(off, size int64, out *rangeSender, list func(emit func(start, end int64) error) error) error {
	sp, err := newRangeSpool()
	if err != nil {
		return err
	}
	defer sp.close()
	err = list(func(start, end int64) error {
		end = min(end, size)
		start = max(start, off)
		if start >= end {
			return nil
		}
		return sp.add(start, end-start)
	})
	if err != nil {
		return err
	}
	if err := sp.replay(out.add); err != nil {
		return err
	}
	return out.finish()
}

// rangeSpool keeps ranges in an unlinked temporary file: memory stays
// at its buffer's size however many there are, and nothing is left behind
// by a crash.
type rangeSpool struct {
	f *os.File
	w *bufio.Writer
}

func newRangeSpool() (*rangeSpool, error) {
	f, err := os.CreateTemp("", "wasmcsi-ranges-")
	if err != nil {
		return nil, fmt.Errorf("spool ranges: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("spool ranges: %w", err)
	}
	return &rangeSpool{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

func (sp *rangeSpool) add(off, length int64) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(off))
	binary.LittleEndian.PutUint64(b[8:], uint64(length))
	if _, err := sp.w.Write(b[:]); err != nil {
		return fmt.Errorf("spool ranges: %w", err)
	}
	return nil
}

// replay calls fn with every range added, in order.
func (sp *rangeSpool) replay(fn func(off, length int64) error) error {
	if err := sp.w.Flush(); err != nil {
		return fmt.Errorf("spool ranges: %w", err)
	}
	if _, err := sp.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("spool ranges: %w", err)
	}
	r := bufio.NewReaderSize(sp.f, 64<<10)
	var b [16]byte
	for {
		if _, err := io.ReadFull(r, b[:]); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("spool ranges: %w", err)
		}
		if err := fn(int64(binary.LittleEndian.Uint64(b[:8])), int64(binary.LittleEndian.Uint64(b[8:]))); err != nil {
			return err
		}
	}
}

func (sp *rangeSpool) close() { sp.f.Close() }

// batch is the number of entries per message for the CO's max_results.
func batch(max int32) int {
	if max <= 0 {
		return defaultMaxResults
	}
	return min(int(max), maxMaxResults)
}

func toBlockMetadata(rs []node.Range) []*csi.BlockMetadata {
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
	src, err := s.snapshotSource(ctx, req.GetSnapshotId())
	if err != nil {
		return err
	}
	defer src.close()
	size := src.size
	off := req.GetStartingOffset()
	if off < 0 || off > size {
		return errf(codes.OutOfRange, "starting_offset %d outside the volume's %d bytes", off, size)
	}
	if src.thin != nil {
		out := &rangeSender{max: batch(req.GetMaxResults()), send: func(bm []*csi.BlockMetadata) error {
			return stream.Send(&csi.GetMetadataAllocatedResponse{
				BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: size, BlockMetadata: bm,
			})
		}}
		return thinRanges(off, size, out, func(emit func(start, end int64) error) error {
			return src.thin.Mapped(ctx, src.thinID, emit)
		})
	}
	for {
		rs, next, err := src.file.Allocated(ctx, off, batch(req.GetMaxResults()))
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
		return s.absent(err, "snapshot", baseID)
	}
	target, err := s.store.GetSnapshot(targetID)
	if err != nil {
		return s.absent(err, "snapshot", targetID)
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
	baseSrc, err := s.snapshotSource(ctx, req.GetBaseSnapshotId())
	if err != nil {
		return err
	}
	defer baseSrc.close()
	targetSrc, err := s.snapshotSource(ctx, req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	defer targetSrc.close()
	size := targetSrc.size
	off := req.GetStartingOffset()
	if (baseSrc.thin != nil) != (targetSrc.thin != nil) ||
		(baseSrc.thin != nil && baseSrc.thin.Name() != targetSrc.thin.Name()) ||
		(baseSrc.file != nil && baseSrc.file.Pool() != targetSrc.file.Pool()) {
		return errf(codes.InvalidArgument, "snapshots %q and %q are not in one pool", req.GetBaseSnapshotId(), req.GetTargetSnapshotId())
	}
	if off < 0 || off > size {
		return errf(codes.OutOfRange, "starting_offset %d outside the volume's %d bytes", off, size)
	}
	if targetSrc.thin != nil {
		pool := targetSrc.thin
		off -= off % pool.BlockBytes()
		out := &rangeSender{max: batch(req.GetMaxResults()), send: func(bm []*csi.BlockMetadata) error {
			return stream.Send(&csi.GetMetadataDeltaResponse{
				BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: size, BlockMetadata: bm,
			})
		}}
		return thinRanges(off, size, out, func(emit func(start, end int64) error) error {
			return pool.Changed(ctx, baseSrc.thinID, targetSrc.thinID, emit)
		})
	}
	bs := targetSrc.blockSize
	off -= off % bs
	first := true
	for {
		rs, next, err := targetSrc.file.ChangedSince(ctx, baseSrc.file, off, batch(req.GetMaxResults()), bs)
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
