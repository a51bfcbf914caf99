package filepool_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// TestResizeDurableBeforeAnswer: what Resize answered survives a power
// loss right after, on ext4 and xfs, also when it found the size already
// set by an earlier call cut off before its sync (the CO's retry after a
// daemon crash).
func TestResizeDurableBeforeAnswer(t *testing.T) {
	mounttest.RequireRoot(t)
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			ctx := context.Background()
			dev := mounttest.Loop(t, 320*mib)
			mounttest.Mkfs(t, fstype, dev, "-q")
			dir, err := mounttest.Mount(t, dev, fstype, "")
			if err != nil {
				t.Fatal(err)
			}
			p, err := filepool.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Create(ctx, "grown.img", mib, false); err != nil {
				t.Fatal(err)
			}
			if err := p.Create(ctx, "repeated.img", mib, false); err != nil {
				t.Fatal(err)
			}
			if err := p.Resize(ctx, "grown.img", 4*mib, false); err != nil {
				t.Fatal(err)
			}
			// The cut-off call: its truncate, without its sync.
			if err := os.Truncate(filepath.Join(dir, "repeated.img"), 2*mib); err != nil {
				t.Fatal(err)
			}
			if err := p.Resize(ctx, "repeated.img", 2*mib, false); err != nil {
				t.Fatal(err)
			}
			p.Close()

			mounttest.PowerCut(t, dev, dir, fstype, "")
			for name, want := range map[string]int64{"grown.img": 4 * mib, "repeated.img": 2 * mib} {
				fi, err := os.Stat(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Size() != want {
					t.Errorf("%s after a power cut: %d bytes, want the %d Resize answered", name, fi.Size(), want)
				}
			}
		})
	}
}

// TestRepeatDurableBeforeAnswer: a Create or Remove that finds the file
// already there or gone, by an earlier call cut off before its sync (the
// retry after a daemon crash; dmthin's ID claims and size records, whose
// calls are not batched), answers only once that is on disk.
func TestRepeatDurableBeforeAnswer(t *testing.T) {
	mounttest.RequireRoot(t)
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			ctx := context.Background()
			dev := mounttest.Loop(t, 320*mib)
			mounttest.Mkfs(t, fstype, dev, "-q")
			dir, err := mounttest.Mount(t, dev, fstype, "")
			if err != nil {
				t.Fatal(err)
			}
			p, err := filepool.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Create(ctx, "removed.img", mib, false); err != nil {
				t.Fatal(err)
			}
			// The cut-off calls: the new file and the unlink, without
			// their sync.
			f, err := os.OpenFile(filepath.Join(dir, "created.img"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(mib); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := os.Remove(filepath.Join(dir, "removed.img")); err != nil {
				t.Fatal(err)
			}
			if err := p.Create(ctx, "created.img", mib, false); err != nil {
				t.Fatal(err)
			}
			if err := p.Remove(ctx, "removed.img"); err != nil {
				t.Fatal(err)
			}
			p.Close()

			mounttest.PowerCut(t, dev, dir, fstype, "")
			if fi, err := os.Stat(filepath.Join(dir, "created.img")); err != nil || fi.Size() != mib {
				t.Errorf("a repeated Create answered, then a power cut: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, "removed.img")); !os.IsNotExist(err) {
				t.Errorf("a repeated Remove answered, then a power cut: the file is back (%v)", err)
			}
		})
	}
}
