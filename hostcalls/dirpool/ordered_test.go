package dirpool

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// A pool leaves a file's own sync to the journal only where there is one:
// the ext4 driver mounts ext2, and ext4 made without has_journal, under the
// same magic number as a journaled ext4, and their metadata reaches the
// disk in any order.
func TestOrderedOnlyWithAJournal(t *testing.T) {
	for _, tc := range []struct {
		name, fstype string
		mkfs         []string
		want         bool
	}{
		{"ext4", "ext4", []string{"mke2fs", "-t", "ext4", "-q", "-F"}, true},
		{"ext4 without a journal", "ext4", []string{"mke2fs", "-t", "ext4", "-q", "-F", "-O", "^has_journal"}, false},
		{"ext2", "ext2", []string{"mke2fs", "-t", "ext2", "-q", "-F"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt := freshFS(t, 64<<20, tc.fstype, tc.mkfs...)
			p, err := Open(mnt)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if p.ordered != tc.want {
				t.Fatalf("a pool on %s has ordered = %v, want %v", tc.name, p.ordered, tc.want)
			}
		})
	}
}

// freshFS makes a filesystem of fstype with the command mkfs on a new loop
// device of size bytes and mounts it until the test ends.
func freshFS(t *testing.T, size int64, fstype string, mkfs ...string) string {
	t.Helper()
	looptest.Require(t)
	dev, _ := looptest.Device(t, size)
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], dev)...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", mkfs, err, out)
	}
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, fstype, 0, ""); err != nil {
		t.Skipf("cannot mount %s here: %v", fstype, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return mnt
}
