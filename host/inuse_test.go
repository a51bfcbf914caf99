package host_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// A live volume is never deleted: while this daemon holds a stage or a
// publication of a volume, DeleteVolume answers FAILED_PRECONDITION and
// the data stays, also where the CO made no controller publication
// (attachRequired: false, as the node-local layout ships).

// deleteVolume calls DeleteVolume on id.
func deleteVolume(ctx context.Context, d *daemon, id string) error {
	_, err := d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	return err
}

// TestDeleteVolumeRefusedWhileOnNode: localdir, whose volume is a folder
// bind-mounted at the staging path.
func TestDeleteVolumeRefusedWhileOnNode(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t, localdirOptions(t))
	ctx := callCtx(t)
	v := newLocalVolume(t, d, "live")
	id := v.vol.GetVolumeId()
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(v.target, "kept")
	if err := os.WriteFile(kept, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantData := func(when string) {
		t.Helper()
		if b, err := os.ReadFile(kept); err != nil || string(b) != "data" {
			t.Fatalf("data %s: %q, %v", when, b, err)
		}
	}

	wantCode(t, deleteVolume(ctx, d, id), codes.FailedPrecondition, "staged", v.staging)
	wantData("after DeleteVolume of a published volume")
	if err := v.unpublish(ctx, d); err != nil {
		t.Fatal(err)
	}
	wantCode(t, deleteVolume(ctx, d, id), codes.FailedPrecondition, "staged", v.staging)
	if err := v.publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	wantData("after DeleteVolume of a staged volume")
	// A restart keeps the refusal: it rests on the records.
	d.restart(t)
	wantCode(t, deleteVolume(ctx, d, id), codes.FailedPrecondition, "staged")
	wantData("after a restart and DeleteVolume")

	if err := v.unpublish(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(ctx, d); err != nil {
		t.Fatal(err)
	}
	v.wantMounts(t, 0, 0)
	if err := deleteVolume(ctx, d, id); err != nil {
		t.Fatalf("DeleteVolume after unpublish and unstage: %v", err)
	}
	if _, err := os.Stat(v.vol.GetVolumeContext()["path"]); !os.IsNotExist(err) {
		t.Errorf("volume folder after DeleteVolume: %v", err)
	}
}

// TestLoopfileDeleteVolumeRefusedWhileOnNode: loopfile, mount and block
// access, whose volume is a file on a loop device.
func TestLoopfileDeleteVolumeRefusedWhileOnNode(t *testing.T) {
	d := loopfileDaemon(t)
	for _, block := range []bool{false, true} {
		t.Run(accessName(block), func(t *testing.T) {
			ctx := callCtx(t)
			v := newLoopVolume(t, d, "live-"+accessName(block), block)
			id := v.vol.GetVolumeId()
			if err := v.stage(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := v.publish(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.writeKept(t, v.target)

			wantCode(t, deleteVolume(ctx, d, id), codes.FailedPrecondition, "staged", v.staging)
			v.want(t, 1, true, map[string]int{v.target: 1})
			v.readKept(t, v.target)
			if err := v.unpublishAt(ctx, d, v.target); err != nil {
				t.Fatal(err)
			}
			wantCode(t, deleteVolume(ctx, d, id), codes.FailedPrecondition, "staged", v.staging)
			if _, err := os.Stat(v.file); err != nil {
				t.Fatalf("volume file after DeleteVolume of a staged volume: %v", err)
			}
			if err := v.publish(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.readKept(t, v.target)

			if err := v.unpublishAt(ctx, d, v.target); err != nil {
				t.Fatal(err)
			}
			if err := v.unstage(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.want(t, 0, false, map[string]int{v.target: 0})
			if err := deleteVolume(ctx, d, id); err != nil {
				t.Fatalf("DeleteVolume after unpublish and unstage: %v", err)
			}
			if _, err := os.Stat(v.file); !os.IsNotExist(err) {
				t.Errorf("volume file after DeleteVolume: %v", err)
			}
		})
	}
}

// TestControllerRoleTracksNodeUse: a controller-only daemon holds no node
// records, so it must learn of every node's use through
// ControllerPublishVolume: it asks the CO for it even when no loaded
// backend has a controller step, and refuses DeleteVolume while a node
// holds a publication.
func TestControllerRoleTracksNodeUse(t *testing.T) {
	o := localdirOptions(t)
	o.role = config.RoleController
	d := startDaemon(t, o)
	ctx := callCtx(t)
	caps, err := d.controller().ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(caps.GetCapabilities(), func(c *csi.ControllerServiceCapability) bool {
		return c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME
	}) {
		t.Fatalf("controller role does not ask for ControllerPublishVolume: %v", caps.GetCapabilities())
	}
	v := createVolume(t, d, &csi.CreateVolumeRequest{Name: "split"})
	node := "worker-1;"
	if _, err := d.controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: node, VolumeCapability: rwCap}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, deleteVolume(ctx, d, v.GetVolumeId()), codes.FailedPrecondition, "published to", "worker-1")
	if _, err := os.Stat(v.GetVolumeContext()["path"]); err != nil {
		t.Fatalf("volume folder after a refused DeleteVolume: %v", err)
	}
	if _, err := d.controller().ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: node}); err != nil {
		t.Fatal(err)
	}
	if err := deleteVolume(ctx, d, v.GetVolumeId()); err != nil {
		t.Fatalf("DeleteVolume after ControllerUnpublish: %v", err)
	}
}

// TestSplitLayoutNodeUse: in the split layout a controller daemon and a
// node daemon keep separate records. The node daemon stages only what the
// controller published to it, so the controller's refusal to delete a
// published volume covers every node's use.
func TestSplitLayoutNodeUse(t *testing.T) {
	requireRoot(t)
	co := localdirOptions(t)
	co.role = config.RoleController
	ctrl := startDaemon(t, co)
	no := localdirOptions(t)
	no.role, no.pool = config.RoleNode, ctrl.pool
	node := startDaemon(t, no)
	ctx := callCtx(t)

	v := newLocalVolume(t, ctrl, "split")
	id := v.vol.GetVolumeId()
	info, err := node.node().NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	stage := func(publishCtx map[string]string) error {
		_, err := node.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: id, StagingTargetPath: v.staging, VolumeCapability: rwCap,
			VolumeContext: v.vol.GetVolumeContext(), PublishContext: publishCtx,
		})
		return err
	}
	wantCode(t, stage(nil), codes.FailedPrecondition, "not published", "attachRequired")
	wantCode(t, stage(map[string]string{"wasmcsi.dev/published-node": "another-node"}), codes.FailedPrecondition, "not published")
	v.wantMounts(t, 0, 0)

	pub, err := ctrl.controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: info.GetNodeId(), VolumeCapability: rwCap})
	if err != nil {
		t.Fatal(err)
	}
	if err := stage(pub.GetPublishContext()); err != nil {
		t.Fatalf("NodeStage with the controller's publish context: %v", err)
	}
	// A repeat without it (a CO that lost it, a daemon from before the
	// rule) finds the stage recorded and goes on.
	if err := stage(nil); err != nil {
		t.Fatalf("repeated NodeStage: %v", err)
	}
	if err := v.publish(ctx, node); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(v.target, "kept")
	if err := os.WriteFile(kept, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantCode(t, deleteVolume(ctx, ctrl, id), codes.FailedPrecondition, "published to")
	if b, err := os.ReadFile(kept); err != nil || string(b) != "data" {
		t.Fatalf("data after a refused DeleteVolume: %q, %v", b, err)
	}

	if err := v.unpublish(ctx, node); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(ctx, node); err != nil {
		t.Fatal(err)
	}
	if _, err := ctrl.controller().ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: info.GetNodeId()}); err != nil {
		t.Fatal(err)
	}
	if err := deleteVolume(ctx, ctrl, id); err != nil {
		t.Fatalf("DeleteVolume after the node let go and ControllerUnpublish: %v", err)
	}
	v.wantMounts(t, 0, 0)
}

// TestOfflineExpansionRefusedWhileOnNode: a backend that expands only
// volumes not in use is not asked to while this node has the volume
// staged, with or without a controller publication.
func TestOfflineExpansionRefusedWhileOnNode(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t, daemonOptions{
		backend: "offline", wasm: moduletest.Build(t, "./testdata/offline", moduletest.Go),
		hostcalls: []string{"dir"},
	})
	ctx := callCtx(t)
	v := newLocalVolume(t, d, "grow")
	expand := func() error {
		_, err := d.controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: v.vol.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20},
		})
		return err
	}
	if err := v.stage(ctx, d); err != nil {
		t.Fatal(err)
	}
	wantCode(t, expand(), codes.FailedPrecondition, "not in use", "staged")
	if err := v.unstage(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := expand(); err != nil {
		t.Fatalf("ControllerExpandVolume of a volume not in use: %v", err)
	}
}
