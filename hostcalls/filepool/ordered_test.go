package filepool

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
	looptest.Require(t)
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
			dev, _ := looptest.Device(t, 64<<20)
			if out, err := exec.Command(tc.mkfs[0], append(tc.mkfs[1:], dev)...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v\n%s", tc.mkfs, err, out)
			}
			mnt := t.TempDir()
			if err := unix.Mount(dev, mnt, tc.fstype, 0, ""); err != nil {
				t.Skipf("cannot mount %s here: %v", tc.fstype, err)
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
			if p.ordered != tc.want {
				t.Fatalf("a pool on %s has ordered = %v, want %v", tc.name, p.ordered, tc.want)
			}
		})
	}
}
