package hostcalls_test

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// JournalsMetadata tells an ext4 with a journal from the filesystems the
// ext4 driver mounts under the same magic number without one: ext2, and
// ext4 made without has_journal. Only the first (and xfs) may leave a
// file's own sync to the journal's ordering.
func TestJournalsMetadata(t *testing.T) {
	looptest.Require(t)
	for _, tc := range []struct {
		name, fstype string
		mkfs         []string
		want         bool
	}{
		{"ext4", "ext4", []string{"mke2fs", "-t", "ext4", "-q", "-F"}, true},
		{"ext4 without a journal", "ext4", []string{"mke2fs", "-t", "ext4", "-q", "-F", "-O", "^has_journal"}, false},
		{"ext2", "ext2", []string{"mke2fs", "-t", "ext2", "-q", "-F"}, false},
		{"xfs", "xfs", []string{"mkfs.xfs", "-q", "-f"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := exec.LookPath(tc.mkfs[0]); err != nil {
				t.Skipf("needs %s: %v", tc.mkfs[0], err)
			}
			dev, _ := looptest.Device(t, 320<<20)
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
			if got := journals(t, mnt); got != tc.want {
				t.Fatalf("JournalsMetadata on %s = %v, want %v", tc.name, got, tc.want)
			}
		})
	}
	t.Run("tmpfs", func(t *testing.T) {
		if journals(t, mounttest.Tmpfs(t, "size=1m")) {
			t.Fatal("JournalsMetadata on tmpfs = true, want false")
		}
	})
}

func journals(t *testing.T, dir string) bool {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	return hostcalls.JournalsMetadata(fd)
}
