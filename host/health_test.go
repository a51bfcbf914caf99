package host_test

import (
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
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
