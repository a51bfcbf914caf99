package host_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Node-local volumes across nodes: two daemons of role all on different
// nodes share nothing, as in the node-local layout. What one made carries
// its node in its ID, and every call that reaches the other answers a code
// naming the owner instead of OK or NOT_FOUND (host/RATIONALE.md,
// "Node-local volumes across nodes").

func nodeDaemon(t *testing.T, node string) *daemon {
	o := localdirOptions(t)
	o.nodeID = node
	return startDaemon(t, o)
}

// TestNodeLocalCallsOnAnotherNode: a volume, snapshot and group snapshot
// made by node-a's daemon, asked for on node-b's, get FAILED_PRECONDITION
// naming node-a from every controller call (RESOURCE_EXHAUSTED as the
// source of a new volume) and NOT_FOUND from NodeStage and NodePublish;
// nothing on node-a changes, and node-a deletes them as before.
func TestNodeLocalCallsOnAnotherNode(t *testing.T) {
	a, b := nodeDaemon(t, "node-a"), nodeDaemon(t, "node-b")
	ctx := callCtx(t)
	vol := createVolume(t, a, &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: rwCaps()})
	vid := vol.GetVolumeId()
	if !strings.HasPrefix(vid, "localdir@node-a:") {
		t.Fatalf("volume ID %q does not name its node", vid)
	}
	snap, err := a.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: vid})
	if err != nil {
		t.Fatal(err)
	}
	sid := snap.GetSnapshot().GetSnapshotId()
	if !strings.HasPrefix(sid, "localdir@node-a:") {
		t.Fatalf("snapshot ID %q does not name its node", sid)
	}
	grp, err := a.groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group-1", SourceVolumeIds: []string{vid}})
	if err != nil {
		t.Fatal(err)
	}
	gid := grp.GetGroupSnapshot().GetGroupSnapshotId()
	var members []string
	for _, m := range grp.GetGroupSnapshot().GetSnapshots() {
		members = append(members, m.GetSnapshotId())
	}
	info, err := b.node().NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	nodeB := info.GetNodeId()

	c, g := b.controller(), b.groups()
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		code codes.Code
		call func() error
	}{
		{"DeleteVolume", codes.FailedPrecondition, func() error {
			_, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vid})
			return err
		}},
		{"ControllerExpandVolume", codes.FailedPrecondition, func() error {
			_, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vid, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
			return err
		}},
		{"ControllerModifyVolume", codes.FailedPrecondition, func() error {
			_, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vid})
			return err
		}},
		{"ControllerGetVolume", codes.FailedPrecondition, func() error {
			_, err := c.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: vid})
			return err
		}},
		{"ValidateVolumeCapabilities", codes.FailedPrecondition, func() error {
			_, err := c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vid, VolumeCapabilities: rwCaps()})
			return err
		}},
		{"ControllerPublishVolume", codes.FailedPrecondition, func() error {
			_, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vid, NodeId: nodeB, VolumeCapability: rwCap})
			return err
		}},
		{"ControllerUnpublishVolume", codes.FailedPrecondition, func() error {
			_, err := c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vid, NodeId: nodeB})
			return err
		}},
		{"CreateSnapshot", codes.FailedPrecondition, func() error {
			_, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-b", SourceVolumeId: vid})
			return err
		}},
		{"DeleteSnapshot", codes.FailedPrecondition, func() error {
			_, err := c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sid})
			return err
		}},
		{"GetSnapshot", codes.FailedPrecondition, func() error {
			_, err := c.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: sid})
			return err
		}},
		{"ListSnapshots by snapshot", codes.FailedPrecondition, func() error {
			_, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: sid})
			return err
		}},
		{"ListSnapshots by source", codes.FailedPrecondition, func() error {
			_, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: vid})
			return err
		}},
		{"CreateVolume from the snapshot", codes.ResourceExhausted, func() error {
			_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restore", VolumeCapabilities: rwCaps(),
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}}})
			return err
		}},
		{"CreateVolume from the volume", codes.ResourceExhausted, func() error {
			_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: rwCaps(),
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vid}}}})
			return err
		}},
		{"CreateVolumeGroupSnapshot", codes.FailedPrecondition, func() error {
			_, err := g.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group-b", SourceVolumeIds: []string{vid}})
			return err
		}},
		{"GetVolumeGroupSnapshot", codes.FailedPrecondition, func() error {
			_, err := g.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: gid, SnapshotIds: members})
			return err
		}},
		{"DeleteVolumeGroupSnapshot", codes.FailedPrecondition, func() error {
			_, err := g.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gid, SnapshotIds: members})
			return err
		}},
		{"NodeStageVolume", codes.NotFound, func() error {
			_, err := b.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vid, StagingTargetPath: filepath.Join(dir, "staging"), VolumeCapability: rwCap, VolumeContext: vol.GetVolumeContext()})
			return err
		}},
		{"NodePublishVolume", codes.NotFound, func() error {
			_, err := b.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vid, StagingTargetPath: filepath.Join(dir, "staging"), TargetPath: filepath.Join(dir, "target"), VolumeCapability: rwCap, VolumeContext: vol.GetVolumeContext()})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.call(), tc.code, `node "node-a"`)
		})
	}
	if got := mountsUnder(t, dir); len(got) != 0 {
		t.Errorf("node-b mounted %v", got)
	}

	// node-a still has all of it and deletes it.
	ac := a.controller()
	if _, err := ac.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: vid}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.groups().DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gid, SnapshotIds: members}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sid}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vid}); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(a.pool); len(left) != 0 {
		t.Errorf("node-a's pool holds %d entries after the deletes", len(left))
	}
	// Gone on node-a, a delete there is the idempotent success; on node-b
	// it still names node-a, which alone can tell.
	if _, err := ac.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vid}); err != nil {
		t.Errorf("repeated DeleteVolume on node-a: %v", err)
	}
}

