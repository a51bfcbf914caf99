package host_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// publishReadOnlyAt publishes a block volume read-only at target.
func (v *loopVolume) publishReadOnlyAt(ctx context.Context, d *daemon, target string) error {
	_, err := d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging, TargetPath: target, Readonly: true,
		VolumeCapability: loopCapability(v.block), VolumeContext: v.vol.GetVolumeContext(),
	})
	return err
}

// loopsOver lists the loop devices whose backing is the device node dev.
func loopsOver(t *testing.T, dev string) []loop.Device {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatalf("stat %s: %v", dev, err)
	}
	devs, err := loop.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []loop.Device
	for _, d := range devs {
		if d.Dev == st.Dev && d.Inode == st.Ino {
			out = append(out, d)
		}
	}
	return out
}

// wantReadOnly checks that the device published at target refuses writes
// (opened write-only and read-write) and shows the volume's kept data.
func (v *loopVolume) wantReadOnly(t *testing.T, target string) {
	t.Helper()
	for _, mode := range []int{os.O_WRONLY, os.O_RDWR} {
		f, err := os.OpenFile(target, mode, 0)
		if err == nil {
			_, err = f.WriteAt([]byte("must not land"), keptOffset)
			if err == nil {
				err = f.Sync()
			}
			f.Close()
		}
		if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EROFS) {
			t.Errorf("write through the read-only publication %s (open mode %#o) = %v, want EPERM or EROFS", target, mode, err)
		}
	}
	v.readKept(t, target)
}

// wantReadOnlyLoops checks how many loop devices sit over the volume's
// staged device, and that each is read-only.
func (v *loopVolume) wantReadOnlyLoops(t *testing.T, n int) []loop.Device {
	t.Helper()
	staged := loopOf(t, v.file)
	over := loopsOver(t, staged.Path)
	if len(over) != n {
		t.Fatalf("%d loop devices over the staged %s, want %d: %v", len(over), staged.Path, n, over)
	}
	for _, d := range over {
		if !d.ReadOnly {
			t.Errorf("%s over the staged device is not read-only", d.Path)
		}
	}
	return over
}

// TestLoopfileReadOnlyBlockPublish: a block volume published read-only
// refuses writes through the published node (a read-only bind of a device
// node would not: the device underneath stays writable), while a
// read-write publication of the same volume still writes and the
// read-only one reads what it wrote. Read-only publications share one
// read-only loop device over the staged device, which repeats, a daemon
// restart and a reboot converge on, NodeUnpublish of the last one
// releases, NodeUnstage releases when its publication was unmounted
// behind the daemon's back, and Reconcile reports only when no record
// explains it.
func TestLoopfileReadOnlyBlockPublish(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "ro-block", true)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	rw, ro, ro2 := v.target+"-rw", v.target+"-ro", v.target+"-ro2"
	if err := v.publishAt(ctx, d, rw); err != nil {
		t.Fatal(err)
	}
	v.writeKept(t, rw)
	for i := range 2 {
		if err := v.publishReadOnlyAt(ctx, d, ro); err != nil {
			t.Fatalf("read-only NodePublish #%d: %v", i+1, err)
		}
		v.want(t, 1, true, map[string]int{rw: 1, ro: 1})
		v.wantReadOnlyLoops(t, 1)
	}
	v.wantReadOnly(t, ro)
	v.writeKept(t, rw) // the read-write publication still writes
	if findings := d.srv.Reconcile(ctx, false); len(findings) != 0 {
		t.Errorf("Reconcile reports the published volume: %v", findings)
	}

	// A restart keeps the device; a repeat finds it.
	d.restart(t)
	if err := v.publishReadOnlyAt(ctx, d, ro); err != nil {
		t.Fatalf("read-only NodePublish after restart: %v", err)
	}
	if err := v.publishReadOnlyAt(ctx, d, ro2); err != nil {
		t.Fatalf("second read-only NodePublish after restart: %v", err)
	}
	shared := v.wantReadOnlyLoops(t, 1)[0]
	v.wantReadOnly(t, ro2)
	if findings := d.srv.Reconcile(ctx, false); len(findings) != 0 {
		t.Errorf("Reconcile after restart reports the published volume: %v", findings)
	}

	// The device stays while a read-only publication uses it.
	if err := v.unpublishAt(ctx, d, ro); err != nil {
		t.Fatal(err)
	}
	if got := v.wantReadOnlyLoops(t, 1)[0]; got.Path != shared.Path {
		t.Errorf("read-only device moved from %s to %s", shared.Path, got.Path)
	}
	v.wantReadOnly(t, ro2)
	if err := v.unpublishAt(ctx, d, ro2); err != nil {
		t.Fatal(err)
	}
	v.wantReadOnlyLoops(t, 0)
	v.want(t, 1, true, map[string]int{rw: 1, ro: 0, ro2: 0})

	// A reboot: every mount and loop device goes; the new device numbers
	// may differ. NodeStage and NodePublish re-create a read-only one.
	if err := v.publishReadOnlyAt(ctx, d, ro); err != nil {
		t.Fatal(err)
	}
	d.stop()
	for _, target := range []string{rw, ro} {
		if err := unix.Unmount(target, 0); err != nil {
			t.Fatalf("unmount %s: %v", target, err)
		}
	}
	staged := loopOf(t, v.file).Path
	for _, dev := range loopsOver(t, staged) {
		if err := loop.Detach(context.Background(), dev.Path); err != nil {
			t.Fatal(err)
		}
	}
	if err := loop.Detach(context.Background(), staged); err != nil {
		t.Fatal(err)
	}
	d.start(t)
	if err := v.stage(ctx, d); err != nil {
		t.Fatalf("NodeStage after reboot: %v", err)
	}
	if err := v.publishReadOnlyAt(ctx, d, ro); err != nil {
		t.Fatalf("read-only NodePublish after reboot: %v", err)
	}
	if err := v.publishAt(ctx, d, rw); err != nil {
		t.Fatalf("NodePublish after reboot: %v", err)
	}
	v.wantReadOnlyLoops(t, 1)
	v.wantReadOnly(t, ro)
	v.writeKept(t, rw)

	// The recorded device is no orphan.
	recorded := v.wantReadOnlyLoops(t, 1)[0].Path
	if findings := d.srv.Reconcile(ctx, false); len(findings) != 0 {
		t.Errorf("Reconcile after reboot and re-publish reports: %v", findings)
	}

	// NodeUnstage forgets a read-only publication unmounted behind the
	// daemon's back, and releases its device with it.
	if err := unix.Unmount(ro, 0); err != nil {
		t.Fatal(err)
	}
	if err := v.unpublishAt(ctx, d, rw); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(ctx, d); err != nil {
		t.Fatalf("NodeUnstage with a forgotten read-only publication: %v", err)
	}
	if st, bound, err := loop.Status(ctx, recorded); err != nil || (bound && st.BackingFile == staged) {
		t.Errorf("read-only device %s still bound after unstage: %+v, %v", recorded, st, err)
	}
	v.want(t, 0, false, map[string]int{rw: 0, ro: 0})
}

