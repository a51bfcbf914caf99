package fs_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// TestFreezeThaw freezes a real ext4, xfs and btrfs mount: a writer that
// fsyncs blocks until the thaw and then completes; a second freeze (someone
// else's freeze, to the second caller) is refused, a second thaw is no
// error; the identity check keeps a freeze off another filesystem.
func TestFreezeThaw(t *testing.T) {
	looptest.Require(t)
	for _, tc := range []struct {
		fstype string
		size   int64
	}{{fs.Ext4, 32 << 20}, {fs.XFS, 320 << 20}, {fs.Btrfs, 128 << 20}} {
		t.Run(tc.fstype, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.fstype)
			dev, _ := looptest.Device(t, tc.size)
			if err := fs.Make(context.Background(), dev, tc.fstype, fs.MakeOptions{}); err != nil {
				t.Fatal(err)
			}
			dir := mount(t, dev, tc.fstype)
			id, err := fs.DeviceOf(dir)
			if err != nil {
				t.Fatal(err)
			}
			// Thawed first by a cleanup that runs before the unmount.
			t.Cleanup(func() { fs.Thaw(dir, id) })

			if err := fs.Freeze(dir, id+1); abi.CodeOf(err) != abi.FailedPrecondition {
				t.Fatalf("freeze with another filesystem's identity = %v, want FAILED_PRECONDITION", err)
			}
			if err := fs.Freeze(dir, id); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- os.WriteFile(filepath.Join(dir, "during"), []byte("x"), 0o644) }()
			select {
			case err := <-done:
				t.Fatalf("a write to the frozen filesystem returned (%v) before the thaw", err)
			case <-time.After(300 * time.Millisecond):
			}
			if err := fs.Freeze(dir, id); abi.CodeOf(err) != abi.FailedPrecondition {
				t.Errorf("second freeze = %v, want FAILED_PRECONDITION", err)
			}
			if thawed, err := fs.Thaw(dir, id+1); err != nil || thawed {
				t.Errorf("thaw with another identity = %v, %v; want false, nil", thawed, err)
			}
			if thawed, err := fs.Thaw(dir, id); err != nil || !thawed {
				t.Fatalf("thaw = %v, %v; want true", thawed, err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("write after thaw: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the writer is still blocked after the thaw")
			}
			if thawed, err := fs.Thaw(dir, id); err != nil || thawed {
				t.Errorf("second thaw = %v, %v; want false, nil", thawed, err)
			}
			if thawed, err := fs.Thaw(filepath.Join(dir, "missing"), 0); err != nil || thawed {
				t.Errorf("thaw of a missing path = %v, %v; want false, nil", thawed, err)
			}
		})
	}
}
