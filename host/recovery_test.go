package host_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/host"
)

// Durability and recovery: what the daemon recorded survives a restart,
// and what a reboot takes away (every mount) comes back on the CO's next
// NodeStage/NodePublish, exactly once.

func listVolumeIDs(t *testing.T, d *daemon) []string {
	t.Helper()
	resp, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range resp.GetEntries() {
		ids = append(ids, e.GetVolume().GetVolumeId())
	}
	slices.Sort(ids)
	return ids
}

// TestRecordsSurviveRestart: volumes, their capacity and a controller
// publication are still there after the daemon restarts on the same state
// folder, and a repeated CreateVolume answers the recorded volume.
func TestRecordsSurviveRestart(t *testing.T) {
	d := startDaemon(t, localdirOptions(t))
	var want []string
	for i := range 3 {
		v := createVolume(t, d, &csi.CreateVolumeRequest{Name: fmt.Sprintf("durable-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: int64(i+1) << 20}})
		want = append(want, v.GetVolumeId())
	}
	slices.Sort(want)
	info, err := d.node().NodeGetInfo(callCtx(t), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.controller().ControllerPublishVolume(callCtx(t), &csi.ControllerPublishVolumeRequest{VolumeId: want[0], NodeId: info.GetNodeId(), VolumeCapability: rwCap}); err != nil {
		t.Fatal(err)
	}

	d.restart(t)

	if got := listVolumeIDs(t, d); !slices.Equal(got, want) {
		t.Fatalf("after restart: %v, want %v", got, want)
	}
	for i, id := range want {
		got, err := d.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		if c := got.GetVolume().GetCapacityBytes(); c != int64(i+1)<<20 {
			t.Errorf("%s: capacity %d after restart", id, c)
		}
		if nodes := got.GetStatus().GetPublishedNodeIds(); (i == 0) != slices.Equal(nodes, []string{info.GetNodeId()}) {
			t.Errorf("%s: published to %v after restart", id, nodes)
		}
	}
	again, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: "durable-1", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}, VolumeCapabilities: rwCaps()})
	if err != nil || again.GetVolume().GetVolumeId() != want[1] {
		t.Errorf("repeated CreateVolume after restart: %v, %v", again, err)
	}
	if _, err := d.controller().ControllerUnpublishVolume(callCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: want[0], NodeId: info.GetNodeId()}); err != nil {
		t.Fatal(err)
	}
}

// TestPublishAfterRestart: a volume staged before a daemon restart (its
// mounts untouched) publishes after it, and stage and publish stay at one
// mount each.
func TestPublishAfterRestart(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t, localdirOptions(t))
	v := newLocalVolume(t, d, "restaged")
	if err := v.stage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	d.restart(t)
	if err := v.publish(callCtx(t), d); err != nil {
		t.Fatalf("NodePublish after restart: %v", err)
	}
	if err := v.stage(callCtx(t), d); err != nil {
		t.Fatalf("NodeStage after restart: %v", err)
	}
	v.wantMounts(t, 1, 1)
	if err := v.unpublish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	v.wantMounts(t, 0, 0)
}

