package iscsi

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// attachLoop attaches a 1 MiB file to a free loop device for the test and
// detaches it on cleanup. It skips without root or loop devices.
func attachLoop(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: attaches a loop device")
	}
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
	defer unix.Close(ctl)
	file := filepath.Join(t.TempDir(), "backing")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	for range 10 { // another process may take the free device first
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Fatalf("LOOP_CTL_GET_FREE: %v", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open %s: %v", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(back.Fd())}
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if errors.Is(err, unix.EBUSY) {
			unix.Close(fd)
			continue
		}
		if err != nil {
			unix.Close(fd)
			t.Fatalf("LOOP_CONFIGURE %s: %v", dev, err)
		}
		t.Cleanup(func() {
			if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil {
				t.Errorf("detach %s: %v", dev, err)
			}
			unix.Close(fd)
		})
		return dev
	}
	t.Fatal("no free loop device after 10 tries")
	return ""
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
