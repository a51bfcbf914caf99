package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The stage floor mounts the ext4 image for real and leaves neither a mount
// nor a loop device; teardown detaches a loop device an interrupted run
// left on a file of the work folder, and then removes the folder.
func TestStageFloorAndTeardownDetaches(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices and mounts")
	}
	work := t.TempDir()
	t.Cleanup(func() {
		for _, m := range mountsUnder(work) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		detachLoops(work)
	})
	img, target, err := floorImage(context.Background(), work, 16<<20, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range []bool{false, true} {
		if err := floorStageCycle(img, target, block); err != nil {
			t.Fatalf("floorStageCycle(block=%v): %v", block, err)
		}
		if ms := mountsUnder(work); len(ms) != 0 {
			t.Fatalf("floor left mounts: %v", ms)
		}
		if ls := loopsUnder(work); len(ls) != 0 {
			t.Fatalf("floor left loop devices: %v", ls)
		}
	}
	// The mount is real: the image's ext4 holds lost+found.
	dev, fd, err := floorAttach(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, target, "ext4", 0, ""); err != nil {
		floorDetach(dev, fd)
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(target, "lost+found")); err != nil {
		t.Errorf("mounted image: %v", err)
	}
	unix.Close(fd) // the device stays bound to the image
	if ls := loopsUnder(work); len(ls) != 1 || ls[0] != dev {
		t.Fatalf("loopsUnder = %v, want [%s]", ls, dev)
	}
	if err := teardown(work, nil); err != nil {
		t.Fatal(err)
	}
	if ls := loopsUnder(work); len(ls) != 0 {
		t.Fatalf("teardown left loop devices: %v", ls)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Fatalf("work folder left: %v", err)
	}
}

// Without loop devices the stage cycle is skipped with a reason that names
// what is missing, and the rest of the comparison still runs.
func TestStageSkippedWithoutLoopDevices(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "loop-control")
	if why := stageSkipped(missing); !strings.Contains(why, missing) {
		t.Fatalf("stageSkipped(%s) = %q, want a reason naming it", missing, why)
	}
}
