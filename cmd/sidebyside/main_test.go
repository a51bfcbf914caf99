package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMedianAndRange(t *testing.T) {
	for _, c := range []struct {
		in     []float64
		med    float64
		lo, hi float64
	}{
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
		{[]float64{5}, 5, 5, 5},
	} {
		if m := median(c.in); m != c.med {
			t.Errorf("median(%v) = %v, want %v", c.in, m, c.med)
		}
		if lo, hi := minmax(c.in); lo != c.lo || hi != c.hi {
			t.Errorf("minmax(%v) = %v, %v, want %v, %v", c.in, lo, hi, c.lo, c.hi)
		}
	}
	in := []float64{3, 1, 2}
	median(in)
	if in[0] != 3 || in[1] != 1 {
		t.Errorf("median reordered its argument: %v", in)
	}
}

// Without the source tarball the reference is skipped with a reason that
// says where it was looked for, and nothing is built.
func TestHostpathSkippedWithoutTarball(t *testing.T) {
	dir := t.TempDir()
	bin, skip := buildHostpath(context.Background(), config{thirdparty: dir, cache: filepath.Join(dir, "cache")})
	if bin != "" || !strings.Contains(skip, dir) || !strings.Contains(skip, "WASMCSI_THIRDPARTY") {
		t.Fatalf("buildHostpath = %q, %q; want no binary and a reason naming %s", bin, skip, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "cache")); !os.IsNotExist(err) {
		t.Fatalf("cache folder created without a build: %v", err)
	}
}

// The floor leaves nothing mounted, and teardown unmounts nested mounts
// below the work folder (deepest first) before removing it.
func TestFloorAndTeardown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind mounts")
	}
	work := t.TempDir()
	t.Cleanup(func() {
		for _, m := range mountsUnder(work) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	src := filepath.Join(work, "floor", "src")
	if err := os.MkdirAll(src, 0o750); err != nil {
		t.Fatal(err)
	}
	if rate, err := floor(context.Background(), filepath.Join(work, "floor"), 50e6); err != nil || rate <= 0 {
		t.Fatalf("floor = %v, %v", rate, err)
	}
	if ms := mountsUnder(work); len(ms) != 0 {
		t.Fatalf("floor left mounts: %v", ms)
	}
	a, b := filepath.Join(work, "a"), filepath.Join(work, "a", "b")
	for _, p := range []string{a, b} {
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(src, a, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(b, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, b, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if ms := mountsUnder(work); len(ms) != 2 || ms[0] != b {
		t.Fatalf("mountsUnder = %v, want %s first of two", ms, b)
	}
	if err := teardown(work, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Fatalf("work folder left: %v", err)
	}
}

func TestSyncLatency(t *testing.T) {
	dir := t.TempDir()
	ms, err := syncLatency(dir)
	if err != nil || ms <= 0 {
		t.Fatalf("syncLatency = %v, %v", ms, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Fatalf("left files: %v", left)
	}
}
