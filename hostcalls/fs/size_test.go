package fs_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// TestReadSizePredictsGrow: ReadSize reports the filesystem's extent, and
// the size it predicts for a grown device is what the tools really make of
// it: for growth the tools accept, and for growth too small for them to
// add anything (then it says not growable, so the host runs nothing).
func TestReadSizePredictsGrow(t *testing.T) {
	looptest.Require(t)
	requireTool(t, "blkid")
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		fstype string
		tools  []string
		size   int64
		grow   int64
		grows  bool
	}{
		// 1 KiB blocks and 8 MiB groups on a volume this small: a last group
		// of 256 blocks cannot hold its inode table.
		{"ext4-too-little", fs.Ext4, []string{"mkfs.ext4", "e2fsck", "resize2fs"}, 16 * mib, 256 << 10, false},
		{"ext4-partial-group", fs.Ext4, []string{"mkfs.ext4", "e2fsck", "resize2fs"}, 16 * mib, 3 * mib, true},
		{"ext4-double", fs.Ext4, []string{"mkfs.ext4", "e2fsck", "resize2fs"}, 64 * mib, 64 * mib, true},
		{"xfs-too-little", fs.XFS, []string{"mkfs.xfs", "xfs_growfs"}, 320 * mib, 32 << 10, false},
		{"xfs-double", fs.XFS, []string{"mkfs.xfs", "xfs_growfs"}, 320 * mib, 320 * mib, true},
		{"btrfs-below-256MiB", fs.Btrfs, []string{"mkfs.btrfs", "btrfs"}, 128 * mib, 72 * mib, false},
		{"btrfs-more", fs.Btrfs, []string{"mkfs.btrfs", "btrfs"}, 128 * mib, 192 * mib, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireTool(t, tc.tools...)
			dev, file := looptest.Device(t, tc.size)
			if _, ok, err := fs.ReadSize(ctx, dev); err != nil || ok {
				t.Fatalf("ReadSize of a blank device = %v, %v; want not found", ok, err)
			}
			if err := fs.Make(ctx, dev, tc.fstype, fs.MakeOptions{}); err != nil {
				t.Fatal(err)
			}
			made := readSize(t, dev, tc.fstype)
			if made.Bytes > tc.size || made.Bytes < tc.size-4*mib || made.DeviceBytes != tc.size || made.Growable() {
				t.Fatalf("fresh %s on %d bytes: %+v", tc.fstype, tc.size, made)
			}
			if err := os.Truncate(file, tc.size+tc.grow); err != nil {
				t.Fatal(err)
			}
			if _, err := loop.Resize(ctx, dev); err != nil {
				t.Fatal(err)
			}
			before := readSize(t, dev, tc.fstype)
			if before.Bytes != made.Bytes || before.Growable() != tc.grows {
				t.Fatalf("after the device grew by %d: %+v, want growable=%v", tc.grow, before, tc.grows)
			}
			if tc.fstype == fs.Btrfs && !tc.grows {
				return // the kernel refuses to resize btrfs below 256 MiB
			}
			grow(t, dev, tc.fstype)
			after := readSize(t, dev, tc.fstype)
			if after.Bytes != before.GrowBytes && (tc.grows || after.Bytes-before.Bytes >= mib) {
				t.Errorf("%s grew to %d bytes, ReadSize predicted %d (from %d)", tc.fstype, after.Bytes, before.GrowBytes, before.Bytes)
			}
			if after.Growable() {
				t.Errorf("still growable after growing: %+v", after)
			}
		})
	}
}

func readSize(t *testing.T, dev, fstype string) fs.Size {
	t.Helper()
	s, ok, err := fs.ReadSize(context.Background(), dev)
	if err != nil || !ok || s.Type != fstype {
		t.Fatalf("ReadSize %s = %+v, %v, %v; want %s", dev, s, ok, err, fstype)
	}
	return s
}

// grow grows the filesystem as the host does at stage: ext4 offline, the
// others mounted.
func grow(t *testing.T, dev, fstype string) {
	t.Helper()
	ctx := context.Background()
	if fstype == fs.Ext4 {
		if err := fs.Grow(ctx, dev, "", fstype); err != nil {
			t.Fatal(err)
		}
		return
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, dir, fstype, 0, ""); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	}()
	if err := fs.Grow(ctx, dev, dir, fstype); err != nil {
		t.Fatal(err)
	}
}
