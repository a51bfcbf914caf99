package host_test

import (
	"context"
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// errorRow is one row of an error table of the CSI spec (spec.md, "<RPC>
// Errors"), as the daemon can meet it.
type errorRow struct {
	rpc, condition string
	// root marks rows that need a staged or published volume.
	root bool
	call func(ctx context.Context) error
	want codes.Code
}

// errorTableDaemon serves localdir (quotas off), the fault fixture (no
// clone, no expansion) and loopfile (mount and block), the combination
// that lets every row below be reached.
func errorTableDaemon(t *testing.T) *daemon {
	t.Helper()
	if _, err := os.Stat("../examples/loopfile"); err != nil {
		t.Skip("example modules not present: ", err)
	}
	o := localdirOptions(t)
	o.more = []daemonModule{
		faultModule(nil),
		{name: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go), hostcalls: []string{"file", "loop"}},
	}
	g := newGate()
	g.release() // the fault module's create_volume passes through
	o.hostCalls = append(o.hostCalls, g.hostCall())
	return startDaemon(t, o)
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// TestSpecErrorTables walks the error tables of spec.md RPC by RPC
// (Controller, Node, GroupController; SnapshotMetadata's are in
// snapshotmetadata_test.go) and checks each row the daemon can hit
// answers the table's code.
func TestSpecErrorTables(t *testing.T) {
	d := errorTableDaemon(t)
	ctl, node, grp := d.controller(), d.node(), csi.NewGroupControllerClient(d.conn)
	const mib = 1 << 20
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "et-vol", CapacityRange: &csi.CapacityRange{RequiredBytes: mib}})
	member := createVolume(t, d, &csi.CreateVolumeRequest{Name: "et-member", CapacityRange: &csi.CapacityRange{RequiredBytes: mib}})
	blockVol := createVolume(t, d, &csi.CreateVolumeRequest{
		Name: "et-block", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mib},
		Parameters:         map[string]string{backendParam: "loopfile"},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
	})
	ctx := callCtx(t)
	snap, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "et-snap", SourceVolumeId: vol.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctl.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	})
	group, err := grp.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "et-group", SourceVolumeIds: []string{member.GetVolumeId()}})
	if err != nil {
		t.Fatal(err)
	}
	groupID := group.GetGroupSnapshot().GetGroupSnapshotId()
	memberSnap := group.GetGroupSnapshot().GetSnapshots()[0].GetSnapshotId()
	t.Cleanup(func() {
		grp.DeleteVolumeGroupSnapshot(context.Background(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: groupID, SnapshotIds: []string{memberSnap}})
	})
	info, err := node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	nodeID := info.GetNodeId()
	// vol is published to this node, read-write, for the rows that need a
	// publication (localdir has no controller_publish; the host records it).
	if _, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: nodeID, VolumeCapability: rwCap}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctl.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: nodeID})
	})
	const unknownID = "nosuch:volume"
	w := workDir(t)
	staging, target := stagingPath(w, "et"), targetPath(w, "et")
	gone := "localdir:v-never-created-0000000000000000"
	roCap := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)
	flagsCap := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	flagsCap.GetMount().MountFlags = []string{"noatime"}
	anotherNode := "another-node;"
	t.Cleanup(func() {
		// Should a refused stage ever go through, it must not leak.
		for _, id := range []string{vol.GetVolumeId(), member.GetVolumeId(), blockVol.GetVolumeId()} {
			node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging + "-x"})
		}
	})

	rows := []errorRow{
		// CreateVolume
		{rpc: "CreateVolume", condition: "source snapshot does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "et-from-gone", VolumeCapabilities: rwCaps(),
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "localdir:s-gone"}}}})
			return err
		}},
		{rpc: "CreateVolume", condition: "source volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "et-clone-gone", VolumeCapabilities: rwCaps(),
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: gone}}}})
			return err
		}},
		{rpc: "CreateVolume", condition: "source not supported by the backend", want: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "et-fault-clone", VolumeCapabilities: rwCaps(), Parameters: map[string]string{backendParam: "fault"},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}}})
			return err
		}},
		{rpc: "CreateVolume", condition: "exists but incompatible capacity_range", want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "et-vol", VolumeCapabilities: rwCaps(), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * mib}})
			return err
		}},
		{rpc: "CreateVolume", condition: "exists but incompatible accessibility_requirements", want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "et-vol", VolumeCapabilities: rwCaps(), CapacityRange: &csi.CapacityRange{RequiredBytes: mib},
				AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"topology.wasmcsi.dev/node": "elsewhere"}}}}})
			return err
		}},
		{rpc: "CreateVolume", condition: "unable to provision in the requisite topology", want: codes.ResourceExhausted, call: func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "et-elsewhere", VolumeCapabilities: rwCaps(),
				AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"topology.wasmcsi.dev/node": "elsewhere"}}}}})
			return err
		}},
		{rpc: "CreateVolume", condition: "capacity_range below the source", want: codes.OutOfRange, call: func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "et-small-clone", VolumeCapabilities: rwCaps(), CapacityRange: &csi.CapacityRange{LimitBytes: 4096},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}}})
			return err
		}},
		// DeleteVolume
		{rpc: "DeleteVolume", condition: "volume in use (published)", want: codes.FailedPrecondition, call: func(ctx context.Context) error {
			_, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
			return err
		}},
		// ControllerPublishVolume
		{rpc: "ControllerPublishVolume", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: gone, NodeId: nodeID, VolumeCapability: rwCap})
			return err
		}},
		{rpc: "ControllerPublishVolume", condition: "node does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: member.GetVolumeId(), NodeId: "not-a-node-of-ours", VolumeCapability: rwCap})
			return err
		}},
		{rpc: "ControllerPublishVolume", condition: "published but incompatible readonly", want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: nodeID, VolumeCapability: rwCap, Readonly: true})
			return err
		}},
		{rpc: "ControllerPublishVolume", condition: "published but incompatible volume_capability", want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: nodeID, VolumeCapability: mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)})
			return err
		}},
		{rpc: "ControllerPublishVolume", condition: "published to another node, single-node mode", want: codes.FailedPrecondition, call: func(ctx context.Context) error {
			_, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: anotherNode, VolumeCapability: rwCap})
			return err
		}},
		// ControllerUnpublishVolume: a volume that is gone is assumed
		// unpublished, so the NOT_FOUND rows do not apply.
		{rpc: "ControllerUnpublishVolume", condition: "volume does not exist, assumed unpublished", want: codes.OK, call: func(ctx context.Context) error {
			_, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: gone, NodeId: nodeID})
			return err
		}},
		// ValidateVolumeCapabilities
		{rpc: "ValidateVolumeCapabilities", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: gone, VolumeCapabilities: rwCaps()})
			return err
		}},
		// ListVolumes, ControllerListVolumeHealth, ListSnapshots
		{rpc: "ListVolumes", condition: "invalid starting_token", want: codes.Aborted, call: func(ctx context.Context) error {
			_, err := ctl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "not-a-token"})
			return err
		}},
		{rpc: "ControllerListVolumeHealth", condition: "invalid starting_token", want: codes.Aborted, call: func(ctx context.Context) error {
			_, err := ctl.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{StartingToken: "not-a-token"})
			return err
		}},
		{rpc: "ControllerGetVolumeHealth", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: gone})
			return err
		}},
		{rpc: "ControllerGetVolume", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: gone})
			return err
		}},
		// Snapshots
		{rpc: "CreateSnapshot", condition: "exists but for another volume", want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "et-snap", SourceVolumeId: member.GetVolumeId()})
			return err
		}},
		{rpc: "DeleteSnapshot", condition: "snapshot is part of a group", want: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: memberSnap})
			return err
		}},
		{rpc: "ListSnapshots", condition: "invalid starting_token", want: codes.Aborted, call: func(ctx context.Context) error {
			_, err := ctl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "not-a-token"})
			return err
		}},
		{rpc: "GetSnapshot", condition: "snapshot does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: "localdir:s-gone"})
			return err
		}},
		// ControllerExpandVolume
		{rpc: "ControllerExpandVolume", condition: "exceeds capabilities (access type the backend lacks)", want: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * mib},
				VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
			return err
		}},
		{rpc: "ControllerExpandVolume", condition: "exceeds capabilities (access type the volume was not created for)", want: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: blockVol.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mib}, VolumeCapability: rwCap})
			return err
		}},
		{rpc: "ControllerExpandVolume", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: gone, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * mib}})
			return err
		}},
		{rpc: "ControllerExpandVolume", condition: "unsupported capacity_range", want: codes.OutOfRange, call: func(ctx context.Context) error {
			_, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: mib + 1, LimitBytes: mib + 2}})
			return err
		}},
		// NodeStageVolume
		{rpc: "NodeStageVolume", condition: "volume does not exist (no backend owns the ID)", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: unknownID, StagingTargetPath: staging + "-x", VolumeCapability: rwCap})
			return err
		}},
		{rpc: "NodeStageVolume", condition: "volume does not exist (the backend has no such volume)", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: gone, StagingTargetPath: staging + "-x", VolumeCapability: rwCap})
			return err
		}},
		{rpc: "NodeStageVolume", condition: "exceeds capabilities (access type the backend lacks)", want: codes.FailedPrecondition, call: func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: member.GetVolumeId(), StagingTargetPath: staging + "-x", VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
			return err
		}},
		{rpc: "NodeStageVolume", condition: "exceeds capabilities (access mode the backend lacks)", want: codes.FailedPrecondition, call: func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: member.GetVolumeId(), StagingTargetPath: staging + "-x", VolumeCapability: mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)})
			return err
		}},
		{rpc: "NodeStageVolume", condition: "exceeds capabilities (access type the volume was not created for)", want: codes.FailedPrecondition, call: func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: blockVol.GetVolumeId(), StagingTargetPath: staging + "-x", VolumeCapability: rwCap})
			return err
		}},
		{rpc: "NodeStageVolume", condition: "staged but incompatible (read-only mode)", root: true, want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: roCap})
			return err
		}},
		{rpc: "NodeStageVolume", condition: "staged but incompatible (mount flags)", root: true, want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: flagsCap})
			return err
		}},
		// NodeUnstageVolume
		{rpc: "NodeUnstageVolume", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: unknownID, StagingTargetPath: staging + "-x"})
			return err
		}},
		// NodePublishVolume
		{rpc: "NodePublishVolume", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: unknownID, StagingTargetPath: staging, TargetPath: target + "-x", VolumeCapability: rwCap})
			return err
		}},
		{rpc: "NodePublishVolume", condition: "staging target path not set", want: codes.FailedPrecondition, call: func(ctx context.Context) error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target + "-x", VolumeCapability: rwCap})
			return err
		}},
		{rpc: "NodePublishVolume", condition: "exceeds capabilities (access type the backend lacks)", want: codes.FailedPrecondition, call: func(ctx context.Context) error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target + "-x", VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
			return err
		}},
		{rpc: "NodePublishVolume", condition: "published but incompatible readonly", root: true, want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwCap, Readonly: true})
			return err
		}},
		{rpc: "NodePublishVolume", condition: "published but incompatible capability (mount flags)", root: true, want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target, VolumeCapability: flagsCap})
			return err
		}},
		// NodeUnpublishVolume
		{rpc: "NodeUnpublishVolume", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: unknownID, TargetPath: target + "-x"})
			return err
		}},
		// NodeGetVolumeStats, NodeGetVolumeHealth
		{rpc: "NodeGetVolumeStats", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: member.GetVolumeId(), VolumePath: target})
			return err
		}},
		{rpc: "NodeGetVolumeStats", condition: "volume does not exist on volume_path", root: true, want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: target + "-x"})
			return err
		}},
		{rpc: "NodeGetVolumeHealth", condition: "volume does not exist on the node", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: member.GetVolumeId()})
			return err
		}},
		// NodeExpandVolume
		{rpc: "NodeExpandVolume", condition: "exceeds capabilities", root: true, want: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.GetVolumeId(), VolumePath: target, VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
			return err
		}},
		{rpc: "NodeExpandVolume", condition: "volume does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: member.GetVolumeId(), VolumePath: target})
			return err
		}},
		// GroupController
		{rpc: "CreateVolumeGroupSnapshot", condition: "exists but for other source_volume_ids", want: codes.AlreadyExists, call: func(ctx context.Context) error {
			_, err := grp.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "et-group", SourceVolumeIds: []string{vol.GetVolumeId()}})
			return err
		}},
		{rpc: "DeleteVolumeGroupSnapshot", condition: "snapshot list mismatch", want: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := grp.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: groupID, SnapshotIds: []string{snap.GetSnapshot().GetSnapshotId()}})
			return err
		}},
		{rpc: "GetVolumeGroupSnapshot", condition: "snapshot list mismatch", want: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := grp.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: groupID, SnapshotIds: []string{snap.GetSnapshot().GetSnapshotId()}})
			return err
		}},
		{rpc: "GetVolumeGroupSnapshot", condition: "group snapshot does not exist", want: codes.NotFound, call: func(ctx context.Context) error {
			_, err := grp.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "group:gone"})
			return err
		}},
	}

	root := os.Geteuid() == 0
	if root {
		// vol staged and published read-write, for the rows that need it.
		if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: rwCap, VolumeContext: vol.GetVolumeContext()}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
		})
		if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwCap, VolumeContext: vol.GetVolumeContext()}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
		})
	}
	for _, r := range rows {
		t.Run(r.rpc+"/"+r.condition, func(t *testing.T) {
			if r.root && !root {
				t.Skip("needs root: a staged and published volume")
			}
			err := r.call(callCtx(t))
			if got := status.Code(err); got != r.want {
				t.Errorf("%s: %v, want %s", r.condition, err, r.want)
			}
		})
	}
	// Nothing the refused calls named was mounted or left behind.
	for _, p := range []string{staging + "-x", target + "-x"} {
		if n := mountsAt(t, p); n != 0 {
			t.Errorf("%d mounts at %s", n, p)
		}
	}
	if root {
		if n := mountsAt(t, staging); n != 1 {
			t.Errorf("%d mounts at the staging path, want 1", n)
		}
		if n := mountsAt(t, target); n != 1 {
			t.Errorf("%d mounts at the target path, want 1", n)
		}
	}
}
