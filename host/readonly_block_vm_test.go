package host_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// TestDmthinReadOnlyBlockPublish: a thin volume published read-only for
// block access refuses writes through the published node, while its
// read-write publication writes and the read-only one reads what it wrote;
// the read-only device goes with its publication (see
// TestLoopfileReadOnlyBlockPublish for the same on a loop-backed volume).
func TestDmthinReadOnlyBlockPublish(t *testing.T) {
	d := dmthinDaemon(t, moduletest.Go, "readonly", 128<<20)
	ctx := context.Background()
	ctl, node := d.controller(), d.node()
	vol := timed(t, "CreateVolume (block)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "ro-block", VolumeCapabilities: []*csi.VolumeCapability{blockAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}})
	}).GetVolume()
	id := vol.GetVolumeId()
	work := t.TempDir()
	staging, rw, ro := filepath.Join(work, "staging"), filepath.Join(work, "rw", "dev"), filepath.Join(work, "ro", "dev")
	t.Cleanup(func() {
		node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: ro})
		node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: rw})
		node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	})
	timed(t, "NodeStageVolume (block)", func() (*csi.NodeStageVolumeResponse, error) {
		return node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: blockAccess, VolumeContext: vol.GetVolumeContext()})
	})
	for _, p := range []struct {
		target   string
		readOnly bool
	}{{rw, false}, {ro, true}} {
		timed(t, "NodePublishVolume (block)", func() (*csi.NodePublishVolumeResponse, error) {
			return node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				TargetPath: p.target, Readonly: p.readOnly, VolumeCapability: blockAccess, VolumeContext: vol.GetVolumeContext()})
		})
	}
	write(t, rw, 1<<20, 64<<10, 7)
	for _, mode := range []int{os.O_WRONLY, os.O_RDWR} {
		f, err := os.OpenFile(ro, mode, 0)
		if err == nil {
			_, err = f.WriteAt([]byte("must not land"), 1<<20)
			f.Close()
		}
		if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EROFS) {
			t.Errorf("write through the read-only publication (open mode %#o) = %v, want EPERM or EROFS", mode, err)
		}
	}
	got := make([]byte, 64<<10)
	f, err := os.Open(ro)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(got, 1<<20)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != 7+byte(i) {
			t.Fatalf("byte %d read through the read-only publication is %d, the read-write one wrote %d", i, b, 7+byte(i))
		}
	}
	// The read-write target is the thin device's own node: what the
	// read-only device sits on.
	var thin unix.Stat_t
	if err := unix.Stat(rw, &thin); err != nil {
		t.Fatal(err)
	}
	over := func() []string {
		devs, err := loop.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, dev := range devs {
			var st unix.Stat_t
			if dev.ReadOnly && unix.Stat(dev.BackingFile, &st) == nil && st.Rdev == thin.Rdev {
				out = append(out, dev.Path)
			}
		}
		return out
	}
	if got := over(); len(got) != 1 {
		t.Errorf("%d read-only loop devices over the thin device, want 1: %v", len(got), got)
	}
	timed(t, "NodeUnpublishVolume (read-only)", func() (*csi.NodeUnpublishVolumeResponse, error) {
		return node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: ro})
	})
	if got := over(); len(got) != 0 {
		t.Errorf("read-only devices still over the thin device after unpublish: %v", got)
	}
}