// TestLoopfileReadOnlyOrphanReported: a read-only loop device over a
// staged device with no read-only publication record (a crash between its
// attach and its record) is an orphan-loop finding, and a cleaning run
// releases it.
func TestLoopfileReadOnlyOrphanReported(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "ro-orphan", true)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	staged := loopOf(t, v.file).Path
	orphan, err := loop.AttachDevice(ctx, staged, loop.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.DetachBound(context.Background(), orphan) })
	isOrphan := func(f host.Finding) bool { return f.Kind == "orphan-loop" && f.Path == orphan.Path }
	if findings := d.srv.Reconcile(ctx, false); !slices.ContainsFunc(findings, isOrphan) {
		t.Errorf("Reconcile does not report %s over the staged %s: %v", orphan.Path, staged, findings)
	}
	if findings := d.srv.Reconcile(ctx, true); !slices.ContainsFunc(findings, isOrphan) {
		t.Errorf("cleaning Reconcile does not report %s: %v", orphan.Path, findings)
	}
	v.wantReadOnlyLoops(t, 0)
	if err := v.unstage(ctx, d); err != nil {
		t.Fatal(err)
	}
	v.want(t, 0, false, nil)
}

// TestLoopfileReadOnlyBlockExpand: expanding a block volume also grows the
// read-only device a read-only publication binds, which keeps its size
// until told.
func TestLoopfileReadOnlyBlockExpand(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "ro-expand", true)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	v.writeKept(t, loopOf(t, v.file).Path)
	if err := v.publishReadOnlyAt(ctx, d, v.target); err != nil {
		t.Fatal(err)
	}
	const grown = 2 * loopfileVolumeBytes
	if _, err := d.controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: grown}, VolumeCapability: loopCapability(true),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.node().NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), VolumePath: v.target, StagingTargetPath: v.staging,
		CapacityRange: &csi.CapacityRange{RequiredBytes: grown}, VolumeCapability: loopCapability(true),
	}); err != nil {
		t.Fatal(err)
	}
	if size, err := fs.DeviceSize(ctx, v.target); err != nil || size != grown {
		t.Errorf("the read-only publication shows %d bytes (%v) after expansion to %d", size, err, grown)
	}
	v.wantReadOnly(t, v.target)
	if err := v.unpublishAt(ctx, d, v.target); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(ctx, d); err != nil {
		t.Fatal(err)
	}
	v.want(t, 0, false, nil)
}
