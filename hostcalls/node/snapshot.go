package node

import (
	"context"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
)

// Snapshot data for the SnapshotMetadata service: a file of a pool, whose
// allocated or changed ranges the file's extents tell, or a thin device of
// a device-mapper thin pool, whose mapped or changed blocks the pool's
// metadata tells.

// Range is a byte range of a snapshot's data.
type Range = filepool.Range

// SnapshotFile is a snapshot's data in a file directly in a pool folder.
type SnapshotFile struct {
	pool *filepool.Pool
	name string
}

// OpenSnapshotFile opens the snapshot data file at path, which must lie
// inside roots; who names the module in errors ("backend \"x\"").
func (n *Node) OpenSnapshotFile(who string, roots []string, path string) (*SnapshotFile, error) {
	clean, err := hostcalls.Confine(roots, path, false)
	if err != nil {
		return nil, errf(codes.Internal, "%s named snapshot data %q outside its roots", who, path)
	}
	pool, err := filepool.Open(filepath.Dir(clean))
	if err != nil {
		return nil, err
	}
	return &SnapshotFile{pool: pool, name: filepath.Base(clean)}, nil
}

// Close closes the file's pool.
func (f *SnapshotFile) Close() error { return f.pool.Close() }

// Pool is the pool folder that holds the file.
func (f *SnapshotFile) Pool() string { return f.pool.Root() }

// Allocated returns up to max allocated ranges from off on, and where the
// next call starts (0 when there are no more).
func (f *SnapshotFile) Allocated(ctx context.Context, off int64, max int) ([]Range, int64, error) {
	return f.pool.AllocatedRanges(ctx, f.name, off, max)
}

// ChangedSince returns up to max ranges, in blocks of blockSize, whose
// contents differ from base's (a file of the same pool) from off on, and
// where the next call starts (0 when there are no more).
func (f *SnapshotFile) ChangedSince(ctx context.Context, base *SnapshotFile, off int64, max int, blockSize int64) ([]Range, int64, error) {
	return f.pool.ChangedRanges(ctx, base.name, f.name, off, max, blockSize)
}

// ThinPool is a device-mapper thin pool whose thin devices hold snapshots.
type ThinPool struct{ pool *dm.Pool }

// ThinPool opens the thin pool name under the device-mapper name prefixes
// of a dm grant (hostCalls the module's granted families, roots its
// roots): a module without that grant cannot have made thin devices, and
// one with it reaches only its own pools. who names the module in errors.
func (n *Node) ThinPool(ctx context.Context, who string, hostCalls, roots []string, name string) (*ThinPool, error) {
	var prefixes []string
	for _, r := range roots {
		if !strings.HasPrefix(r, "/") {
			prefixes = append(prefixes, r)
		}
	}
	if !slices.Contains(hostCalls, dm.Family) || len(prefixes) == 0 {
		return nil, errf(codes.Internal, "%s named thin pool %q without a dm grant", who, name)
	}
	m, err := dm.New(prefixes...)
	if err != nil {
		return nil, err
	}
	pool, err := m.AttachPool(ctx, name)
	if abi.CodeOf(err) == abi.PermissionDenied || abi.CodeOf(err) == abi.InvalidArgument {
		return nil, errf(codes.Internal, "%s named thin pool %q outside its grants: %v", who, name, err)
	}
	if err != nil {
		return nil, err
	}
	return &ThinPool{pool: pool}, nil
}

// Name is the pool's device-mapper name.
func (t *ThinPool) Name() string { return t.pool.Name }

// BlockBytes is the size of the pool's data blocks.
func (t *ThinPool) BlockBytes() int64 { return int64(t.pool.BlockSectors * dm.SectorSize) }

// Mapped emits the byte ranges [start, end) of thin device id's mapped
// blocks, in order.
func (t *ThinPool) Mapped(ctx context.Context, id uint32, emit func(start, end int64) error) error {
	return t.pool.MappedBlocks(ctx, id, t.bytes(emit))
}

// Changed emits the byte ranges [start, end) of the blocks that thin
// device target maps differently from base, in order.
func (t *ThinPool) Changed(ctx context.Context, base, target uint32, emit func(start, end int64) error) error {
	return t.pool.ChangedBlocks(ctx, base, target, t.bytes(emit))
}

func (t *ThinPool) bytes(emit func(start, end int64) error) func(dm.BlockRange) error {
	bs := t.BlockBytes()
	return func(r dm.BlockRange) error { return emit(int64(r.Begin)*bs, int64(r.End())*bs) }
}
