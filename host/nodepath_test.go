package host_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// TestNodePathsAbsoluteAndClean: every node RPC refuses a staging, target
// or volume path that is relative or not clean with INVALID_ARGUMENT
// before it touches anything (a volume_path, which is only looked up, is
// NOT_FOUND: no volume is there); a ".." that resolves onto an existing,
// non-empty directory leaves that directory unmounted and intact.
func TestNodePathsAbsoluteAndClean(t *testing.T) {
	d, _ := specDaemon(t)
	v := newLocalVolume(t, d, "paths")
	id := v.vol.GetVolumeId()
	w := filepath.Dir(filepath.Dir(v.staging))
	precious := filepath.Join(w, "precious")
	if err := os.MkdirAll(precious, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(precious, "keep"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"dot-dot onto a directory": filepath.Join(w, "staging") + "/../precious",
		"relative":                 "staging/paths",
		"dot":                      w + "/./precious",
		"double slash":             w + "//precious",
		"trailing slash":           precious + "/",
	}
	type call func(path string) error
	lookups := map[string]bool{"NodeGetVolumeStats volume_path": true, "NodeExpandVolume volume_path": true}
	calls := map[string]call{
		"NodeStage staging_target_path": func(p string) error {
			_, err := d.node().NodeStageVolume(callCtx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: p, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
			return err
		},
		"NodeUnstage staging_target_path": func(p string) error {
			_, err := d.node().NodeUnstageVolume(callCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p})
			return err
		},
		"NodePublish target_path": func(p string) error {
			_, err := d.node().NodePublishVolume(callCtx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: v.staging, TargetPath: p, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
			return err
		},
		"NodePublish staging_target_path": func(p string) error {
			_, err := d.node().NodePublishVolume(callCtx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: p, TargetPath: v.target, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
			return err
		},
		"NodeUnpublish target_path": func(p string) error {
			_, err := d.node().NodeUnpublishVolume(callCtx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: p})
			return err
		},
		"NodeGetVolumeStats volume_path": func(p string) error {
			_, err := d.node().NodeGetVolumeStats(callCtx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})
			return err
		},
		"NodeGetVolumeStats staging_target_path": func(p string) error {
			_, err := d.node().NodeGetVolumeStats(callCtx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: v.target, StagingTargetPath: p})
			return err
		},
		"NodeGetVolumeHealth volume_publish_path": func(p string) error {
			_, err := d.node().NodeGetVolumeHealth(callCtx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: p})
			return err
		},
		"NodeGetVolumeHealth staging_target_path": func(p string) error {
			_, err := d.node().NodeGetVolumeHealth(callCtx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: v.target, StagingTargetPath: p})
			return err
		},
		"NodeExpandVolume volume_path": func(p string) error {
			_, err := d.node().NodeExpandVolume(callCtx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: p})
			return err
		},
		"NodeExpandVolume staging_target_path": func(p string) error {
			_, err := d.node().NodeExpandVolume(callCtx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: v.target, StagingTargetPath: p})
			return err
		},
	}
	check := func(t *testing.T) {
		t.Helper()
		for rpc, call := range calls {
			for what, p := range bad {
				t.Run(rpc+"/"+what, func(t *testing.T) {
					want := codes.InvalidArgument
					if lookups[rpc] {
						want = codes.NotFound
					}
					wantCode(t, call(p), want, "absolute, clean")
					if n := mountsAt(t, precious); n != 0 {
						t.Fatalf("%s mounted over %s", rpc, precious)
					}
				})
			}
		}
		if b, err := os.ReadFile(filepath.Join(precious, "keep")); err != nil || string(b) != "mine" {
			t.Errorf("the directory's file: %q, %v", b, err)
		}
	}
	t.Run("unstaged", check)

	// Staged and published, the bad paths are still refused, and the
	// volume's own mounts stay as they are.
	if os.Geteuid() != 0 {
		t.Log("not root: the staged and published case needs mounts")
		return
	}
	ctx := callCtx(t)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	t.Run("published", check)
	v.wantMounts(t, 1, 1)
	if err := v.unpublish(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(ctx, d); err != nil {
		t.Fatal(err)
	}
}