// TestRebootRecreatesMounts simulates a reboot: the staging and target
// mounts disappear behind the daemon's back (and the daemon restarts).
// NodeGetVolumeHealth and Reconcile report the lost stage; the CO's next
// calls re-create exactly one mount each, and the data is back.
func TestRebootRecreatesMounts(t *testing.T) {
	requireRoot(t)
	cases := []struct {
		name string
		// restage says whether the CO calls NodeStage before NodePublish
		// (kubelet does); without, NodePublish must re-stage itself.
		restage bool
	}{
		{"stage then publish", true},
		{"publish only", false},
	}
	d := startDaemon(t, localdirOptions(t))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := newLocalVolume(t, d, "reboot-"+map[bool]string{true: "a", false: "b"}[c.restage])
			ctx := callCtx(t)
			if err := v.stage(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := v.publish(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(v.target, "kept"), []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			if lost := stagingLost(t, d, v); lost {
				t.Fatal("StagingLost reported before the reboot")
			}

			// The reboot: every mount is gone, the daemon starts again.
			for _, p := range []string{v.target, v.staging} {
				if err := unix.Unmount(p, 0); err != nil {
					t.Fatalf("unmount %s: %v", p, err)
				}
			}
			v.wantMounts(t, 0, 0)
			d.restart(t)

			if !stagingLost(t, d, v) {
				t.Error("NodeGetVolumeHealth does not report StagingLost after the reboot")
			}
			if !slices.ContainsFunc(d.srv.Reconcile(ctx, false), func(f host.Finding) bool {
				return f.Kind == "stage-lost" && f.Path == v.staging
			}) {
				t.Errorf("Reconcile does not report the lost stage at %s", v.staging)
			}
			if c.restage {
				if err := v.stage(ctx, d); err != nil {
					t.Fatalf("NodeStage after reboot: %v", err)
				}
				v.wantMounts(t, 1, 0)
			}
			if err := v.publish(ctx, d); err != nil {
				t.Fatalf("NodePublish after reboot: %v", err)
			}
			v.wantMounts(t, 1, 1)
			if b, err := os.ReadFile(filepath.Join(v.target, "kept")); err != nil || string(b) != "data" {
				t.Errorf("data after reboot: %q, %v", b, err)
			}
			if stagingLost(t, d, v) {
				t.Error("StagingLost still reported after re-staging")
			}
			// Repeats stay at one mount each.
			if err := v.stage(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := v.publish(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.wantMounts(t, 1, 1)
			if err := v.unpublish(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := v.unstage(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.wantMounts(t, 0, 0)
		})
	}
}

// stagingLost reports whether NodeGetVolumeHealth says v's stage is gone.
func stagingLost(t *testing.T, d *daemon, v *localVolume) bool {
	t.Helper()
	resp, err := d.node().NodeGetVolumeHealth(callCtx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: v.vol.GetVolumeId(), VolumePublishPath: v.target})
	if err != nil {
		t.Fatalf("NodeGetVolumeHealth: %v", err)
	}
	return slices.ContainsFunc(resp.GetVolumeHealth().GetHealthStatuses(), func(e *csi.VolumeHealth_VolumeHealthEntry) bool {
		return e.GetReason() == "StagingLost" && e.GetStatus() == csi.VolumeHealthErrorType_INACCESSIBLE
	})
}

// TestReconcileOrphanMount: a bind mount of a pool directory that no
// record explains is reported as orphan-mount, and removed only with
// clean; the recorded stage and publication of another volume are neither
// reported nor touched. Bind mounts show their root relative to their own
// filesystem, so the test runs with the pool on the root filesystem's
// folder and with the pool on a filesystem of its own.
func TestReconcileOrphanMount(t *testing.T) {
	requireRoot(t)
	for _, ownFS := range []bool{false, true} {
		t.Run(map[bool]string{false: "pool in a folder", true: "pool on its own tmpfs"}[ownFS], func(t *testing.T) {
			d := startDaemon(t, localdirOptions(t))
			if ownFS {
				if err := unix.Mount("tmpfs", d.pool, "tmpfs", 0, "size=16m"); err != nil {
					t.Skip("needs tmpfs: ", err)
				}
				t.Cleanup(func() { unix.Unmount(d.pool, unix.MNT_DETACH) })
			}
			ctx := callCtx(t)
			kept := newLocalVolume(t, d, "recorded")
			if err := kept.stage(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := kept.publish(ctx, d); err != nil {
				t.Fatal(err)
			}
			lost := createVolume(t, d, &csi.CreateVolumeRequest{Name: "leaked"})
			orphan := filepath.Join(workDir(t), "leaked-mount")
			if err := os.MkdirAll(orphan, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount(lost.GetVolumeContext()["path"], orphan, "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}

			isOrphan := func(f host.Finding) bool { return f.Kind == "orphan-mount" && f.Path == orphan }
			findings := d.srv.Reconcile(ctx, false)
			if !slices.ContainsFunc(findings, isOrphan) {
				t.Errorf("orphan bind at %s not reported: %v", orphan, findings)
			}
			for _, f := range findings {
				if f.Path == kept.staging || f.Path == kept.target {
					t.Errorf("recorded mount reported: %v", f)
				}
			}
			if n := mountsAt(t, orphan); n != 1 {
				t.Fatalf("report-only reconcile changed the orphan: %d mounts", n)
			}

			findings = d.srv.Reconcile(ctx, true)
			if !slices.ContainsFunc(findings, isOrphan) {
				t.Errorf("orphan bind at %s not reported by the cleaning run: %v", orphan, findings)
			}
			if n := mountsAt(t, orphan); n != 0 {
				t.Errorf("orphan still mounted after clean (%d mounts)", n)
			}
			kept.wantMounts(t, 1, 1)
			if findings := d.srv.Reconcile(ctx, false); slices.ContainsFunc(findings, isOrphan) {
				t.Errorf("orphan reported after clean: %v", findings)
			}
			if err := kept.unpublish(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := kept.unstage(ctx, d); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestUnstageForgetsUnmountedPublication: a publication record whose
// target is no longer mounted (a reboot, an unmount behind the daemon's
// back, or a record deletion lost in a crash) does not keep the volume
// from being unstaged, while a live publication still does.
func TestUnstageForgetsUnmountedPublication(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t, localdirOptions(t))
	v := newLocalVolume(t, d, "stale-publication")
	ctx := callCtx(t)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	err := v.unstage(ctx, d)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("NodeUnstage of a published volume = %v, want FAILED_PRECONDITION", err)
	}
	if err := unix.Unmount(v.target, 0); err != nil {
		t.Fatal(err)
	}
	v.wantMounts(t, 1, 0)
	if err := v.unstage(ctx, d); err != nil {
		t.Fatalf("NodeUnstage with only a stale publication record: %v", err)
	}
	v.wantMounts(t, 0, 0)
	// The stale record is gone for good: staging again and unstaging
	// works without a publication in the way, also after a restart.
	d.restart(t)
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(ctx, d); err != nil {
		t.Fatalf("NodeUnstage after restaging: %v", err)
	}
	v.wantMounts(t, 0, 0)
}
