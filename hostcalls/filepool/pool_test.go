package filepool_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

func newPool(t *testing.T) *filepool.Pool {
	t.Helper()
	p, err := filepool.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func create(t *testing.T, p *filepool.Pool, name string, size int64) {
	t.Helper()
	if err := p.Create(context.Background(), name, size, false); err != nil {
		t.Fatal(err)
	}
}

// randomBytes returns n bytes of a fixed pseudo-random sequence.
func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func writeAt(t *testing.T, p *filepool.Pool, name string, off int64, data []byte) {
	t.Helper()
	f, err := p.OpenFile(context.Background(), name, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, p *filepool.Pool, name string) []byte {
	t.Helper()
	path, err := p.Path(name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func stat(t *testing.T, p *filepool.Pool, name string) (size, allocated int64) {
	t.Helper()
	size, allocated, err := p.Stat(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return size, allocated
}

func rootEntries(t *testing.T, p *filepool.Pool) []string {
	t.Helper()
	entries, err := os.ReadDir(p.Root())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestCreateSparse(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	create(t, p, "vol", 64*mib)
	size, allocated := stat(t, p, "vol")
	if size != 64*mib || allocated > 64*kib {
		t.Fatalf("sparse create: size %d, allocated %d", size, allocated)
	}
	path, _ := p.Path("vol")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v; want 0600", fi.Mode(), err)
	}
	if err := p.Create(ctx, "vol", 64*mib, false); err != nil {
		t.Fatalf("create again with the same size: %v", err)
	}
	if err := p.Create(ctx, "vol", 32*mib, false); abi.CodeOf(err) != abi.AlreadyExists {
		t.Fatalf("create again with another size = %v, want ALREADY_EXISTS", err)
	}
	if err := os.Mkdir(filepath.Join(p.Root(), "folder"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := p.Create(ctx, "folder", mib, false); abi.CodeOf(err) != abi.AlreadyExists {
		t.Fatalf("create over a folder = %v, want ALREADY_EXISTS", err)
	}
	if err := p.Create(ctx, "zero", 0, false); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("create of size 0 = %v, want INVALID_ARGUMENT", err)
	}
	if got := rootEntries(t, p); !slices.Equal(got, []string{"folder", "vol"}) {
		t.Fatalf("root holds %v, want only folder and vol (no temporaries)", got)
	}
}

func TestCreatePrealloc(t *testing.T) {
	p := newPool(t)
	if err := p.Create(context.Background(), "vol", 16*mib, true); err != nil {
		t.Fatal(err)
	}
	if size, allocated := stat(t, p, "vol"); size != 16*mib || allocated < 16*mib {
		t.Fatalf("preallocated create: size %d, allocated %d", size, allocated)
	}
}

func TestCreateConcurrently(t *testing.T) {
	p := newPool(t)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = p.Create(context.Background(), "vol", 8*mib, false) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("create %d: %v", i, err)
		}
	}
	if got := rootEntries(t, p); !slices.Equal(got, []string{"vol"}) {
		t.Fatalf("root holds %v, want only vol", got)
	}
}

func TestResize(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	create(t, p, "vol", 8*mib)
	for _, tc := range []struct {
		name         string
		size         int64
		prealloc     bool
		want         abi.Code
		wantSize     int64
		minAllocated int64
		maxAllocated int64
	}{
		{"grow sparse", 16 * mib, false, abi.OK, 16 * mib, 0, 64 * kib},
		// Preallocation fills the old part's holes too.
		{"grow preallocated", 24 * mib, true, abi.OK, 24 * mib, 24 * mib, 25 * mib},
		{"grow sparse again", 32 * mib, false, abi.OK, 32 * mib, 24 * mib, 25 * mib},
		{"same size", 32 * mib, false, abi.OK, 32 * mib, 24 * mib, 25 * mib},
		{"preallocate at the same size", 32 * mib, true, abi.OK, 32 * mib, 32 * mib, 33 * mib},
		{"shrink", 4 * mib, false, abi.InvalidArgument, 32 * mib, 32 * mib, 33 * mib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Resize(ctx, "vol", tc.size, tc.prealloc)
			if abi.CodeOf(err) != tc.want {
				t.Fatalf("resize = %v, want %v", err, tc.want)
			}
			size, allocated := stat(t, p, "vol")
			if size != tc.wantSize || allocated < tc.minAllocated || allocated > tc.maxAllocated {
				t.Fatalf("size %d, allocated %d; want %d, allocated in [%d, %d]",
					size, allocated, tc.wantSize, tc.minAllocated, tc.maxAllocated)
			}
		})
	}
	if err := p.Resize(ctx, "missing", mib, false); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("resize of a missing file = %v, want NOT_FOUND", err)
	}
}

func TestRemove(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	create(t, p, "vol", mib)
	if err := p.Remove(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Stat(ctx, "vol"); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("stat after remove = %v, want NOT_FOUND", err)
	}
	if err := p.Remove(ctx, "vol"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if err := os.Mkdir(filepath.Join(p.Root(), "folder"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(ctx, "folder"); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("remove of a folder = %v, want INVALID_ARGUMENT", err)
	}
}

// TestNamesRefused runs every operation with every name that could leave
// the root or collide with the pool's temporaries.
func TestNamesRefused(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	create(t, p, "ok", mib)
	ops := map[string]func(name string) error{
		"create":     func(n string) error { return p.Create(ctx, n, mib, false) },
		"resize":     func(n string) error { return p.Resize(ctx, n, 2*mib, false) },
		"remove":     func(n string) error { return p.Remove(ctx, n) },
		"stat":       func(n string) error { _, _, err := p.Stat(ctx, n); return err },
		"path":       func(n string) error { _, err := p.Path(n); return err },
		"open":       func(n string) error { _, err := p.OpenFile(ctx, n, true); return err },
		"clone from": func(n string) error { return p.Clone(ctx, n, "copy") },
		"clone to":   func(n string) error { return p.Clone(ctx, "ok", n) },
		"allocated":  func(n string) error { _, _, err := p.AllocatedRanges(ctx, n, 0, 1); return err },
		"changed": func(n string) error {
			_, _, err := p.ChangedRanges(ctx, "ok", n, 0, 1, 4096)
			return err
		},
	}
	for _, name := range []string{"", ".", "..", "../escape", "a/b", "/etc/passwd", "nul\x00", ".hidden",
		".wasmcsi-tmp-0", strings.Repeat("x", 256)} {
		for op, run := range ops {
			if err := run(name); abi.CodeOf(err) != abi.InvalidArgument {
				t.Errorf("%s %q = %v, want INVALID_ARGUMENT", op, name, err)
			}
		}
	}
	if got := rootEntries(t, p); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("root holds %v, want only ok", got)
	}
}

func TestSymlinksRefused(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(p.Root(), "evil")); err != nil {
		t.Fatal(err)
	}
	for op, run := range map[string]func() error{
		"create": func() error { return p.Create(ctx, "evil", mib, false) },
		"resize": func() error { return p.Resize(ctx, "evil", mib, true) },
		"stat":   func() error { _, _, err := p.Stat(ctx, "evil"); return err },
		"open":   func() error { _, err := p.OpenFile(ctx, "evil", false); return err },
		"clone":  func() error { return p.Clone(ctx, "evil", "copy") },
		"allocated": func() error {
			_, _, err := p.AllocatedRanges(ctx, "evil", 0, 1)
			return err
		},
	} {
		if err := run(); abi.CodeOf(err) != abi.PermissionDenied {
			t.Errorf("%s through a symlink = %v, want PERMISSION_DENIED", op, err)
		}
	}
	// Remove unlinks the link itself, never its target.
	if err := p.Remove(ctx, "evil"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "secret" {
		t.Fatalf("file outside the pool changed: %q, %v", b, err)
	}
}

func TestCloneCopyKeepsHolesAndData(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	create(t, p, "src", 64*mib)
	writeAt(t, p, "src", 0, randomBytes(mib, 1))
	writeAt(t, p, "src", 10*mib, randomBytes(4*kib, 2))
	writeAt(t, p, "src", 40*mib, randomBytes(2*mib, 3))
	if err := p.Clone(ctx, "src", "dst"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, p, "src"), readAll(t, p, "dst")) {
		t.Fatal("clone differs from its source")
	}
	srcSize, srcAlloc := stat(t, p, "src")
	dstSize, dstAlloc := stat(t, p, "dst")
	if dstSize != srcSize || dstAlloc > srcAlloc+64*kib {
		t.Fatalf("clone: size %d, allocated %d; source: size %d, allocated %d", dstSize, dstAlloc, srcSize, srcAlloc)
	}
	srcRanges, _, err := p.AllocatedRanges(ctx, "src", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	dstRanges, _, err := p.AllocatedRanges(ctx, "dst", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(srcRanges, dstRanges) {
		t.Fatalf("clone allocated %v, source %v", dstRanges, srcRanges)
	}

	for _, tc := range []struct {
		name     string
		src, dst string
		want     abi.Code
	}{
		{"existing destination", "src", "dst", abi.AlreadyExists},
		{"missing source", "missing", "other", abi.NotFound},
		{"onto itself", "src", "src", abi.InvalidArgument},
	} {
		if err := p.Clone(ctx, tc.src, tc.dst); abi.CodeOf(err) != tc.want {
			t.Errorf("%s: clone = %v, want %v", tc.name, err, tc.want)
		}
	}
	if got := rootEntries(t, p); !slices.Equal(got, []string{"dst", "src"}) {
		t.Fatalf("root holds %v, want only dst and src", got)
	}
}

func TestCloneCanceled(t *testing.T) {
	p := newPool(t)
	create(t, p, "src", 8*mib)
	writeAt(t, p, "src", 0, randomBytes(mib, 1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Clone(ctx, "src", "dst"); err == nil {
		t.Fatal("clone with a canceled context succeeded")
	}
	if got := rootEntries(t, p); !slices.Equal(got, []string{"src"}) {
		t.Fatalf("root holds %v after a canceled clone, want only src", got)
	}
}

func TestAllocatedRanges(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	create(t, p, "vol", 8*mib)
	for _, r := range []filepool.Range{{0, 4 * kib}, {mib, 64 * kib}, {3 * mib, 4 * kib}, {7*mib + 4*kib, 4 * kib}} {
		writeAt(t, p, "vol", r.Offset, randomBytes(int(r.Length), uint64(r.Offset)))
	}
	for _, tc := range []struct {
		name     string
		from     int64
		max      int
		want     []filepool.Range
		wantNext int64
	}{
		{"all", 0, 10, []filepool.Range{{0, 4 * kib}, {mib, 64 * kib}, {3 * mib, 4 * kib}, {7*mib + 4*kib, 4 * kib}}, 0},
		{"first page", 0, 3, []filepool.Range{{0, 4 * kib}, {mib, 64 * kib}, {3 * mib, 4 * kib}}, 7*mib + 4*kib},
		{"second page", 7*mib + 4*kib, 3, []filepool.Range{{7*mib + 4*kib, 4 * kib}}, 0},
		{"exact page leaves nothing", 0, 4, []filepool.Range{{0, 4 * kib}, {mib, 64 * kib}, {3 * mib, 4 * kib}, {7*mib + 4*kib, 4 * kib}}, 0},
		{"start inside a range", mib + 32*kib, 1, []filepool.Range{{mib + 32*kib, 32 * kib}}, 3 * mib},
		{"start in the last hole", 7*mib + 8*kib, 1, nil, 0},
		{"start past the end", 9 * mib, 1, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := p.AllocatedRanges(ctx, "vol", tc.from, tc.max)
			if err != nil || !slices.Equal(got, tc.want) || next != tc.wantNext {
				t.Fatalf("= %v, next %d, %v; want %v, next %d", got, next, err, tc.want, tc.wantNext)
			}
		})
	}
	if _, _, err := p.AllocatedRanges(ctx, "vol", -1, 1); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("negative offset = %v", err)
	}
	if _, _, err := p.AllocatedRanges(ctx, "vol", 0, 0); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("zero max = %v", err)
	}
}

// changedFixture makes base (1 MiB of data in 16 MiB) and target, a clone
// of base grown to 20 MiB with these writes:
//
//	8 KiB        4 KiB of new data          changed
//	64 KiB       8 KiB of new data          changed (one range)
//	512 KiB      4 KiB equal to base's      unchanged
//	5 MiB        4 KiB of data, base hole   changed
//	10 MiB       4 KiB of zeros, base hole  unchanged
//	18 MiB       4 KiB past base's end      changed
func changedFixture(t *testing.T, p *filepool.Pool) {
	t.Helper()
	ctx := context.Background()
	create(t, p, "base", 16*mib)
	baseData := randomBytes(mib, 10)
	writeAt(t, p, "base", 0, baseData)
	if err := p.Clone(ctx, "base", "target"); err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(ctx, "target", 20*mib, false); err != nil {
		t.Fatal(err)
	}
	writeAt(t, p, "target", 8*kib, randomBytes(4*kib, 11))
	writeAt(t, p, "target", 64*kib, randomBytes(8*kib, 12))
	writeAt(t, p, "target", 512*kib, baseData[512*kib:516*kib])
	writeAt(t, p, "target", 5*mib, randomBytes(4*kib, 13))
	writeAt(t, p, "target", 10*mib, make([]byte, 4*kib))
	writeAt(t, p, "target", 18*mib, randomBytes(4*kib, 14))
}

func TestChangedRanges(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	changedFixture(t, p)
	for _, tc := range []struct {
		name         string
		base, target string
		from         int64
		max          int
		blockSize    int64
		want         []filepool.Range
		wantNext     int64
	}{
		{"all 4k", "base", "target", 0, 10, 4 * kib,
			[]filepool.Range{{8 * kib, 4 * kib}, {64 * kib, 8 * kib}, {5 * mib, 4 * kib}, {18 * mib, 4 * kib}}, 0},
		{"reverse 4k", "target", "base", 0, 10, 4 * kib,
			[]filepool.Range{{8 * kib, 4 * kib}, {64 * kib, 8 * kib}, {5 * mib, 4 * kib}, {18 * mib, 4 * kib}}, 0},
		{"first page", "base", "target", 0, 2, 4 * kib,
			[]filepool.Range{{8 * kib, 4 * kib}, {64 * kib, 8 * kib}}, 5 * mib},
		{"second page", "base", "target", 5 * mib, 2, 4 * kib,
			[]filepool.Range{{5 * mib, 4 * kib}, {18 * mib, 4 * kib}}, 0},
		{"64k blocks", "base", "target", 0, 10, 64 * kib,
			[]filepool.Range{{0, 128 * kib}, {5 * mib, 64 * kib}, {18 * mib, 64 * kib}}, 0},
		{"identical", "base", "base", 0, 10, 4 * kib, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := p.ChangedRanges(ctx, tc.base, tc.target, tc.from, tc.max, tc.blockSize)
			if err != nil || !slices.Equal(got, tc.want) || next != tc.wantNext {
				t.Fatalf("= %v, next %d, %v; want %v, next %d", got, next, err, tc.want, tc.wantNext)
			}
		})
	}
}

func TestChangedRangesArguments(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	create(t, p, "a", mib)
	create(t, p, "b", mib)
	for _, tc := range []struct {
		name      string
		target    string
		from      int64
		max       int
		blockSize int64
		want      abi.Code
	}{
		{"zero block size", "b", 0, 1, 0, abi.InvalidArgument},
		{"huge block size", "b", 0, 1, 1 << 30, abi.InvalidArgument},
		{"unaligned start", "b", 100, 1, 4096, abi.InvalidArgument},
		{"negative start", "b", -4096, 1, 4096, abi.InvalidArgument},
		{"zero max", "b", 0, 0, 4096, abi.InvalidArgument},
		{"missing target", "c", 0, 1, 4096, abi.NotFound},
	} {
		if _, _, err := p.ChangedRanges(ctx, "a", tc.target, tc.from, tc.max, tc.blockSize); abi.CodeOf(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestStatfsAndPath(t *testing.T) {
	p := newPool(t)
	u, err := p.Statfs(context.Background())
	if err != nil || u.TotalBytes <= 0 || u.AvailableBytes > u.TotalBytes {
		t.Fatalf("statfs = %+v, %v", u, err)
	}
	if got, err := p.Path("vol"); err != nil || got != filepath.Join(p.Root(), "vol") {
		t.Fatalf("path = %q, %v", got, err)
	}
	if _, err := filepool.Open("relative/root"); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("open of a relative root = %v", err)
	}
	if _, err := filepool.Open(filepath.Join(t.TempDir(), "missing")); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("open of a missing root = %v", err)
	}
}
