package filepool

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

func TestSameBlocks(t *testing.T) {
	const shared = 0
	for _, tc := range []struct {
		name string
		a, b []extent
		want []Range
	}{
		{"identical maps", []extent{{0, 1000, 100, shared}}, []extent{{0, 1000, 100, shared}}, []Range{{0, 100}}},
		{"different disk bytes", []extent{{0, 1000, 100, shared}}, []extent{{0, 2000, 100, shared}}, nil},
		{"same disk bytes at another offset", []extent{{0, 1000, 100, shared}}, []extent{{50, 1000, 100, shared}}, nil},
		{"target rewrote the middle",
			[]extent{{0, 1000, 300, shared}},
			[]extent{{0, 1000, 100, shared}, {100, 5000, 50, 0}, {150, 1150, 150, shared}},
			[]Range{{0, 100}, {150, 150}}},
		{"split extents join", []extent{{0, 1000, 300, shared}},
			[]extent{{0, 1000, 100, shared}, {100, 1100, 200, shared}}, []Range{{0, 300}}},
		{"delayed allocation never counts", []extent{{0, 0, 100, extentDelalloc}}, []extent{{0, 0, 100, extentDelalloc}}, nil},
		{"unwritten never counts", []extent{{0, 1000, 100, extentUnwritten}}, []extent{{0, 1000, 100, extentUnwritten}}, nil},
		{"compressed never counts", []extent{{0, 1000, 100, extentEncoded}}, []extent{{0, 1000, 100, extentEncoded}}, nil},
		{"one side empty", nil, []extent{{0, 1000, 100, shared}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameBlocks(tc.a, tc.b); !slices.Equal(got, tc.want) {
				t.Fatalf("sameBlocks = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReflinkPool clones on filesystems with shared extents, mounted on
// loop devices: the clone takes no space, and ChangedRanges finds the
// written blocks while skipping the extents the files still share.
func TestReflinkPool(t *testing.T) {
	looptest.Require(t)
	for _, tc := range []struct {
		fstype string
		size   int64
	}{
		{fs.XFS, 320 << 20},
		{fs.Btrfs, 128 << 20},
	} {
		t.Run(tc.fstype, func(t *testing.T) {
			if _, err := exec.LookPath("mkfs." + tc.fstype); err != nil {
				t.Skipf("needs mkfs.%s: %v", tc.fstype, err)
			}
			ctx := context.Background()
			dev, _ := looptest.Device(t, tc.size)
			if err := fs.Make(ctx, dev, tc.fstype, fs.MakeOptions{}); err != nil {
				t.Fatal(err)
			}
			mnt := t.TempDir()
			if err := unix.Mount(dev, mnt, tc.fstype, 0, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := unix.Unmount(mnt, 0); err != nil {
					t.Errorf("unmount: %v", err)
				}
			})
			p, err := Open(mnt)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()

			const mib = 1 << 20
			if err := p.Create(ctx, "src", 64*mib, false); err != nil {
				t.Fatal(err)
			}
			data := make([]byte, 16*mib)
			rnd := rand.NewChaCha8([32]byte{1})
			rnd.Read(data)
			writeFile(t, p, "src", 0, data)
			syncPool(t, p)
			before, err := p.Statfs(ctx)
			if err != nil {
				t.Fatal(err)
			}

			if err := p.Clone(ctx, "src", "snap"); err != nil {
				t.Fatal(err)
			}
			syncPool(t, p)
			after, err := p.Statfs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if grew := after.UsedBytes - before.UsedBytes; grew > 4*mib {
				t.Fatalf("a reflink clone of 16 MiB of data used %d bytes", grew)
			}
			snap := readFile(t, p, "snap")
			if !bytes.Equal(snap[:16*mib], data) || len(snap) != 64*mib {
				t.Fatal("clone differs from its source")
			}

			// Writes to the source after the snapshot: two in shared
			// data, one in a hole.
			writes := []Range{{4096, 4096}, {12 * mib, 8192}, {40 * mib, 4096}}
			for i, w := range writes {
				writeFile(t, p, "src", w.Offset, bytes.Repeat([]byte{byte(i + 1)}, int(w.Length)))
			}
			got, next, read, err := p.changedRanges(ctx, "snap", "src", 0, 100, 4096)
			if err != nil || next != 0 || !slices.Equal(got, writes) {
				t.Fatalf("changed ranges = %v, next %d, %v; want %v", got, next, err, writes)
			}
			// Shared extents were skipped: far less than the 16 MiB of
			// data was read.
			if read > 2*mib {
				t.Fatalf("read %d bytes of each file to find %d changed blocks", read, len(writes))
			}
		})
	}
}

func writeFile(t *testing.T, p *Pool, name string, off int64, b []byte) {
	t.Helper()
	f, err := p.OpenFile(context.Background(), name, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p *Pool, name string) []byte {
	t.Helper()
	f, err := p.OpenFile(context.Background(), name, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func syncPool(t *testing.T, p *Pool) {
	t.Helper()
	if err := unix.Syncfs(p.dirFD()); err != nil {
		t.Fatal(err)
	}
}

// TestWithoutTmpfile runs Create and Clone the way they run on filesystems
// without O_TMPFILE (NFS): through a hidden temporary name that must not
// stay behind.
func TestWithoutTmpfile(t *testing.T) {
	ctx := context.Background()
	p, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.noTmpfile.Store(true)
	if err := p.Create(ctx, "vol", 1<<20, false); err != nil {
		t.Fatal(err)
	}
	writeFile(t, p, "vol", 4096, []byte("data"))
	if err := p.Clone(ctx, "vol", "copy"); err != nil {
		t.Fatal(err)
	}
	if err := p.Clone(ctx, "vol", "copy"); err == nil {
		t.Fatal("clone onto an existing name succeeded")
	}
	if got := readFile(t, p, "copy"); string(got[4096:4100]) != "data" || len(got) != 1<<20 {
		t.Fatal("clone through a temporary name lost data")
	}
	entries, err := os.ReadDir(p.Root())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"copy", "vol"}) {
		t.Fatalf("root holds %v, want only copy and vol", names)
	}
}