// TestNodeLocalIDsWithoutOtherNode: IDs that name no other node keep the
// spec's answers for what does not exist (csi-sanity's made-up IDs are
// such): untagged ones, and this node's own.
func TestNodeLocalIDsWithoutOtherNode(t *testing.T) {
	b := nodeDaemon(t, "node-b")
	ctx := callCtx(t)
	for _, id := range []string{"localdir:v-gone", "localdir@node-b:v-gone", "localdir@_0123456789abcdef:v-gone"} {
		t.Run(id, func(t *testing.T) {
			if strings.Contains(id, "_0123") {
				// A digest tag of some other node is another node's.
				_, err := b.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
				wantCode(t, err, codes.FailedPrecondition, "another node", "_0123456789abcdef")
				return
			}
			if _, err := b.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				t.Errorf("DeleteVolume: %v", err)
			}
			if _, err := b.controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
				t.Errorf("DeleteSnapshot: %v", err)
			}
			_, err := b.controller().ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
			wantCode(t, err, codes.NotFound)
			_, err = b.controller().GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: id})
			wantCode(t, err, codes.NotFound)
			list, err := b.controller().ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: id})
			if err != nil || len(list.GetEntries()) != 0 {
				t.Errorf("ListSnapshots: %v, %v", list, err)
			}
		})
	}
}

// TestNodeLocalUntaggedRecordsServe: volumes recorded under IDs without a
// node (made by a controller daemon, or before IDs named their node) serve
// on as before, and so does a volume whose node was renamed: a daemon's
// own records are the truth, whatever node an ID names.
func TestNodeLocalUntaggedRecordsServe(t *testing.T) {
	o := localdirOptions(t)
	o.role = config.RoleController
	o.nodeID = "node-a"
	d := startDaemon(t, o)
	ctx := callCtx(t)
	old := createVolume(t, d, &csi.CreateVolumeRequest{Name: "old", VolumeCapabilities: rwCaps()})
	if id := old.GetVolumeId(); strings.Contains(id, "@") {
		t.Fatalf("a controller daemon tagged %q", id)
	}
	d.cfg.Role = config.RoleAll
	d.restart(t)
	tagged := createVolume(t, d, &csi.CreateVolumeRequest{Name: "tagged", VolumeCapabilities: rwCaps()})
	if !strings.HasPrefix(tagged.GetVolumeId(), "localdir@node-a:") {
		t.Fatalf("volume ID %q", tagged.GetVolumeId())
	}
	d.cfg.NodeID = "node-a-renamed"
	d.restart(t)
	if os.Geteuid() == 0 {
		// The node's records are its own too: it stages its volume.
		staging := filepath.Join(t.TempDir(), "staging")
		t.Cleanup(func() { unmountAll(t, filepath.Dir(staging)) })
		if _, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: tagged.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: rwCap, VolumeContext: tagged.GetVolumeContext()}); err != nil {
			t.Fatalf("stage after the rename: %v", err)
		}
		if _, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: tagged.GetVolumeId(), StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []*csi.Volume{old, tagged} {
		if _, err := d.controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}}); err != nil {
			t.Errorf("expand %s: %v", v.GetVolumeId(), err)
		}
		if _, err := d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Errorf("delete %s: %v", v.GetVolumeId(), err)
		}
	}
	if left, _ := os.ReadDir(d.pool); len(left) != 0 {
		t.Errorf("pool holds %d entries after the deletes", len(left))
	}
}

