package host_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// notes is the test_note host call: it keeps the local ID of every delete
// request a module passes it.
type notes struct {
	mu      sync.Mutex
	deletes []string
}

func (n *notes) hostCall() hostcalls.Func {
	return hostcalls.Func{
		Name: "test_note", Family: "test",
		Call: func(_ context.Context, _ *hostcalls.Env, req []byte) ([]byte, error) {
			// A DeleteVolumeRequest and a DeleteSnapshotRequest both hold
			// their ref, whose field 1 is the local ID, in field 1.
			var v abi.DeleteVolumeRequest
			if err := v.UnmarshalWire(req); err != nil {
				return nil, abi.Errorf(abi.InvalidArgument, "%v", err)
			}
			n.mu.Lock()
			n.deletes = append(n.deletes, v.Volume.LocalID)
			n.mu.Unlock()
			return nil, nil
		},
	}
}

func (n *notes) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.deletes
	n.deletes = nil
	return out
}

// startLiar starts a daemon serving only the liar fixture.
func startLiar(t *testing.T) (*daemon, *notes) {
	n := &notes{}
	d := startDaemon(t, daemonOptions{
		backend: "liar", wasm: filepath.Join("testdata", "liar.wasm"), hostcalls: []string{"test"},
		hostCalls: []hostcalls.Func{n.hostCall()},
	})
	return d, n
}

// TestModuleIDTakenRefused: a module that answers, for a new name, a volume
// or snapshot ID recorded for another name gets INTERNAL naming it; nothing
// is recorded, and nothing is deleted (deleting through that ID would
// destroy the recorded volume or snapshot). The recorded one keeps its name
// and answers its own repeats. In a group snapshot the members this call
// made are taken back, and nothing else.
func TestModuleIDTakenRefused(t *testing.T) {
	d, n := startLiar(t)
	ctrl, group := d.controller(), csi.NewGroupControllerClient(d.conn)
	create := func(name string) (*csi.CreateVolumeResponse, error) {
		return ctrl.CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: rwCaps()})
	}
	volumes := func() []string {
		resp, err := ctrl.ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetVolume().GetVolumeId())
		}
		return ids
	}
	snapshots := func() []string {
		resp, err := ctrl.ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetSnapshot().GetSnapshotId())
		}
		return ids
	}

	first, err := create("shared+a")
	if err != nil {
		t.Fatal(err)
	}
	if id := first.GetVolume().GetVolumeId(); id != "liar@test-node:shared" {
		t.Fatalf("volume ID %q, want liar:shared", id)
	}
	if _, err := create("other"); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a retry meets the same lie and the same answer
		_, err := create("shared+b")
		wantCode(t, err, codes.Internal, `backend "liar"`, `"liar@test-node:shared"`, `"shared+a"`, "nothing was recorded or deleted")
	}
	if got := volumes(); !slices.Equal(got, []string{"liar@test-node:other", "liar@test-node:shared"}) {
		t.Errorf("volumes after the refused creates: %v", got)
	}
	if again, err := create("shared+a"); err != nil || again.GetVolume().GetVolumeId() != "liar@test-node:shared" {
		t.Errorf("repeat of shared+a after the refusal: %v, %v", again, err)
	}

	snap, err := ctrl.CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "snap+1", SourceVolumeId: "liar@test-node:shared"})
	if err != nil || snap.GetSnapshot().GetSnapshotId() != "liar@test-node:snap" {
		t.Fatalf("CreateSnapshot snap+1: %v, %v", snap, err)
	}
	_, err = ctrl.CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "snap+2", SourceVolumeId: "liar@test-node:other"})
	wantCode(t, err, codes.Internal, `backend "liar"`, `"liar@test-node:snap"`, `"snap+1"`)
	got, err := ctrl.GetSnapshot(callCtx(t), &csi.GetSnapshotRequest{SnapshotId: "liar@test-node:snap"})
	if err != nil || got.GetSnapshot().GetSourceVolumeId() != "liar@test-node:shared" {
		t.Errorf("snapshot liar:snap after the refusal: %v, %v", got, err)
	}

	// A group member that collides with a recorded snapshot: nothing made,
	// nothing deleted.
	_, err = group.CreateVolumeGroupSnapshot(callCtx(t), &csi.CreateVolumeGroupSnapshotRequest{Name: "snap+g", SourceVolumeIds: []string{"liar@test-node:other"}})
	wantCode(t, err, codes.Internal, `"liar@test-node:snap"`)
	if dels := n.take(); len(dels) != 0 {
		t.Fatalf("the host asked the module to delete %v after refusing its answers", dels)
	}
	// Two members of one group given one ID: the second is refused and the
	// first, which this call made, is taken back.
	_, err = group.CreateVolumeGroupSnapshot(callCtx(t), &csi.CreateVolumeGroupSnapshotRequest{Name: "g+x", SourceVolumeIds: []string{"liar@test-node:other", "liar@test-node:shared"}})
	wantCode(t, err, codes.Internal, `"liar@test-node:g"`)
	if dels := n.take(); !slices.Equal(dels, []string{"g"}) {
		t.Errorf("deletes after the refused group: %v, want [g] (the member this call made)", dels)
	}
	if got := snapshots(); !slices.Equal(got, []string{"liar@test-node:snap"}) {
		t.Errorf("snapshots after the refused group: %v", got)
	}
	if got := volumes(); !slices.Equal(got, []string{"liar@test-node:other", "liar@test-node:shared"}) {
		t.Errorf("volumes at the end: %v", got)
	}
}

