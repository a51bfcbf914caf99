package host_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// A pool whose filesystem turned read-only (the kernel does so when a
// write error aborts its journal) shows in the health of its volumes,
// even where the backend, which only stats its files, finds them fine.
func TestVolumeHealthReadOnlyPool(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind-mounts the pool read-only")
	}
	d := startDaemon(t, localdirOptions(t))
	ctx := callCtx(t)
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "ro-pool", VolumeCapabilities: rwCaps()})
	health := func() []*csi.VolumeHealth_VolumeHealthEntry {
		t.Helper()
		resp, err := d.controller().ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol.GetVolumeId()})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVolumeHealth().GetHealthStatuses()
	}
	if h := health(); len(h) != 0 {
		t.Fatalf("healthy pool: health %v", h)
	}
	if err := unix.Mount(d.pool, d.pool, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(d.pool, unix.MNT_DETACH) })
	if err := unix.Mount("", d.pool, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	h := health()
	if len(h) != 1 || h[0].GetReason() != "PoolReadOnly" || h[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED {
		t.Fatalf("read-only pool: health %v, want one DEGRADED PoolReadOnly", h)
	}
	t.Log(h[0].GetMessage())
}

// An ext4 pool filesystem on which the kernel counted errors (a failed
// write aborts its journal; writes then fail with EROFS while statfs may
// still say read-write) shows in the health of its volumes.
func TestVolumeHealthPoolFilesystemErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes an ext4 pool on a loop device")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	img := filepath.Join(t.TempDir(), "pool.img")
	if f, err := os.Create(img); err != nil {
		t.Fatal(err)
	} else if err := errors.Join(f.Truncate(32<<20), f.Close()); err != nil {
		t.Fatal(err)
	}
	dev, err := loop.Attach(context.Background(), img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.Detach(context.Background(), dev.Path); err != nil {
			t.Errorf("cleanup: detach %s: %v", dev.Path, err)
		}
	})
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev.Path).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v: %s", err, out)
	}
	pool := t.TempDir()
	if err := unix.Mount(dev.Path, pool, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	// A plain unmount: the daemon, stopped first, holds nothing open on
	// its pool once the pool's idle time has passed (a lazy unmount would
	// hide a leak and leave the loop device bound).
	t.Cleanup(func() {
		err := unix.Unmount(pool, 0)
		for deadline := time.Now().Add(4 * hostcalls.PoolIdle); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			err = unix.Unmount(pool, 0)
		}
		if err != nil {
			t.Errorf("cleanup: unmount the pool: %v", err)
			unix.Unmount(pool, unix.MNT_DETACH)
		}
	})
	o := localdirOptions(t)
	o.pool = pool
	d := startDaemon(t, o)
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "ext4-errors", VolumeCapabilities: rwCaps()})
	ctx := callCtx(t)
	health := func() []*csi.VolumeHealth_VolumeHealthEntry {
		t.Helper()
		resp, err := d.controller().ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol.GetVolumeId()})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVolumeHealth().GetHealthStatuses()
	}
	if h := health(); len(h) != 0 {
		t.Fatalf("healthy ext4 pool: health %v", h)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(dev.Path), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("test"), 0o200); err != nil {
		t.Skipf("cannot make ext4 count an error (%s): %v", trigger, err)
	}
	// The kernel writes the count to the superblock (which the file
	// shows) from a work item, soon after.
	h := health()
	for deadline := time.Now().Add(5 * time.Second); len(h) == 0 && time.Now().Before(deadline); h = health() {
		time.Sleep(50 * time.Millisecond)
	}
	if len(h) != 1 || h[0].GetReason() != "PoolFilesystemErrors" || h[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED {
		t.Fatalf("ext4 pool with errors: health %v, want one DEGRADED PoolFilesystemErrors", h)
	}
	t.Log(h[0].GetMessage())
}
