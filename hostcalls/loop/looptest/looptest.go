// Package looptest gives tests real loop devices over sparse files, detached
// again when the test ends, also on failure. Tests of every block primitive
// use it. It must never be imported by non-test code, and it skips (never
// passes) a test on a machine without root or loop devices.
package looptest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// Require skips t unless this process can attach loop devices.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: attaches loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
}

// SparseFile creates a sparse file of size bytes in a fresh temporary folder
// and returns its path.
func SparseFile(t testing.TB, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

// Device attaches a new sparse file of size bytes and returns the device and
// its backing file. The device is detached when t ends; a test that mounts it
// registers its unmount with t.Cleanup after Device returns, so that the
// unmount runs first.
func Device(t testing.TB, size int64) (dev, file string) {
	t.Helper()
	Require(t)
	file = SparseFile(t, size)
	d, err := loop.Attach(context.Background(), file, loop.Options{})
	if err != nil {
		t.Fatalf("attach %s: %v", file, err)
	}
	// The test may have detached it itself: then the number may back
	// another process's file by now, which a detach by path would unbind.
	t.Cleanup(func() {
		if err := loop.DetachBound(context.Background(), d); err != nil {
			t.Errorf("detach %s: %v", d.Path, err)
		}
	})
	return d.Path, file
}