// TestModuleIDsChecked: the host refuses a local ID that is ".", "..", starts
// with anything but a letter or digit, holds a "/", or makes a volume or
// snapshot ID longer than CSI's 128 bytes; group snapshot IDs fit 128 bytes
// whatever the name; a node_info context that would make the node ID longer
// than CSI's 256 bytes is left out of it.
func TestModuleIDsChecked(t *testing.T) {
	d, _ := startLiar(t)
	ctrl := d.controller()
	longest := strings.Repeat("x", 128-len("liar@test-node:"))
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{".", false},
		{"..", false},
		{"..+x", false},
		{".hidden", false},
		{"-x", false},
		{"_x", false},
		{"a/b", false},
		{"a b", false},
		{longest + "y", false},
		{longest, true},
		{"a..b", true},
		{"A-1.2_3", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, err := ctrl.CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: c.name, VolumeCapabilities: rwCaps()})
			if !c.ok {
				wantCode(t, err, codes.Internal, `backend "liar"`)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id := resp.GetVolume().GetVolumeId(); len(id) > 128 {
				t.Fatalf("volume ID of %d bytes", len(id))
			}
			snap, err := ctrl.CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: c.name, SourceVolumeId: resp.GetVolume().GetVolumeId()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ctrl.DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
				t.Fatal(err)
			}
			if _, err := ctrl.DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
		})
	}
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "src"})
	_, err := ctrl.CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: longest + "y", SourceVolumeId: vol.GetVolumeId()})
	wantCode(t, err, codes.Internal, `backend "liar"`, "128")
	_, err = ctrl.CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "..", SourceVolumeId: vol.GetVolumeId()})
	wantCode(t, err, codes.Internal, `backend "liar"`)

	// The longest group name CSI allows: its ID still fits, and it answers
	// repeats and Get.
	name := "h+" + strings.Repeat("x", 126)
	req := &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: []string{vol.GetVolumeId()}}
	g, err := csi.NewGroupControllerClient(d.conn).CreateVolumeGroupSnapshot(callCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	gid := g.GetGroupSnapshot().GetGroupSnapshotId()
	if len(gid) > 128 {
		t.Errorf("group snapshot ID of %d bytes: %q", len(gid), gid)
	}
	if again, err := csi.NewGroupControllerClient(d.conn).CreateVolumeGroupSnapshot(callCtx(t), req); err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != gid {
		t.Errorf("repeat: %v, %v", again, err)
	}
	if _, err := csi.NewGroupControllerClient(d.conn).GetVolumeGroupSnapshot(callCtx(t), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: gid}); err != nil {
		t.Errorf("get %s: %v", gid, err)
	}
	if _, err := csi.NewGroupControllerClient(d.conn).DeleteVolumeGroupSnapshot(callCtx(t), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gid}); err != nil {
		t.Errorf("delete %s: %v", gid, err)
	}

	// The liar's node_info context would make the node ID 312 bytes: it is
	// left out, and the node still registers.
	info, err := d.node().NodeGetInfo(callCtx(t), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if id := info.GetNodeId(); len(id) > 256 || strings.Contains(id, "aaaa") {
		t.Errorf("node ID of %d bytes: %q", len(id), id)
	}
}

