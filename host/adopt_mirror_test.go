package host_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// TestMirroredStagingMountDoesNotBlockUnstage: where the CO's folder is
// also mounted at a second place as a shared peer (a kubelet folder
// bind-mounted elsewhere), every staging mount has a copy there, which
// start-up adopts as a publication. The copy lives as long as the stage,
// so it must not refuse NodeUnstage: the CO unpublished all it knows of.
// The old code answered FAILED_PRECONDITION "still published" forever.
func TestMirroredStagingMountDoesNotBlockUnstage(t *testing.T) {
	p := newProcDaemon(t)
	ctx := callCtx(t)
	w := workDir(t)
	base, mirror := filepath.Join(w, "base"), filepath.Join(w, "mirror")
	for _, d := range []string{base, mirror} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// base becomes a shared mount and mirror its peer; workDir's cleanup
	// unmounts both.
	if err := unix.Mount(base, base, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", base, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(base, mirror, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}

	vol, err := p.createVolume(ctx, "mirrored", "localdir")
	if err != nil {
		t.Fatal(err)
	}
	staging := stagingPath(base, "mirrored")
	copyOf := stagingPath(mirror, "mirrored")
	if _, err := p.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: rwCap, VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	if mounted, err := mountinfo.Mounted(copyOf); err != nil || !mounted {
		t.Fatalf("propagation made no copy of the staging mount at %s: %v, %v", copyOf, mounted, err)
	}

	p.stop(t)
	p.start(t)
	if lines := p.reconciled(copyOf); len(lines) != 1 || !strings.Contains(lines[0], "kind=adopted-publication") {
		t.Fatalf("start-up reported the copy %q, want it adopted once: %q", copyOf, lines)
	}
	if _, err := p.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstage with the staging mount's copy adopted: %v", err)
	}
	for _, path := range []string{staging, copyOf} {
		if mounted, err := mountinfo.Mounted(path); err != nil || mounted {
			t.Errorf("%s mounted after NodeUnstage: %v, %v", path, mounted, err)
		}
	}
	if _, err := p.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()}); err != nil {
		t.Errorf("DeleteVolume after NodeUnstage: %v", err)
	}
}
