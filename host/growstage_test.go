package host_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
)

// fsCapability is mount access with the given filesystem.
func fsCapability(fstype string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fstype}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// TestLoopfileStageGrowsRestoredFilesystem: a volume restored from a
// snapshot, or cloned, into twice the source's size has a device twice as
// large and the source's filesystem on it; NodeStage grows the filesystem
// to the device (ext4 offline, before the mount; xfs and btrfs mounted),
// so the staging path shows the larger size, with the data intact. Online
// ext4 growth needs CAP_SYS_RESOURCE, which this path does not.
func TestLoopfileStageGrowsRestoredFilesystem(t *testing.T) {
	d := loopfileDaemon(t)
	for _, tc := range []struct {
		fstype string
		size   int64
	}{
		{fs.Ext4, 16 << 20},
		{fs.XFS, 320 << 20},
		{fs.Btrfs, 128 << 20},
	} {
		t.Run(tc.fstype, func(t *testing.T) {
			requireTools(t, "mkfs."+tc.fstype)
			ctx := callCtx(t)
			c := fsCapability(tc.fstype)
			w := workDir(t)
			src := createVolume(t, d, &csi.CreateVolumeRequest{
				Name: "grow-src-" + tc.fstype, CapacityRange: &csi.CapacityRange{RequiredBytes: tc.size},
				VolumeCapabilities: []*csi.VolumeCapability{c},
			})
			releaseUnder(t, w)
			data := bytes.Repeat([]byte("restored "+tc.fstype+" "), 4096)
			stage := func(vol *csi.Volume, name string) string {
				t.Helper()
				staging := stagingPath(w, name)
				if _, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
					VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: c, VolumeContext: vol.GetVolumeContext(),
				}); err != nil {
					t.Fatalf("NodeStage %s: %v", name, err)
				}
				return staging
			}
			unstage := func(vol *csi.Volume, staging string) {
				t.Helper()
				if _, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
					t.Fatalf("NodeUnstage: %v", err)
				}
			}
			staging := stage(src, "src")
			if err := os.WriteFile(filepath.Join(staging, "kept"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			before, err := fs.Stats(ctx, staging)
			if err != nil {
				t.Fatal(err)
			}
			unstage(src, staging)
			snap, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "grow-snap-" + tc.fstype, SourceVolumeId: src.GetVolumeId()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				d.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
			})
			for _, source := range []*csi.VolumeContentSource{
				{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}},
				{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}},
			} {
				kind := "restore"
				if source.GetVolume() != nil {
					kind = "clone"
				}
				vol := createVolume(t, d, &csi.CreateVolumeRequest{
					Name: "grow-" + kind + "-" + tc.fstype, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * tc.size},
					VolumeCapabilities: []*csi.VolumeCapability{c}, VolumeContentSource: source,
				})
				if vol.GetCapacityBytes() < 2*tc.size {
					t.Fatalf("%s: capacity %d, asked %d", kind, vol.GetCapacityBytes(), 2*tc.size)
				}
				staging := stage(vol, kind)
				after, err := fs.Stats(ctx, staging)
				if err != nil {
					t.Fatal(err)
				}
				if after.TotalBytes <= tc.size || after.TotalBytes < vol.GetCapacityBytes()*8/10 {
					t.Errorf("%s: staged filesystem has %d bytes on a %d-byte volume (the source's had %d): not grown",
						kind, after.TotalBytes, vol.GetCapacityBytes(), before.TotalBytes)
				}
				if got, err := os.ReadFile(filepath.Join(staging, "kept")); err != nil || !bytes.Equal(got, data) {
					t.Errorf("%s: data after growth: %v (equal=%v)", kind, err, bytes.Equal(got, data))
				}
				unstage(vol, staging)
				// A second stage finds nothing to grow and mounts as before.
				staging = stage(vol, kind)
				if again, err := fs.Stats(ctx, staging); err != nil || again.TotalBytes != after.TotalBytes {
					t.Errorf("%s: second stage shows %d bytes (%v), the first %d", kind, again.TotalBytes, err, after.TotalBytes)
				}
				unstage(vol, staging)
			}
		})
	}
}

// requireTools skips t unless each program is installed.
func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			if _, err := os.Stat("/usr/sbin/" + name); err != nil {
				t.Skipf("needs %s: %v", name, err)
			}
		}
	}
}