// TestModuleErrorMessageBounded: a module's error message of 6 MiB reaches
// the CO cut to a few KiB, with its code, its beginning and a note of how
// much was cut (gRPC clients refuse more than 4 MiB by default).
func TestModuleErrorMessageBounded(t *testing.T) {
	d, _ := startLiar(t)
	for range 2 {
		_, err := d.controller().GetCapacity(callCtx(t), &csi.GetCapacityRequest{})
		wantCode(t, err, codes.Internal, strings.Repeat("e", 1000), "more bytes")
		if n := len(status.Convert(err).Message()); n > 5<<10 {
			t.Fatalf("status message of %d bytes", n)
		}
	}
}

// TestModuleMemoryBudget: with the daemon's guest memory budget
// (memory_budget_pages) smaller than the module's cap, a guest that floods
// its memory fails its own call with RESOURCE_EXHAUSTED naming the budget,
// and the module serves the next call on a fresh instance.
func TestModuleMemoryBudget(t *testing.T) {
	g := newGate()
	o := daemonOptions{
		backend: "fault", wasm: filepath.Join("testdata", "fault.wasm"), hostcalls: []string{"test"},
		hostCalls:         []hostcalls.Func{g.hostCall()},
		limits:            config.Limits{MemoryPages: 512, CallTimeout: 5 * time.Second},
		memoryBudgetPages: 256, // 16 MiB; one module may hold 8
	}
	d := startDaemon(t, o)
	for i := range 2 {
		_, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: fmt.Sprintf("flood-%d", i), VolumeCapabilities: rwCaps()})
		wantCode(t, err, codes.ResourceExhausted, "guest memory budget exhausted", "8.0 MiB one module may hold")
		ok, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: fmt.Sprintf("ok-%d", i), VolumeCapabilities: rwCaps()})
		if err != nil {
			t.Fatalf("after the flood: %v", err)
		}
		if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: ok.GetVolume().GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNodeInfoOversizedContextLeftOut: beside localdir, the liar's node_info
// context (which would make the node ID 312 bytes) is left out of
// NodeGetInfo; localdir's topology is still reported and the node ID fits
// CSI's 256 bytes.
func TestNodeInfoOversizedContextLeftOut(t *testing.T) {
	n := &notes{}
	o := localdirOptions(t)
	o.more = []daemonModule{{name: "liar", wasm: filepath.Join("testdata", "liar.wasm"), hostcalls: []string{"test"}}}
	o.hostCalls = []hostcalls.Func{n.hostCall()}
	d := startDaemon(t, o)
	info, err := d.node().NodeGetInfo(callCtx(t), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if id := info.GetNodeId(); len(id) > 256 || strings.Contains(id, "aaaa") {
		t.Errorf("node ID of %d bytes: %q", len(id), id)
	}
	if seg := info.GetAccessibleTopology().GetSegments(); len(seg) == 0 {
		t.Errorf("localdir's topology is missing: %v", info.GetAccessibleTopology())
	}
}

// TestEphemeralIDTakenRefused: an inline volume whose create_volume answers
// the ID of a volume recorded for another name is refused like such a
// CreateVolume, with INTERNAL naming both, and the host never deletes
// through that ID: the undo of the failed publish would have deleted the
// recorded volume.
func TestEphemeralIDTakenRefused(t *testing.T) {
	d, n := startLiar(t)
	ctrl := d.controller()
	vol, err := ctrl.CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: "ephemeral-x+a", VolumeCapabilities: rwCaps()})
	if err != nil || vol.GetVolume().GetVolumeId() != "liar@test-node:ephemeral-x" {
		t.Fatalf("CreateVolume ephemeral-x+a: %v, %v", vol, err)
	}
	target := filepath.Join(t.TempDir(), "target")
	for range 2 { // a retry meets the same lie and the same answer
		_, err = d.node().NodePublishVolume(callCtx(t), ephemeralRequest("x+b", target, "", nil))
		wantCode(t, err, codes.Internal, `backend "liar"`, `"liar@test-node:ephemeral-x"`, `"ephemeral-x+b"`, `"ephemeral-x+a"`, "nothing was recorded or deleted")
	}
	if dels := n.take(); len(dels) != 0 {
		t.Fatalf("the host asked the module to delete %v after refusing its answer", dels)
	}
	got, err := ctrl.ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
	if err != nil || len(got.GetEntries()) != 1 || got.GetEntries()[0].GetVolume().GetVolumeId() != "liar@test-node:ephemeral-x" {
		t.Errorf("volumes after the refused inline volume: %v, %v", got, err)
	}
}

