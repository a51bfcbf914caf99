package host_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Ephemeral inline volumes: NodePublishVolume with the CO's own volume
// ID, no staging path and "csi.storage.k8s.io/ephemeral": "true" creates,
// stages and publishes a volume of a node-local backend; NodeUnpublish
// takes all of it down. The CO's volume IDs here look like kubelet's.

// ephemeralDaemon serves loopfile (the default backend), localdir and the
// fault fixture, which is not node-local, and releases every mount and
// loop device under its folder when the test ends.
func ephemeralDaemon(t *testing.T) *daemon {
	t.Helper()
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	g := newGate()
	t.Cleanup(g.release)
	d := startDaemon(t, daemonOptions{
		backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go), hostcalls: []string{"file", "loop"},
		more: []daemonModule{
			{name: "localdir", wasm: localdirWasm(t), hostcalls: []string{"dir"}, config: map[string]string{"quota": "off"}},
			faultModule(nil),
		},
		hostCalls: []hostcalls.Func{g.hostCall()},
	})
	releaseUnder(t, filepath.Dir(d.pool))
	return d
}

// ephemeralRequest is a NodePublishVolume of an inline volume the way
// kubelet sends it: pod information, the ephemeral marker, the pod's
// volume attributes, and fs_type from the pod spec.
func ephemeralRequest(id, target, fstype string, attrs map[string]string) *csi.NodePublishVolumeRequest {
	volCtx := map[string]string{
		"csi.storage.k8s.io/ephemeral":     "true",
		"csi.storage.k8s.io/pod.name":      "web-0",
		"csi.storage.k8s.io/pod.namespace": "default",
		"csi.storage.k8s.io/pod.uid":       "0d6c4b52-7b0e-4b8f-9c61-3f0f1d2e5a77",
	}
	for k, v := range attrs {
		volCtx[k] = v
	}
	return &csi.NodePublishVolumeRequest{
		VolumeId: id, TargetPath: target, VolumeContext: volCtx,
		VolumeCapability: fsCapability(fstype),
	}
}

func unpublishEphemeral(ctx context.Context, d *daemon, id, target string) error {
	_, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	return err
}

