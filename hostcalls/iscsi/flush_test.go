package iscsi

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// attachLoop attaches a 1 MiB file to a loop device for the test and
// detaches it on cleanup. It skips without root or loop devices.
func attachLoop(t *testing.T) string {
	t.Helper()
	vmtest.Require(t, "loop")
	file := filepath.Join(t.TempDir(), "backing")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := loop.Attach(context.Background(), file, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.DetachBound(context.Background(), d); err != nil {
			t.Errorf("detach %s: %v", d.Path, err)
		}
	})
	return d.Path
}

func TestFlushExclusiveRefusesHeldDevice(t *testing.T) {
	dev := attachLoop(t)
	if err := flushExclusive(dev); err != nil {
		t.Fatalf("flush of an idle device: %v", err)
	}
	// An exclusive holder stands for a mount or a device-mapper table.
	held, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = flushExclusive(dev)
	unix.Close(held)
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("flush of a held device = %v, want FAILED_PRECONDITION", err)
	}
	if err := flushExclusive(dev); err != nil {
		t.Fatalf("flush after release: %v", err)
	}
	if err := flushExclusive(filepath.Join(t.TempDir(), "gone")); err != nil {
		t.Fatalf("flush of a vanished device: %v", err)
	}
}