// TestModuleOversizedAnswersRefused: a volume_context, publish_context or
// snapshot context over CSI's 4 KiB and a topology CSI does not allow are
// refused with INTERNAL naming the backend and the field, and nothing of
// the answer is recorded; NodeGetInfo leaves such a topology out.
func TestModuleOversizedAnswersRefused(t *testing.T) {
	d := startDaemon(t, daemonOptions{backend: "bloat", wasm: filepath.Join("testdata", "bloat.wasm")})
	ctrl := d.controller()
	create := func(name string) error {
		_, err := ctrl.CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: rwCaps()})
		return err
	}
	wantCode(t, create("big"), codes.Internal, `backend "bloat"`, "volume_context", "4101 bytes")
	wantCode(t, create("topo"), codes.Internal, `backend "bloat"`, "accessible_topology", `"-bad-"`)
	if err := create("ok"); err != nil {
		t.Fatal(err)
	}
	vols, err := ctrl.ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
	if err != nil || len(vols.GetEntries()) != 1 || vols.GetEntries()[0].GetVolume().GetVolumeId() != "bloat:ok" {
		t.Fatalf("volumes after the refused creates: %v, %v", vols, err)
	}

	_, err = ctrl.CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "bloat:ok"})
	wantCode(t, err, codes.Internal, `backend "bloat"`, "snapshot context")
	if snaps, err := ctrl.ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{}); err != nil || len(snaps.GetEntries()) != 0 {
		t.Errorf("snapshots after the refused create: %v, %v", snaps, err)
	}

	info, err := d.node().NodeGetInfo(callCtx(t), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetAccessibleTopology() != nil {
		t.Errorf("NodeGetInfo topology %v: want the module's invalid one left out", info.GetAccessibleTopology())
	}
	_, err = ctrl.ControllerPublishVolume(callCtx(t), &csi.ControllerPublishVolumeRequest{VolumeId: "bloat:ok", NodeId: info.GetNodeId(), VolumeCapability: rwCaps()[0]})
	wantCode(t, err, codes.Internal, `backend "bloat"`, "publish_context")

	_, err = ctrl.ControllerExpandVolume(callCtx(t), &csi.ControllerExpandVolumeRequest{VolumeId: "bloat:ok", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
	wantCode(t, err, codes.Internal, `backend "bloat"`, "volume_context")
	vols, err = ctrl.ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
	if err != nil || len(vols.GetEntries()) != 1 {
		t.Fatalf("ListVolumes: %v, %v", vols, err)
	}
	if v, st := vols.GetEntries()[0].GetVolume(), vols.GetEntries()[0].GetStatus(); v.GetCapacityBytes() != 0 || len(v.GetVolumeContext()) != 0 || len(st.GetPublishedNodeIds()) != 0 {
		t.Errorf("volume after the refused publish and expansion: %v, %v", v, st)
	}
}