// wantNothingLeft checks that no volume is left in any pool, no loop
// device backs a pool file, and nothing is mounted under the daemon's
// folder or at target.
func wantNothingLeft(t *testing.T, d *daemon, target string) {
	t.Helper()
	for name, pool := range d.pools {
		entries, err := os.ReadDir(pool)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				t.Errorf("%s pool still holds %s", name, e.Name())
			}
		}
		for _, dev := range loopsUnder(t, pool) {
			t.Errorf("loop device %s still backs %s", dev.Path, dev.BackingFile)
		}
	}
	if ms := mountsUnder(t, filepath.Dir(d.pool)); len(ms) != 0 {
		t.Errorf("still mounted: %v", ms)
	}
	if n := mountsAt(t, target); n != 0 {
		t.Errorf("%d mounts at the target %s", n, target)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target %s still there: %v", target, err)
	}
	if err := filepath.WalkDir(filepath.Join(d.cfg.StateDir, "ephemeral"), func(p string, e os.DirEntry, err error) error {
		if err == nil && p != filepath.Join(d.cfg.StateDir, "ephemeral") {
			t.Errorf("staging folder %s left", p)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// TestEphemeralLoopfile: an inline loopfile volume gets the capacity its
// "size" attribute asks for (seen by statfs on the target, for ext4 and
// xfs), holds what is written, answers NodeGetVolumeStats by the CO's ID,
// converges on a repeat, refuses a repeat with another size, and
// NodeUnpublish leaves no file, loop device, mount or folder behind, also
// when repeated.
func TestEphemeralLoopfile(t *testing.T) {
	d := ephemeralDaemon(t)
	for _, tc := range []struct {
		fstype string
		size   string
		bytes  int64
	}{
		{fs.Ext4, "64Mi", 64 << 20},
		{fs.XFS, "400Mi", 400 << 20},
	} {
		t.Run(tc.fstype, func(t *testing.T) {
			requireTools(t, "mkfs."+tc.fstype)
			ctx := callCtx(t)
			id := "csi-7f3a9c" + tc.fstype
			target := targetPath(workDir(t), "inline-"+tc.fstype)
			req := ephemeralRequest(id, target, tc.fstype, map[string]string{"size": tc.size})
			for i := range 2 {
				if _, err := d.node().NodePublishVolume(ctx, req); err != nil {
					t.Fatalf("NodePublish #%d: %v", i+1, err)
				}
				if n := mountsAt(t, target); n != 1 {
					t.Fatalf("%d mounts at the target after NodePublish #%d, want 1", n, i+1)
				}
			}
			var st unix.Statfs_t
			if err := unix.Statfs(target, &st); err != nil {
				t.Fatal(err)
			}
			total := int64(st.Blocks) * st.Bsize
			if total > tc.bytes || total < tc.bytes*7/10 {
				t.Errorf("statfs of the target: %d bytes, want about the %d bytes %q asks for", total, tc.bytes, tc.size)
			}
			data := []byte("inline " + tc.fstype)
			if err := os.WriteFile(filepath.Join(target, "kept"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			stats, err := d.node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			if err != nil {
				t.Fatalf("NodeGetVolumeStats by the CO's ID: %v", err)
			}
			if got := stats.GetUsage()[0].GetTotal(); got != total {
				t.Errorf("NodeGetVolumeStats total %d, statfs %d", got, total)
			}
			if _, err := d.node().NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: target}); err != nil {
				t.Errorf("NodeGetVolumeHealth by the CO's ID: %v", err)
			}
			other := ephemeralRequest(id, target, tc.fstype, map[string]string{"size": "128Mi"})
			_, err = d.node().NodePublishVolume(ctx, other)
			wantCode(t, err, codes.AlreadyExists, id)
			elsewhere := ephemeralRequest(id, target+"-2", tc.fstype, map[string]string{"size": tc.size})
			_, err = d.node().NodePublishVolume(ctx, elsewhere)
			wantCode(t, err, codes.FailedPrecondition, target)
			if got, err := os.ReadFile(filepath.Join(target, "kept")); err != nil || string(got) != string(data) {
				t.Errorf("data after the refused repeats: %q, %v", got, err)
			}
			vols, err := d.controller().ListVolumes(ctx, &csi.ListVolumesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(vols.GetEntries()); n != 0 {
				t.Errorf("ListVolumes lists %d volumes: an inline volume is the node's, not the controller's", n)
			}
			for i := range 2 {
				if err := unpublishEphemeral(ctx, d, id, target); err != nil {
					t.Fatalf("NodeUnpublish #%d: %v", i+1, err)
				}
				wantNothingLeft(t, d, target)
			}
		})
	}
}

// TestEphemeralLocaldir: an inline localdir volume is a pool folder bound
// at the target; it goes with NodeUnpublish. The backend is named by the
// volume attribute, as a StorageClass parameter names it.
func TestEphemeralLocaldir(t *testing.T) {
	d := ephemeralDaemon(t)
	ctx := callCtx(t)
	id := "csi-localdir-0001"
	target := targetPath(workDir(t), "inline-dir")
	req := ephemeralRequest(id, target, "", map[string]string{backendParam: "localdir", "size": "1Gi"})
	if _, err := d.node().NodePublishVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "kept"), []byte("dir"), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(d.pools["localdir"])
	if err != nil || len(entries) != 1 {
		t.Fatalf("localdir pool holds %d entries (%v), want the one volume", len(entries), err)
	}
	if _, err := os.Stat(filepath.Join(d.pools["localdir"], entries[0].Name(), "kept")); err != nil {
		t.Errorf("the data is not in the pool folder: %v", err)
	}
	if err := unpublishEphemeral(ctx, d, id, target); err != nil {
		t.Fatal(err)
	}
	wantNothingLeft(t, d, target)
}

// TestEphemeralRefused: what an inline volume cannot be is refused with
// INVALID_ARGUMENT before anything is made, and a backend that refuses the
// volume leaves nothing behind either (the publish undoes itself).
func TestEphemeralRefused(t *testing.T) {
	d := ephemeralDaemon(t)
	ctx := callCtx(t)
	target := targetPath(workDir(t), "refused")
	block := ephemeralRequest("csi-block", target, "", nil)
	block.VolumeCapability = loopCapability(true)
	staged := ephemeralRequest("csi-staged", target, "ext4", nil)
	staged.StagingTargetPath = filepath.Join(filepath.Dir(target), "staging")
	for _, tc := range []struct {
		name  string
		req   *csi.NodePublishVolumeRequest
		words []string
	}{
		{"not node-local", ephemeralRequest("csi-fault", target, "", map[string]string{backendParam: "fault"}), []string{"fault", "node"}},
		{"unknown backend", ephemeralRequest("csi-nosuch", target, "", map[string]string{backendParam: "nosuch"}), []string{"nosuch"}},
		{"bad size", ephemeralRequest("csi-size", target, "ext4", map[string]string{"size": "12Qi"}), []string{"size", "12Qi"}},
		{"negative size", ephemeralRequest("csi-neg", target, "ext4", map[string]string{"size": "-1Gi"}), []string{"size"}},
		{"block", block, []string{"mount"}},
		{"staging path", staged, []string{"staging_target_path"}},
		{"parameter the backend refuses", ephemeralRequest("csi-param", target, "", map[string]string{backendParam: "localdir", "colour": "blue"}), []string{"colour"}},
		{"fs type the backend lacks", ephemeralRequest("csi-fs", target, "vfat", nil), []string{"vfat"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.node().NodePublishVolume(ctx, tc.req)
			wantCode(t, err, codes.InvalidArgument, tc.words...)
			wantNothingLeft(t, d, target)
			// Nothing of the refusal stays recorded either: the same ID
			// publishes, and goes, as a new volume.
			fixed := ephemeralRequest(tc.req.GetVolumeId(), target, "ext4", nil)
			if _, err := d.node().NodePublishVolume(ctx, fixed); err != nil {
				t.Fatalf("NodePublish of the same ID after the refusal: %v", err)
			}
			if err := unpublishEphemeral(ctx, d, tc.req.GetVolumeId(), target); err != nil {
				t.Fatal(err)
			}
			wantNothingLeft(t, d, target)
		})
	}
}

// loopsUnder lists the loop devices whose backing file lies below dir.
func loopsUnder(t *testing.T, dir string) []loop.Device {
	t.Helper()
	devs, err := loop.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []loop.Device
	for _, d := range devs {
		if strings.HasPrefix(d.BackingFile, dir+"/") {
			out = append(out, d)
		}
	}
	return out
}