// TestNodeLocalIDLength: a node name that is long, or not of the ID's
// characters, is tagged by a digest, and the whole ID still fits CSI's 128
// bytes; a local ID with no room for the digest tag is refused like one
// over 128 bytes, and nothing is recorded.
func TestNodeLocalIDLength(t *testing.T) {
	n := &notes{}
	long := strings.Repeat("n", 64)
	d := startDaemon(t, daemonOptions{
		backend: "liar", wasm: filepath.Join("testdata", "liar.wasm"), hostcalls: []string{"test"},
		hostCalls: []hostcalls.Func{n.hostCall()}, nodeID: long,
	})
	ctx := callCtx(t)
	short := createVolume(t, d, &csi.CreateVolumeRequest{Name: "short", VolumeCapabilities: rwCaps()})
	id := short.GetVolumeId()
	if !strings.HasPrefix(id, "liar@_") || strings.Contains(id, long) {
		t.Fatalf("volume ID %q: want the digest tag for a node name of 64 bytes", id)
	}
	longest := strings.Repeat("x", 128-len("liar@_0123456789abcdef:"))
	v := createVolume(t, d, &csi.CreateVolumeRequest{Name: longest, VolumeCapabilities: rwCaps()})
	if len(v.GetVolumeId()) != 128 {
		t.Errorf("volume ID of %d bytes, want 128: %q", len(v.GetVolumeId()), v.GetVolumeId())
	}
	_, err := d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: longest + "y", VolumeCapabilities: rwCaps()})
	wantCode(t, err, codes.Internal, `backend "liar"`, "128")
	list, err := d.controller().ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 2 {
		t.Errorf("volumes after the refused create: %v, %v", list, err)
	}
	// The daemon knows its own digest tag: its volumes are its own.
	if _, err := d.controller().ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil {
		t.Error(err)
	}
	gone := strings.Replace(id, ":short", ":gone", 1)
	if _, err := d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: gone}); err != nil {
		t.Errorf("DeleteVolume of this node's %q: %v", gone, err)
	}
}

// TestPublishDisagreementWarned: a daemon of role all whose backends
// disagree on controller_publish advertises PUBLISH_UNPUBLISH_VOLUME for
// all of them; `wasmcsi modules` (Describe) says so, naming both sides.
// One kind alone, or a controller daemon (which always publishes), is
// fine.
func TestPublishDisagreementWarned(t *testing.T) {
	warnings := func(d *daemon) []string {
		var out []string
		for _, l := range d.srv.Describe() {
			if strings.HasPrefix(l, "warning: ") {
				out = append(out, l)
			}
		}
		return out
	}
	bloat := daemonModule{name: "bloat", wasm: filepath.Join("testdata", "bloat.wasm")}
	o := localdirOptions(t)
	o.more = []daemonModule{bloat}
	mixed := startDaemon(t, o)
	if w := warnings(mixed); len(w) != 1 || !strings.Contains(w[0], "with: bloat; without: localdir") || !strings.Contains(w[0], "deploy/README.md") {
		t.Errorf("role all, bloat (controller_publish) and localdir: warnings %q", w)
	}
	o.role = config.RoleController
	if w := warnings(startDaemon(t, o)); len(w) != 0 {
		t.Errorf("role controller: warnings %q", w)
	}
	if w := warnings(nodeDaemon(t, "node-a")); len(w) != 0 {
		t.Errorf("localdir alone: warnings %q", w)
	}
}

// TestNodeLocalIDSpellingsTaken: a local ID recorded under its untagged
// ID (before the daemon tagged, here as a controller) names the same
// storage as the tagged ID a module's answer gets now: for another name it
// is refused like an ID recorded for another name, and nothing is deleted.
func TestNodeLocalIDSpellingsTaken(t *testing.T) {
	n := &notes{}
	d := startDaemon(t, daemonOptions{
		backend: "liar", wasm: filepath.Join("testdata", "liar.wasm"), hostcalls: []string{"test"},
		hostCalls: []hostcalls.Func{n.hostCall()}, role: config.RoleController,
	})
	ctx := callCtx(t)
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "shared+a", VolumeCapabilities: rwCaps()})
	if vol.GetVolumeId() != "liar:shared" {
		t.Fatalf("volume ID %q, want liar:shared", vol.GetVolumeId())
	}
	snap, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap+1", SourceVolumeId: vol.GetVolumeId()})
	if err != nil || snap.GetSnapshot().GetSnapshotId() != "liar:snap" {
		t.Fatalf("CreateSnapshot: %v, %v", snap, err)
	}
	d.cfg.Role = config.RoleAll
	d.restart(t)
	_, err = d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "shared+b", VolumeCapabilities: rwCaps()})
	wantCode(t, err, codes.Internal, `"liar:shared"`, `"shared+a"`, "nothing was recorded or deleted")
	_, err = d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap+2", SourceVolumeId: vol.GetVolumeId()})
	wantCode(t, err, codes.Internal, `"liar:snap"`, `"snap+1"`)
	if dels := n.take(); len(dels) != 0 {
		t.Errorf("the host asked the module to delete %v", dels)
	}
	list, err := d.controller().ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Errorf("volumes after the refused create: %v, %v", list, err)
	}
}
