package fs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// TestGrowExt4OfflineAfterCutResize: resize2fs killed half-way through an
// offline grow leaves an ext4 that e2fsck's preen refuses ("Resize inode
// not valid"); GrowOffline, finding its marker of the resize under way,
// repairs it and grows again, with the data intact. The cut is made by
// killing resize2fs after growing delays until e2fsck finds the
// filesystem inconsistent; a machine where no delay lands half-way skips.
func TestGrowExt4OfflineAfterCutResize(t *testing.T) {
	looptest.Require(t)
	requireTool(t, "mkfs.ext4", "e2fsck", "resize2fs", "debugfs")
	ctx := context.Background()
	dir := t.TempDir()
	pristine := filepath.Join(dir, "pristine.img")
	if err := os.WriteFile(pristine, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(pristine, 32*mib); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", pristine).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	content := []byte("written before the resize\n")
	src := filepath.Join(dir, "content")
	if err := os.WriteFile(src, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("debugfs", "-w", "-R", "write "+src+" data", pristine).CombinedOutput(); err != nil {
		t.Fatalf("debugfs write: %v: %s", err, out)
	}
	marker := filepath.Join(dir, "markers", "volume.resizing")
	if err := os.Mkdir(filepath.Dir(marker), 0o700); err != nil {
		t.Fatal(err)
	}

	img := filepath.Join(dir, "cut.img")
	cut := false
	delay := 20 * time.Millisecond
	for try := 0; try < 25 && !cut; try, delay = try+1, delay*3/2 {
		// What GrowOffline leaves when killed during resize2fs.
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "--sparse=always", pristine, img).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		if err := os.Truncate(img, 200<<30); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("resize2fs", img)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay)
		cmd.Process.Kill()
		if err := cmd.Wait(); err == nil {
			// Finished before the kill: shorter delays were too short,
			// longer ones are no use.
			t.Skipf("resize2fs finished within %v before any cut left the filesystem inconsistent", delay)
		}
		var exit *exec.ExitError
		err := exec.Command("e2fsck", "-fn", img).Run()
		cut = errors.As(err, &exit) && exit.ExitCode() >= 4
	}
	if !cut {
		t.Skip("no kill of resize2fs left the filesystem inconsistent")
	}
	t.Logf("resize2fs killed after %v: e2fsck -fn finds the filesystem inconsistent", delay*2/3)

	d, err := loop.Attach(ctx, img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.Detach(context.Background(), d.Path); err != nil {
			t.Errorf("cleanup: detach %s: %v", d.Path, err)
		}
	})
	if err := fs.GrowOffline(ctx, d.Path, marker); err != nil {
		t.Fatalf("grow after a cut resize: %v", err)
	}
	if out, err := exec.Command("e2fsck", "-fn", d.Path).CombinedOutput(); err != nil {
		t.Fatalf("after GrowOffline e2fsck -fn: %v: %s", err, out)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker left after a finished grow: %v", err)
	}
	mnt := mount(t, d.Path, fs.Ext4)
	got, err := os.ReadFile(filepath.Join(mnt, "data"))
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("data after the grow: %q, %v", got, err)
	}
	st, err := fs.Stats(ctx, mnt)
	if err != nil {
		t.Fatal(err)
	}
	if st.TotalBytes < 100<<30 {
		t.Errorf("filesystem of %d bytes after growing to a 200 GiB device", st.TotalBytes)
	}
}
