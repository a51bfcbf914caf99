package dm

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

const (
	testBlock    = 128       // 64 KiB data blocks
	testDataSize = 256 << 20 // 4096 blocks
	mib          = 1 << 20
)

type testPool struct {
	*Pool
	m         *Mapper
	meta, dat string
}

// newPool creates a pool on two fresh loop devices and removes it, with
// every thin device of it, when t ends.
func newPool(t *testing.T, name string) *testPool {
	t.Helper()
	m := newMapper(t, "dm_thin_pool")
	meta, _ := looptest.Device(t, int64(MetadataSize(testDataSize, testBlock, 100)))
	data, _ := looptest.Device(t, testDataSize)
	p, err := m.CreatePool(context.Background(), Pool{Name: testPrefix + name, MetaDev: meta, DataDev: data, BlockSectors: testBlock, LowWater: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePool(t, m, testPrefix+name) })
	return &testPool{Pool: p, m: m, meta: meta, dat: data}
}

// removePool removes the pool device name and every active thin of it.
func removePool(t *testing.T, m *Mapper, name string) {
	ctx := context.Background()
	list, err := m.List(ctx)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, d := range list {
		if strings.HasPrefix(d.Name, name+"-") {
			if err := m.Remove(ctx, d.Name); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
	if err := m.Remove(ctx, name); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

func (p *testPool) status(t *testing.T) PoolStatus {
	t.Helper()
	s, err := p.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestThinVolumesAndSnapshots(t *testing.T) {
	p := newPool(t, "snap")
	ctx := context.Background()
	s0 := p.status(t)
	if s0.TotalDataBlocks != testDataSize/(testBlock*SectorSize) || s0.UsedDataBlocks != 0 || s0.TransactionID != 0 ||
		s0.UsedMetaBlocks == 0 || s0.ReadOnly || s0.NeedsCheck || s0.Failed || s0.OutOfDataSpace || s0.BlockSectors != testBlock {
		t.Errorf("fresh pool status %+v", s0)
	}

	const size = 128 * mib / SectorSize // virtual: the pool has 256 MiB for all
	vol, err := p.CreateThin(ctx, 1, size)
	if err != nil {
		t.Fatal(err)
	}
	if vol != "/dev/mapper/"+testPrefix+"snap-1" || sizeOf(t, vol) != 128*mib {
		t.Errorf("thin %s of %d bytes", vol, sizeOf(t, vol))
	}
	if ts, err := p.ThinStatus(ctx, 1); err != nil || ts.MappedSectors != 0 || ts.HighestMapped != -1 {
		t.Errorf("fresh thin status %+v, %v", ts, err)
	}

	a := bytes.Repeat([]byte{0xA1}, mib)
	writeAt(t, vol, 0, a)
	s1 := p.status(t)
	if s1.UsedDataBlocks != mib/(testBlock*SectorSize) {
		t.Errorf("after writing 1 MiB: %d data blocks used, want 16", s1.UsedDataBlocks)
	}
	if s1.UsedMetaBlocks < s0.UsedMetaBlocks {
		t.Errorf("metadata use fell from %d to %d", s0.UsedMetaBlocks, s1.UsedMetaBlocks)
	}
	if ts, _ := p.ThinStatus(ctx, 1); ts.MappedSectors != mib/SectorSize || ts.HighestMapped != mib/SectorSize-1 {
		t.Errorf("thin status after write %+v", ts)
	}

	// A snapshot of the active volume shares every block.
	if err := p.Snapshot(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	if info, _ := p.m.Info(ctx, p.ThinName(1)); info.Suspended {
		t.Error("origin left suspended")
	}
	if info, _ := p.m.Info(ctx, p.ThinName(2)); info.Exists {
		t.Error("snapshot activated on its own")
	}
	if s := p.status(t); s.UsedDataBlocks != s1.UsedDataBlocks {
		t.Errorf("snapshot used %d new data blocks; it should share all", s.UsedDataBlocks-s1.UsedDataBlocks)
	}

	// Overwriting the origin unshares its blocks; the snapshot keeps A.
	b := bytes.Repeat([]byte{0xB2}, mib)
	writeAt(t, vol, 0, b)
	if s := p.status(t); s.UsedDataBlocks != 2*s1.UsedDataBlocks {
		t.Errorf("after overwriting the origin: %d data blocks, want %d", s.UsedDataBlocks, 2*s1.UsedDataBlocks)
	}
	snap, err := p.ActivateThin(ctx, 2, size)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAt(t, snap, 0, mib), a) {
		t.Error("snapshot lost the data it was taken with")
	}
	if !bytes.Equal(readAt(t, vol, 0, mib), b) {
		t.Error("origin lost its new data")
	}
	if again, err := p.ActivateThin(ctx, 2, size); err != nil || again != snap {
		t.Errorf("second activation: %s, %v", again, err)
	}
	_, err = p.ActivateThin(ctx, 2, 2*size)
	wantCode(t, "activation with another size", err, abi.AlreadyExists)

	_, err = p.CreateThin(ctx, 1, size)
	wantCode(t, "create of an existing id", err, abi.AlreadyExists)
	_, err = p.ActivateThin(ctx, 99, size)
	wantCode(t, "activation of a missing id", err, abi.NotFound)
	if info, _ := p.m.Info(ctx, p.ThinName(99)); info.Exists {
		t.Error("failed activation left a device")
	}
	wantCode(t, "snapshot of a missing origin", p.Snapshot(ctx, 99, 100), abi.NotFound)
	wantCode(t, "snapshot onto a used id", p.Snapshot(ctx, 1, 2), abi.AlreadyExists)

	// Deleting the snapshot frees only its own blocks.
	if err := p.DeleteThin(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(snap); !os.IsNotExist(err) {
		t.Errorf("snapshot node after delete: %v", err)
	}
	if s := p.status(t); s.UsedDataBlocks != s1.UsedDataBlocks {
		t.Errorf("after deleting the snapshot: %d data blocks, want %d", s.UsedDataBlocks, s1.UsedDataBlocks)
	}
	wantCode(t, "second delete", p.DeleteThin(ctx, 2), abi.NotFound)
	if err := p.DeleteThin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if s := p.status(t); s.UsedDataBlocks != 0 {
		t.Errorf("after deleting everything: %d data blocks", s.UsedDataBlocks)
	}
}

func TestPoolSurvivesDeactivation(t *testing.T) {
	p := newPool(t, "reopen")
	ctx := context.Background()
	const size = 64 * mib / SectorSize
	vol, err := p.CreateThin(ctx, 7, size)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("kept across reopen "), 4096)
	writeAt(t, vol, 3*mib, data)
	if err := p.Snapshot(ctx, 7, 8); err != nil {
		t.Fatal(err)
	}
	// A transaction id is pool metadata the reopen must find again.
	if err := p.message(ctx, "set_transaction_id 0 5"); err != nil {
		t.Fatal(err)
	}
	p.m.removeRetries, p.m.removeBackoff = 1, time.Millisecond
	wantCode(t, "deactivating a pool with an active thin", p.m.Remove(ctx, p.Name), abi.FailedPrecondition)
	if err := p.DeactivateThin(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if err := p.DeactivateThin(ctx, 7); err != nil {
		t.Errorf("second deactivation: %v", err)
	}
	if err := p.m.Remove(ctx, p.Name); err != nil {
		t.Fatal(err)
	}

	cfg := Pool{Name: p.Name, MetaDev: p.meta, DataDev: p.dat}
	_, err = p.m.CreatePool(ctx, Pool{Name: p.Name, MetaDev: p.meta, DataDev: p.dat, BlockSectors: testBlock})
	wantCode(t, "create over existing metadata", err, abi.AlreadyExists)
	_, err = p.m.OpenPool(ctx, Pool{Name: p.Name, MetaDev: p.meta, DataDev: p.dat, BlockSectors: 2 * testBlock})
	wantCode(t, "open with another block size", err, abi.InvalidArgument)

	again, err := p.m.OpenPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again.BlockSectors != testBlock {
		t.Errorf("block size read from metadata: %d", again.BlockSectors)
	}
	s, err := again.Status(ctx)
	if err != nil || s.TransactionID != 5 || s.UsedDataBlocks == 0 {
		t.Errorf("reopened pool status %+v, %v", s, err)
	}
	vol, err = again.ActivateThin(ctx, 7, size)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAt(t, vol, 3*mib, len(data)), data) {
		t.Error("volume data lost across deactivate and reopen")
	}
	snap, err := again.ActivateThin(ctx, 8, size)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAt(t, snap, 3*mib, len(data)), data) {
		t.Error("snapshot data lost across deactivate and reopen")
	}
	// Opening an active pool returns it.
	if third, err := p.m.OpenPool(ctx, cfg); err != nil || third.Path() != again.Path() {
		t.Errorf("open of the active pool: %v", err)
	}
}

func TestOpenPoolRefusesBlankMetadata(t *testing.T) {
	m := newMapper(t, "dm_thin_pool")
	meta, _ := looptest.Device(t, 4*mib)
	data, _ := looptest.Device(t, 16*mib)
	_, err := m.OpenPool(context.Background(), Pool{Name: testPrefix + "blank", MetaDev: meta, DataDev: data})
	wantCode(t, "open of blank metadata", err, abi.FailedPrecondition)
	if info, _ := m.Info(context.Background(), testPrefix+"blank"); info.Exists {
		t.Error("a pool was activated on blank metadata")
		m.Remove(context.Background(), testPrefix+"blank")
	}
	_, err = m.CreatePool(context.Background(), Pool{Name: testPrefix + "same", MetaDev: meta, DataDev: meta, BlockSectors: testBlock})
	wantCode(t, "pool with one device for both", err, abi.InvalidArgument)
	_, err = m.CreatePool(context.Background(), Pool{Name: testPrefix + "odd", MetaDev: meta, DataDev: data, BlockSectors: 100})
	wantCode(t, "pool with a bad block size", err, abi.InvalidArgument)
}

func TestResizeThin(t *testing.T) {
	p := newPool(t, "resize")
	ctx := context.Background()
	vol, err := p.CreateThin(ctx, 1, 32*mib/SectorSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ResizeThin(ctx, 1, 64*mib/SectorSize); err != nil {
		t.Fatal(err)
	}
	if got := sizeOf(t, vol); got != 64*mib {
		t.Errorf("size after grow %d", got)
	}
	wantCode(t, "shrink", p.ResizeThin(ctx, 1, 16*mib/SectorSize), abi.InvalidArgument)
	if err := p.ResizeThin(ctx, 1, 64*mib/SectorSize); err != nil {
		t.Errorf("resize to the same size: %v", err)
	}
	if err := p.DeactivateThin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.ResizeThin(ctx, 1, 128*mib/SectorSize); err != nil {
		t.Errorf("resize of an inactive thin: %v", err)
	}
	vol, err = p.ActivateThin(ctx, 1, 128*mib/SectorSize)
	if err != nil || sizeOf(t, vol) != 128*mib {
		t.Errorf("activation at the new size: %v", err)
	}
}

func TestPoolConfinement(t *testing.T) {
	p := newPool(t, "conf")
	ctx := context.Background()
	if _, err := p.CreateThin(ctx, 1, 2048); err != nil {
		t.Fatal(err)
	}
	other, err := New(testPrefix + "x")
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.OpenPool(ctx, Pool{Name: p.Name, MetaDev: p.meta, DataDev: p.dat})
	wantCode(t, "open of a pool under another grant", err, abi.PermissionDenied)
	_, err = other.CreatePool(ctx, Pool{Name: "vg0-pool", MetaDev: p.meta, DataDev: p.dat, BlockSectors: testBlock})
	wantCode(t, "create outside every grant", err, abi.PermissionDenied)
	list, _ := other.List(ctx)
	if slices.ContainsFunc(list, func(d Device) bool { return strings.HasPrefix(d.Name, p.Name) }) {
		t.Errorf("another grant lists the pool: %v", list)
	}
	// A thin name is the pool's name and the id, so a grant of the pool
	// covers its thins and nothing else.
	if name := p.ThinName(1); !strings.HasPrefix(name, p.Name+"-") || Confine(other.Prefixes(), name) == nil {
		t.Errorf("thin name %s", name)
	}
}

// TestThinOpTimes measures the thin operations a CSI driver runs per
// volume. Under TCG the numbers are several times those of hardware.
func TestThinOpTimes(t *testing.T) {
	p := newPool(t, "times")
	ctx := context.Background()
	const n = 10
	var create, snap, del, delSnap []time.Duration
	for i := range uint32(n) {
		id := 10 + 2*i
		t0 := time.Now()
		vol, err := p.CreateThin(ctx, id, 64*mib/SectorSize)
		if err != nil {
			t.Fatal(err)
		}
		create = append(create, time.Since(t0))
		writeAt(t, vol, 0, bytes.Repeat([]byte{byte(i)}, 256<<10))
		t0 = time.Now()
		if err := p.Snapshot(ctx, id, id+1); err != nil {
			t.Fatal(err)
		}
		snap = append(snap, time.Since(t0))
		t0 = time.Now()
		if err := p.DeleteThin(ctx, id+1); err != nil {
			t.Fatal(err)
		}
		delSnap = append(delSnap, time.Since(t0))
		t0 = time.Now()
		if err := p.DeleteThin(ctx, id); err != nil {
			t.Fatal(err)
		}
		del = append(del, time.Since(t0))
	}
	for _, c := range []struct {
		op string
		d  []time.Duration
	}{
		{"create_thin+activate", create}, {"snapshot (active origin)", snap},
		{"delete inactive snapshot", delSnap}, {"deactivate+delete", del},
	} {
		slices.Sort(c.d)
		var sum time.Duration
		for _, d := range c.d {
			sum += d
		}
		t.Logf("TIMING %-26s median %6.2f ms  mean %6.2f ms  max %6.2f ms  (n=%d)", c.op,
			ms(c.d[len(c.d)/2]), ms(sum/time.Duration(len(c.d))), ms(c.d[len(c.d)-1]), len(c.d))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func sizeOf(t *testing.T, path string) uint64 { return size(t, path) }

// TestThinState: an active thin reports its device, size and mapped
// sectors; an inactive one exists without being activated by the
// question; a deleted one does not exist; no probe device is left behind.
func TestThinState(t *testing.T) {
	p := newPool(t, "state")
	ctx := context.Background()
	state := func(id uint32) ThinState {
		t.Helper()
		st, err := p.ThinState(ctx, id)
		if err != nil {
			t.Fatalf("ThinState(%d): %v", id, err)
		}
		return st
	}
	const size = 32 * mib / SectorSize
	path, err := p.CreateThin(ctx, 4, size)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 64<<10), 1*mib); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st := state(4); !st.Exists || !st.Active || st.Path != path || st.Sectors != size || st.MappedSectors != testBlock || st.Failed {
		t.Fatalf("active thin: %+v, want active at %s with %d sectors, %d mapped", st, path, size, testBlock)
	}
	if err := p.DeactivateThin(ctx, 4); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if st := state(4); !st.Exists || st.Active {
		t.Fatalf("inactive thin: %+v, want existing and inactive", st)
	}
	t.Logf("MEASURE dm thin state (inactive, probe): %v", time.Since(start))
	if info, err := p.m.Info(ctx, p.ThinName(4)); err != nil || info.Exists {
		t.Fatalf("asking activated the thin: %+v, %v", info, err)
	}
	if st := state(9); st.Exists || st.Active {
		t.Fatalf("never created thin: %+v", st)
	}
	if err := p.DeleteThin(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if st := state(4); st.Exists || st.Active {
		t.Fatalf("deleted thin: %+v", st)
	}
	list, err := p.m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list {
		if strings.HasSuffix(d.Name, "-probe") {
			t.Errorf("probe device %s left behind", d.Name)
		}
	}
}

// TestThinMetadataBlocks: the blocks a live pool's metadata snapshot
// reports as mapped and as changed between two snapshots are exactly the
// ones written, read while the pool serves I/O; the snapshot is released
// afterwards, and concurrent readers of one pool take turns.
func TestThinMetadataBlocks(t *testing.T) {
	p := newPool(t, "meta")
	ctx := context.Background()
	const block = testBlock * SectorSize
	path, err := p.CreateThin(ctx, 1, 64*mib/SectorSize)
	if err != nil {
		t.Fatal(err)
	}
	write := func(blocks ...int64) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, b := range blocks {
			if _, err := f.WriteAt(bytes.Repeat([]byte{byte(b + 1)}, 4096), b*block+512); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	ranges := func(run func(emit func(BlockRange) error) error) []BlockRange {
		t.Helper()
		var out []BlockRange
		if err := run(func(r BlockRange) error { out = append(out, r); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	write(0, 5, 6)
	if err := p.Snapshot(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	write(6, 9)
	if err := p.Snapshot(ctx, 1, 3); err != nil {
		t.Fatal(err)
	}
	write(20) // after both snapshots: in neither
	start := time.Now()
	got := ranges(func(emit func(BlockRange) error) error { return p.MappedBlocks(ctx, 2, emit) })
	t.Logf("MEASURE dm thin mapped blocks (reserve, thin_dump, release): %v", time.Since(start))
	if want := []BlockRange{{0, 1}, {5, 2}}; !slices.Equal(got, want) {
		t.Errorf("mapped blocks of the first snapshot %v, want %v", got, want)
	}
	if got, want := ranges(func(emit func(BlockRange) error) error { return p.MappedBlocks(ctx, 3, emit) }), []BlockRange{{0, 1}, {5, 2}, {9, 1}}; !slices.Equal(got, want) {
		t.Errorf("mapped blocks of the second snapshot %v, want %v", got, want)
	}
	start = time.Now()
	got = ranges(func(emit func(BlockRange) error) error { return p.ChangedBlocks(ctx, 2, 3, emit) })
	t.Logf("MEASURE dm thin changed blocks (reserve, thin_delta, release): %v", time.Since(start))
	if want := []BlockRange{{6, 1}, {9, 1}}; !slices.Equal(got, want) {
		t.Errorf("changed blocks between the snapshots %v, want %v", got, want)
	}
	if st := p.status(t); st.HeldMetaRoot != "-" {
		t.Errorf("metadata snapshot still held: %q", st.HeldMetaRoot)
	}
	if err := p.MappedBlocks(ctx, 7, func(BlockRange) error { return nil }); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("mapped blocks of a missing id: %v, want NOT_FOUND", err)
	}

	// A snapshot left held (a reader that died) is released and taken
	// again; concurrent readers of the pool take turns.
	if _, err := p.m.Message(ctx, p.Name, 0, "reserve_metadata_snap"); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			var n int
			errs <- p.ChangedBlocks(ctx, 2, 3, func(BlockRange) error { n++; return nil })
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent reader: %v", err)
		}
	}
	if st := p.status(t); st.HeldMetaRoot != "-" {
		t.Errorf("metadata snapshot held after concurrent readers: %q", st.HeldMetaRoot)
	}
}
