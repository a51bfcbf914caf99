//go:build !wasip1

package main

import (
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Native tests of the module's logic against fakePool (fake_test.go).

func TestConfigure(t *testing.T) {
	tests := []struct {
		name   string
		req    abi.ConfigureRequest
		code   abi.Code
		verify func(t *testing.T, c config)
	}{
		{name: "defaults", req: abi.ConfigureRequest{Roots: []string{"/pool/"}, NodeID: "n1"},
			verify: func(t *testing.T, c config) {
				want := config{pool: "/pool", nodeID: "n1", fsType: "ext4", directIO: true, granularity: sdk.MiB}
				if c != want {
					t.Errorf("config = %+v, want %+v", c, want)
				}
			}},
		{name: "every key", req: abi.ConfigureRequest{Roots: []string{"/p", "/other"}, NodeID: "n1",
			Config: map[string]string{"fs_type": "xfs", "prealloc": "true", "direct_io": "false", "granularity": "4Mi"}},
			verify: func(t *testing.T, c config) {
				want := config{pool: "/p", nodeID: "n1", fsType: "xfs", prealloc: true, granularity: 4 * sdk.MiB}
				if c != want {
					t.Errorf("config = %+v, want %+v", c, want)
				}
			}},
		{name: "no roots", req: abi.ConfigureRequest{NodeID: "n1"}, code: abi.InvalidArgument},
		{name: "relative root", req: abi.ConfigureRequest{Roots: []string{"pool"}, NodeID: "n1"}, code: abi.InvalidArgument},
		{name: "slash root", req: abi.ConfigureRequest{Roots: []string{"/"}, NodeID: "n1"}, code: abi.InvalidArgument},
		{name: "no node", req: abi.ConfigureRequest{Roots: []string{"/p"}}, code: abi.InvalidArgument},
		{name: "bad fs", req: abi.ConfigureRequest{Roots: []string{"/p"}, NodeID: "n1", Config: map[string]string{"fs_type": "zfs"}}, code: abi.InvalidArgument},
		{name: "bad bool", req: abi.ConfigureRequest{Roots: []string{"/p"}, NodeID: "n1", Config: map[string]string{"prealloc": "yes please"}}, code: abi.InvalidArgument},
		{name: "bad direct_io", req: abi.ConfigureRequest{Roots: []string{"/p"}, NodeID: "n1", Config: map[string]string{"direct_io": "2"}}, code: abi.InvalidArgument},
		{name: "granularity not 4k", req: abi.ConfigureRequest{Roots: []string{"/p"}, NodeID: "n1", Config: map[string]string{"granularity": "1000"}}, code: abi.InvalidArgument},
		{name: "granularity too big", req: abi.ConfigureRequest{Roots: []string{"/p"}, NodeID: "n1", Config: map[string]string{"granularity": "2Gi"}}, code: abi.InvalidArgument},
		{name: "typo", req: abi.ConfigureRequest{Roots: []string{"/p"}, NodeID: "n1", Config: map[string]string{"fstype": "xfs"}}, code: abi.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := New()
			err := b.Configure(&tc.req)
			if codeOf(err) != tc.code {
				t.Fatalf("Configure = %v, want code %v", err, tc.code)
			}
			if b.configured != (tc.code == abi.OK) {
				t.Errorf("configured = %v after %v", b.configured, err)
			}
			if tc.verify != nil {
				tc.verify(t, b.cfg)
			}
		})
	}
}

// TestInfo goes through sdk.Dispatch, as the guest glue does, and checks
// what the host reads at load.
func TestInfo(t *testing.T) {
	b := New()
	if _, code := sdk.Dispatch(b, abi.OpConfigure, (&abi.ConfigureRequest{Roots: []string{"/p"}, NodeID: "n1",
		Config: map[string]string{"fs_type": "btrfs", "granularity": "4Mi"}}).AppendWire(nil)); code != abi.OK {
		t.Fatalf("configure: %v", code)
	}
	out, code := sdk.Dispatch(b, abi.OpInfo, nil)
	if code != abi.OK {
		t.Fatalf("backend_info: %v %s", code, out)
	}
	var info abi.BackendInfo
	if err := info.UnmarshalWire(out); err != nil {
		t.Fatal(err)
	}
	if !info.Mount || !info.Block || !info.Clone || !info.Restore || !info.NodeExpansion || info.ExpandOffline {
		t.Errorf("access and features: %+v", info)
	}
	if info.DefaultFsType != "btrfs" || !slices.Equal(info.FsTypes, []string{"ext4", "xfs", "btrfs"}) {
		t.Errorf("fs types %v default %q", info.FsTypes, info.DefaultFsType)
	}
	if info.Granularity != 4*sdk.MiB || info.MinSizeBytes != 4*sdk.MiB || info.DefaultSizeBytes != sdk.GiB {
		t.Errorf("sizes: granularity %d min %d default %d", info.Granularity, info.MinSizeBytes, info.DefaultSizeBytes)
	}
	if !slices.Equal(info.AccessModes, []int64{1, 2, 6, 7}) || !slices.Equal(info.TopologyKeys, []string{TopologyKey}) {
		t.Errorf("modes %v topology keys %v", info.AccessModes, info.TopologyKeys)
	}
	for _, op := range []abi.Op{abi.OpCreateVolume, abi.OpExpandVolume, abi.OpCreateSnapshot, abi.OpGetCapacity,
		abi.OpVolumeHealth, abi.OpStorageHealth, abi.OpNodeInfo, abi.OpNodeStage, abi.OpNodeExpand, abi.OpSnapshotData} {
		if !slices.Contains(info.Ops, string(op)) {
			t.Errorf("Ops %v lacks %s", info.Ops, op)
		}
	}
	if !slices.Contains(info.Ops, string(abi.OpModifyVolume)) || !slices.Equal(info.MutableParameters, []string{"prealloc"}) {
		t.Errorf("Ops %v, mutable parameters %v: want modify_volume with prealloc", info.Ops, info.MutableParameters)
	}
	if slices.Contains(info.Ops, string(abi.OpControllerPublish)) {
		t.Errorf("Ops %v lists controller_publish, which loopfile does not need", info.Ops)
	}
}

func mountCap(fs string) abi.Capability {
	return abi.Capability{FsType: fs, AccessMode: abi.AccessSingleNodeWriter}
}

var blockCap = abi.Capability{Block: true, AccessMode: abi.AccessSingleNodeWriter}

func TestCreateVolumeSize(t *testing.T) {
	tests := []struct {
		name            string
		cfg             map[string]string
		caps            []abi.Capability
		required, limit int64
		want            int64
		code            abi.Code
	}{
		{name: "block keeps size", caps: []abi.Capability{blockCap}, required: 16 * sdk.MiB, want: 16 * sdk.MiB},
		{name: "ext4 default fs", caps: []abi.Capability{mountCap("")}, required: 16 * sdk.MiB, want: 16 * sdk.MiB},
		{name: "xfs rounds up to 300 MiB", caps: []abi.Capability{mountCap("xfs")}, required: 16 * sdk.MiB, want: 300 * sdk.MiB},
		{name: "btrfs rounds up to 109 MiB", caps: []abi.Capability{mountCap("btrfs")}, required: 16 * sdk.MiB, want: 109 * sdk.MiB},
		{name: "configured xfs default", cfg: map[string]string{"fs_type": "xfs"}, caps: []abi.Capability{mountCap("")}, required: sdk.MiB, want: 300 * sdk.MiB},
		{name: "xfs minimum in 64 MiB units", cfg: map[string]string{"granularity": "64Mi"}, caps: []abi.Capability{mountCap("xfs")}, required: 64 * sdk.MiB, want: 320 * sdk.MiB},
		{name: "mount and block", caps: []abi.Capability{blockCap, mountCap("xfs")}, required: sdk.MiB, want: 300 * sdk.MiB},
		{name: "xfs above limit", caps: []abi.Capability{mountCap("xfs")}, required: 16 * sdk.MiB, limit: 100 * sdk.MiB, code: abi.OutOfRange},
		{name: "xfs within limit", caps: []abi.Capability{mountCap("xfs")}, required: 16 * sdk.MiB, limit: 300 * sdk.MiB, want: 300 * sdk.MiB},
		{name: "default size", caps: []abi.Capability{blockCap}, want: sdk.GiB},
		{name: "unaligned request", caps: []abi.Capability{blockCap}, required: sdk.MiB + 1, want: 2 * sdk.MiB},
		{name: "unaligned limit", caps: []abi.Capability{blockCap}, required: sdk.MiB + 1, limit: sdk.MiB + 2, code: abi.OutOfRange},
		{name: "two filesystems", caps: []abi.Capability{mountCap("xfs"), mountCap("ext4")}, required: sdk.GiB, code: abi.InvalidArgument},
		{name: "unknown filesystem", caps: []abi.Capability{mountCap("zfs")}, required: sdk.GiB, code: abi.InvalidArgument},
		{name: "sparse larger than the pool", caps: []abi.Capability{blockCap}, required: 200 * sdk.GiB, code: abi.OutOfRange},
		{name: "preallocated without room", cfg: map[string]string{"prealloc": "true"}, caps: []abi.Capability{blockCap}, required: 60 * sdk.GiB, code: abi.ResourceExhausted},
		{name: "preallocated with room", cfg: map[string]string{"prealloc": "true"}, caps: []abi.Capability{blockCap}, required: 40 * sdk.GiB, want: 40 * sdk.GiB},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, b := newFakePool(t, tc.cfg)
			resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: tc.required, LimitBytes: tc.limit, Capabilities: tc.caps})
			if codeOf(err) != tc.code {
				t.Fatalf("CreateVolume = %v, want code %v", err, tc.code)
			}
			if err != nil {
				if len(p.files) != 0 {
					t.Errorf("failed create left files %v", p.files)
				}
				return
			}
			if resp.CapacityBytes != tc.want {
				t.Errorf("capacity %d, want %d", resp.CapacityBytes, tc.want)
			}
			if got := p.files[resp.Context[ctxPath]]; got != tc.want {
				t.Errorf("file %s has %d bytes, want %d (files %v)", resp.Context[ctxPath], got, tc.want, p.files)
			}
		})
	}
}

func TestCreateVolumeContextAndTopology(t *testing.T) {
	p, b := newFakePool(t, nil)
	resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-A", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{mountCap("")}})
	if err != nil {
		t.Fatal(err)
	}
	wantPath := "/pool/" + sdk.NameID("pvc-A", "vol") + ".img"
	if resp.LocalID != sdk.NameID("pvc-A", "vol") || resp.Context[ctxPath] != wantPath || p.files[wantPath] != 16*sdk.MiB {
		t.Errorf("local ID %q, context %v, files %v", resp.LocalID, resp.Context, p.files)
	}
	if resp.Context[ctxFsType] != "ext4" || resp.Context[ctxNode] != "n1" || resp.Context[ctxPrealloc] != "false" {
		t.Errorf("context %v", resp.Context)
	}
	if len(resp.Topology) != 1 || resp.Topology[0].Segments[TopologyKey] != "n1" || len(resp.Topology[0].Segments) != 1 {
		t.Errorf("topology %v", resp.Topology)
	}
	block, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "raw", RequiredBytes: sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := block.Context[ctxFsType]; ok {
		t.Errorf("block-only volume has fsType in its context %v", block.Context)
	}
}

func TestCreateVolumeRequisiteTopology(t *testing.T) {
	seg := func(kv ...string) abi.Topology {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return abi.Topology{Segments: m}
	}
	tests := []struct {
		name      string
		requisite []abi.Topology
		code      abi.Code
	}{
		{name: "none", code: abi.OK},
		{name: "this node", requisite: []abi.Topology{seg(TopologyKey, "n1")}},
		{name: "one of several", requisite: []abi.Topology{seg(TopologyKey, "n2"), seg(TopologyKey, "n1")}},
		{name: "other key only", requisite: []abi.Topology{seg("zone", "z1")}},
		{name: "this node and another key", requisite: []abi.Topology{seg(TopologyKey, "n1", "zone", "z1")}},
		{name: "other node", requisite: []abi.Topology{seg(TopologyKey, "n2")}, code: abi.ResourceExhausted},
		{name: "other nodes", requisite: []abi.Topology{seg(TopologyKey, "n2"), seg(TopologyKey, "n3", "zone", "z")}, code: abi.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, b := newFakePool(t, nil)
			_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: sdk.MiB, Capabilities: []abi.Capability{blockCap}, Requisite: tc.requisite})
			if codeOf(err) != tc.code {
				t.Fatalf("CreateVolume = %v, want %v", err, tc.code)
			}
			if want := map[abi.Code]int{abi.OK: 1}[tc.code]; len(p.files) != want {
				t.Errorf("files %v, want %d", p.files, want)
			}
		})
	}
}

func TestCreateVolumeIdempotent(t *testing.T) {
	p, b := newFakePool(t, nil)
	req := &abi.CreateVolumeRequest{Name: "pvc-1", RequiredBytes: 8 * sdk.MiB, Capabilities: []abi.Capability{mountCap("ext4")}}
	first, err := b.CreateVolume(req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.CreateVolume(req)
	if err != nil {
		t.Fatalf("repeat: %v", err)
	}
	if again.LocalID != first.LocalID || again.CapacityBytes != first.CapacityBytes || len(p.files) != 1 {
		t.Errorf("repeat gave %+v after %+v; files %v", again, first, p.files)
	}
	// The same name with another size finds the first file, whose answer
	// the module cannot know reached the CO (the host answers a repeat of
	// a recorded volume from its record): grown to the size asked, within
	// the limit.
	other := *req
	other.RequiredBytes = 16 * sdk.MiB
	if again, err := b.CreateVolume(&other); err != nil || again.LocalID != first.LocalID || again.CapacityBytes != 16*sdk.MiB || len(p.files) != 1 {
		t.Errorf("same name, other size: %+v, %v; files %v", again, err, p.files)
	}
	// Names whose slugs agree are different volumes.
	twin, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "PVC_1", RequiredBytes: 8 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	if twin.LocalID == first.LocalID || len(p.files) != 2 {
		t.Errorf("PVC_1 and pvc-1 share %q; files %v", twin.LocalID, p.files)
	}
}

func TestCreateVolumeParameters(t *testing.T) {
	tests := []struct {
		params       map[string]string
		code         abi.Code
		wantPrealloc string
	}{
		{params: nil, wantPrealloc: "false"},
		{params: map[string]string{"prealloc": "true"}, wantPrealloc: "true"},
		{params: map[string]string{"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "ns"}, wantPrealloc: "false"},
		{params: map[string]string{"prealloc": "maybe"}, code: abi.InvalidArgument},
		{params: map[string]string{"fsType": "xfs"}, code: abi.InvalidArgument},
	}
	for _, tc := range tests {
		p, b := newFakePool(t, nil)
		calls := p.mark()
		resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: sdk.MiB, Capabilities: []abi.Capability{blockCap}, Parameters: tc.params})
		if codeOf(err) != tc.code {
			t.Errorf("params %v: %v, want %v", tc.params, err, tc.code)
			continue
		}
		if err == nil && resp.Context[ctxPrealloc] != tc.wantPrealloc {
			t.Errorf("params %v: context %v", tc.params, resp.Context)
		}
		if err == nil && tc.wantPrealloc == "true" && calls() != "file_create file_stat" {
			t.Errorf("preallocated create made calls %q (no sparse bound check expected)", calls())
		}
	}
}

// snapshotOf cuts a snapshot through the backend and returns its ref.
func snapshotOf(t *testing.T, b *Backend, name string, vol *abi.CreateVolumeResponse) abi.SnapshotRef {
	t.Helper()
	src := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context, CapacityBytes: vol.CapacityBytes}
	sn, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: name, Source: src})
	if err != nil {
		t.Fatalf("snapshot %s: %v", name, err)
	}
	return abi.SnapshotRef{LocalID: sn.LocalID, Context: sn.Context, SizeBytes: sn.SizeBytes, Source: src}
}

func TestSnapshotsAndRestore(t *testing.T) {
	p, b := newFakePool(t, nil)
	vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "src", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{mountCap("ext4")}})
	if err != nil {
		t.Fatal(err)
	}
	snap := snapshotOf(t, b, "snap-1", vol)
	snapPath := "/pool/" + sdk.NameID("snap-1", "snap") + ".snap"
	if snap.Context[ctxPath] != snapPath || p.files[snapPath] != 16*sdk.MiB || snap.SizeBytes != 16*sdk.MiB {
		t.Fatalf("snapshot %+v; files %v", snap, p.files)
	}
	if snap.Context[ctxFsType] != "ext4" || snap.Context[ctxNode] != "n1" {
		t.Errorf("snapshot context %v", snap.Context)
	}
	// A repeat finds the snapshot's file.
	if again := snapshotOf(t, b, "snap-1", vol); again.LocalID != snap.LocalID {
		t.Errorf("repeat gave %q, then %q", snap.LocalID, again.LocalID)
	}
	data, err := b.SnapshotData(&abi.SnapshotDataRequest{Snapshot: snap})
	if err != nil || data.Path != snapPath || data.SizeBytes != 16*sdk.MiB || data.BlockSize != 4096 {
		t.Errorf("SnapshotData = %+v, %v", data, err)
	}

	// Restore, bigger than the snapshot: clone, then grow.
	calls := p.mark()
	restored, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "restored", RequiredBytes: 32 * sdk.MiB,
		Capabilities: []abi.Capability{mountCap("")}, Source: &abi.VolumeSource{Snapshot: &snap}})
	if err != nil {
		t.Fatal(err)
	}
	if restored.CapacityBytes != 32*sdk.MiB || calls() != "file_statfs file_stat file_clone file_stat file_resize file_stat" {
		t.Errorf("restore: %d bytes after calls %q", restored.CapacityBytes, calls())
	}
	// A restore repeated after a crash finds the clone.
	if again, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "restored", RequiredBytes: 32 * sdk.MiB,
		Capabilities: []abi.Capability{mountCap("")}, Source: &abi.VolumeSource{Snapshot: &snap}}); err != nil || again.LocalID != restored.LocalID {
		t.Errorf("repeated restore: %+v, %v", again, err)
	}
	// Clone of a volume, same size.
	srcRef := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}
	clone, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "clone", RequiredBytes: 16 * sdk.MiB,
		Capabilities: []abi.Capability{mountCap("ext4")}, Source: &abi.VolumeSource{Volume: &srcRef}})
	if err != nil || clone.CapacityBytes != 16*sdk.MiB {
		t.Fatalf("clone: %+v, %v", clone, err)
	}
	// A restore into another filesystem would never mount.
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "as-xfs", RequiredBytes: sdk.GiB,
		Capabilities: []abi.Capability{mountCap("xfs")}, Source: &abi.VolumeSource{Snapshot: &snap}}); codeOf(err) != abi.InvalidArgument {
		t.Errorf("restore of an ext4 snapshot as xfs: %v, want INVALID_ARGUMENT", err)
	}
	// A snapshot whose file is gone is NOT_FOUND.
	if err := b.DeleteSnapshot(&abi.DeleteSnapshotRequest{Snapshot: snap}); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.files[snapPath]; ok {
		t.Fatalf("snapshot file survived DeleteSnapshot")
	}
	if err := b.DeleteSnapshot(&abi.DeleteSnapshotRequest{Snapshot: snap}); err != nil {
		t.Errorf("second DeleteSnapshot: %v", err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "late", RequiredBytes: 16 * sdk.MiB,
		Capabilities: []abi.Capability{blockCap}, Source: &abi.VolumeSource{Snapshot: &snap}}); codeOf(err) != abi.NotFound {
		t.Errorf("restore of a deleted snapshot: %v, want NOT_FOUND", err)
	}
	if _, err := b.SnapshotData(&abi.SnapshotDataRequest{Snapshot: snap}); codeOf(err) != abi.NotFound {
		t.Errorf("SnapshotData of a deleted snapshot: %v, want NOT_FOUND", err)
	}
	// A restore replayed after its snapshot was deleted finds its own
	// file and needs the snapshot no more.
	if again, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "restored", RequiredBytes: 32 * sdk.MiB,
		Capabilities: []abi.Capability{mountCap("")}, Source: &abi.VolumeSource{Snapshot: &snap}}); err != nil || again.LocalID != restored.LocalID {
		t.Errorf("restore replayed after its snapshot's deletion: %+v, %v", again, err)
	}
}

// A create repeated (start-up's replay) after an expansion grew the
// volume's file finds the file and keeps it as it is; a repeat asking for
// more grows it.
func TestCreateFindsExpandedFile(t *testing.T) {
	p, b := newFakePool(t, nil)
	req := &abi.CreateVolumeRequest{Name: "grown", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}}
	vol, err := b.CreateVolume(req)
	if err != nil {
		t.Fatal(err)
	}
	path := vol.Context[ctxPath]
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}, RequiredBytes: 32 * sdk.MiB}); err != nil {
		t.Fatal(err)
	}
	again, err := b.CreateVolume(req)
	if err != nil || again.LocalID != vol.LocalID || again.CapacityBytes != 32*sdk.MiB || p.files[path] != 32*sdk.MiB {
		t.Fatalf("create repeated after an expansion: %+v, %v; file %d bytes", again, err, p.files[path])
	}
	req.RequiredBytes = 48 * sdk.MiB
	if again, err = b.CreateVolume(req); err != nil || again.CapacityBytes != 48*sdk.MiB || p.files[path] != 48*sdk.MiB {
		t.Fatalf("repeat asking for more: %+v, %v; file %d bytes", again, err, p.files[path])
	}
	req.RequiredBytes, req.LimitBytes = 16*sdk.MiB, 16*sdk.MiB
	if _, err := b.CreateVolume(req); codeOf(err) != abi.OutOfRange {
		t.Errorf("repeat with a limit below the file: %v, want OUT_OF_RANGE", err)
	}
}

func TestCloneGrowFailureLeavesNothing(t *testing.T) {
	p, b := newFakePool(t, nil)
	vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "src", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	p.failResize = abi.ResourceExhausted
	src := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "big-clone", RequiredBytes: 64 * sdk.MiB,
		Capabilities: []abi.Capability{blockCap}, Source: &abi.VolumeSource{Volume: &src}})
	if codeOf(err) != abi.ResourceExhausted {
		t.Fatalf("clone with failing grow: %v, want RESOURCE_EXHAUSTED", err)
	}
	if len(p.files) != 1 {
		t.Errorf("failed clone left files %v", p.files)
	}
}

func TestDeleteVolume(t *testing.T) {
	p, b := newFakePool(t, nil)
	vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}
	p.attached[vol.Context[ctxPath]] = "/dev/loop9"
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref}); codeOf(err) != abi.FailedPrecondition {
		t.Errorf("delete of an attached volume: %v, want FAILED_PRECONDITION", err)
	}
	delete(p.attached, vol.Context[ctxPath])
	for i := range 2 {
		if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref}); err != nil {
			t.Errorf("delete #%d: %v", i+1, err)
		}
	}
	if len(p.files) != 0 {
		t.Errorf("files left: %v", p.files)
	}
	// An ID loopfile never issued names no file: nothing to delete.
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: "Not.Ours"}}); err != nil {
		t.Errorf("delete of a foreign ID: %v", err)
	}
	// A context path that names another file is refused.
	bad := abi.VolumeRef{LocalID: vol.LocalID, Context: map[string]string{ctxPath: "/pool/other.img"}}
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: bad}); codeOf(err) != abi.InvalidArgument {
		t.Errorf("delete with a context path of another file: %v, want INVALID_ARGUMENT", err)
	}
}

func TestExpandVolume(t *testing.T) {
	tests := []struct {
		name            string
		cfg             map[string]string
		required, limit int64
		want            int64
		code            abi.Code
	}{
		{name: "grow", required: 64 * sdk.MiB, want: 64 * sdk.MiB},
		{name: "grow unaligned", required: 64*sdk.MiB + 1, want: 65 * sdk.MiB},
		{name: "no smaller", required: 8 * sdk.MiB, want: 16 * sdk.MiB},
		{name: "limit", required: 64*sdk.MiB + 1, limit: 64*sdk.MiB + 2, code: abi.OutOfRange},
		{name: "beyond the pool", required: 101 * sdk.GiB, code: abi.OutOfRange},
		{name: "preallocated", cfg: map[string]string{"prealloc": "true"}, required: 40 * sdk.GiB, want: 40 * sdk.GiB},
		{name: "preallocated without room", cfg: map[string]string{"prealloc": "true"}, required: 60 * sdk.GiB, code: abi.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, b := newFakePool(t, tc.cfg)
			vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context},
				RequiredBytes: tc.required, LimitBytes: tc.limit})
			if codeOf(err) != tc.code {
				t.Fatalf("ExpandVolume = %v, want %v", err, tc.code)
			}
			if err != nil {
				return
			}
			if resp.CapacityBytes != tc.want || !resp.NodeExpansionRequired || p.files[vol.Context[ctxPath]] != tc.want {
				t.Errorf("expand: %+v, file %d bytes, want %d", resp, p.files[vol.Context[ctxPath]], tc.want)
			}
		})
	}
}

// TestModifyVolumePrealloc: prealloc=true allocates the whole file and
// is kept in the context, so later expansions preallocate; prealloc=false
// only changes what later expansions do; a bad value or a pool without
// room changes nothing.
func TestModifyVolumePrealloc(t *testing.T) {
	p, b := newFakePool(t, nil)
	vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	path := vol.Context[ctxPath]
	ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context, CapacityBytes: vol.CapacityBytes}
	modify := func(v string) (*abi.ModifyVolumeResponse, error) {
		return b.ModifyVolume(&abi.ModifyVolumeRequest{Volume: ref, MutableParameters: map[string]string{"prealloc": v}})
	}
	if _, err := modify("maybe"); codeOf(err) != abi.InvalidArgument || p.alloc[path] != 0 {
		t.Fatalf("prealloc=maybe: %v, %d bytes allocated", err, p.alloc[path])
	}
	avail := p.avail
	p.avail = sdk.MiB
	if _, err := modify("true"); codeOf(err) != abi.ResourceExhausted || p.alloc[path] != 0 {
		t.Fatalf("prealloc=true without room: %v, %d bytes allocated", err, p.alloc[path])
	}
	p.avail = avail
	resp, err := modify("true")
	if err != nil || p.alloc[path] != 16*sdk.MiB || resp.Context[ctxPrealloc] != "true" || resp.Context[ctxPath] != path {
		t.Fatalf("prealloc=true: %+v, %v, %d bytes allocated", resp, err, p.alloc[path])
	}
	ref.Context = resp.Context
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref, RequiredBytes: 32 * sdk.MiB}); err != nil || p.alloc[path] != 32*sdk.MiB {
		t.Fatalf("expand after prealloc=true: %v, %d bytes allocated", err, p.alloc[path])
	}
	if resp, err = modify("false"); err != nil || resp.Context[ctxPrealloc] != "false" || p.alloc[path] != 32*sdk.MiB {
		t.Fatalf("prealloc=false: %+v, %v, %d bytes allocated", resp, err, p.alloc[path])
	}
	ref.Context = resp.Context
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref, RequiredBytes: 48 * sdk.MiB}); err != nil || p.alloc[path] != 32*sdk.MiB {
		t.Fatalf("expand after prealloc=false: %v, %d bytes allocated", err, p.alloc[path])
	}

	// Mutable parameters at creation win over the StorageClass's.
	made, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "w", RequiredBytes: 8 * sdk.MiB, Capabilities: []abi.Capability{blockCap},
		Parameters: map[string]string{"prealloc": "false"}, MutableParameters: map[string]string{"prealloc": "true"}})
	if err != nil || made.Context[ctxPrealloc] != "true" || p.alloc[made.Context[ctxPath]] != 8*sdk.MiB {
		t.Fatalf("create with mutable prealloc=true: %+v, %v", made, err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "x", RequiredBytes: 8 * sdk.MiB, Capabilities: []abi.Capability{blockCap},
		MutableParameters: map[string]string{"prealloc": "1x"}}); codeOf(err) != abi.InvalidArgument {
		t.Fatalf("create with mutable prealloc=1x: %v", err)
	}
}

func TestGetCapacity(t *testing.T) {
	tests := []struct {
		name     string
		cfg      map[string]string
		req      abi.GetCapacityRequest
		want     abi.GetCapacityResponse
		wantCode abi.Code
	}{
		{name: "sparse", want: abi.GetCapacityResponse{AvailableBytes: 50 * sdk.GiB, MaximumVolumeSize: 100 * sdk.GiB, MinimumVolumeSize: sdk.MiB}},
		{name: "preallocated", cfg: map[string]string{"prealloc": "true"}, want: abi.GetCapacityResponse{AvailableBytes: 50 * sdk.GiB, MaximumVolumeSize: 50 * sdk.GiB, MinimumVolumeSize: sdk.MiB}},
		{name: "prealloc parameter", req: abi.GetCapacityRequest{Parameters: map[string]string{"prealloc": "true"}},
			want: abi.GetCapacityResponse{AvailableBytes: 50 * sdk.GiB, MaximumVolumeSize: 50 * sdk.GiB, MinimumVolumeSize: sdk.MiB}},
		{name: "xfs minimum", req: abi.GetCapacityRequest{Capability: &abi.Capability{FsType: "xfs"}},
			want: abi.GetCapacityResponse{AvailableBytes: 50 * sdk.GiB, MaximumVolumeSize: 100 * sdk.GiB, MinimumVolumeSize: 300 * sdk.MiB}},
		{name: "default fs minimum", cfg: map[string]string{"fs_type": "btrfs"}, req: abi.GetCapacityRequest{Capability: &abi.Capability{}},
			want: abi.GetCapacityResponse{AvailableBytes: 50 * sdk.GiB, MaximumVolumeSize: 100 * sdk.GiB, MinimumVolumeSize: 109 * sdk.MiB}},
		{name: "this node", req: abi.GetCapacityRequest{Topology: &abi.Topology{Segments: map[string]string{TopologyKey: "n1"}}},
			want: abi.GetCapacityResponse{AvailableBytes: 50 * sdk.GiB, MaximumVolumeSize: 100 * sdk.GiB, MinimumVolumeSize: sdk.MiB}},
		{name: "other node", req: abi.GetCapacityRequest{Topology: &abi.Topology{Segments: map[string]string{TopologyKey: "n2"}}}},
		{name: "bad parameter", req: abi.GetCapacityRequest{Parameters: map[string]string{"speed": "fast"}}, wantCode: abi.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, b := newFakePool(t, tc.cfg)
			got, err := b.GetCapacity(&tc.req)
			if codeOf(err) != tc.wantCode {
				t.Fatalf("GetCapacity = %v, want %v", err, tc.wantCode)
			}
			if err == nil && *got != tc.want {
				t.Errorf("GetCapacity = %+v, want %+v", *got, tc.want)
			}
		})
	}
	// Free space that is not a whole unit is rounded down.
	p, b := newFakePool(t, map[string]string{"prealloc": "true"})
	p.avail = 3*sdk.MiB + 5
	if got, err := b.GetCapacity(&abi.GetCapacityRequest{}); err != nil || got.AvailableBytes != 3*sdk.MiB || got.MaximumVolumeSize != 3*sdk.MiB {
		t.Errorf("GetCapacity with %d free = %+v, %v", p.avail, got, err)
	}
	// No room for even the smallest preallocated volume: no maximum.
	p.avail = 4096
	if got, err := b.GetCapacity(&abi.GetCapacityRequest{}); err != nil || got.AvailableBytes != 0 || got.MaximumVolumeSize != 0 || got.MinimumVolumeSize != 0 {
		t.Errorf("GetCapacity with %d free = %+v, %v", p.avail, got, err)
	}
}

func TestNodeStageUnstage(t *testing.T) {
	tests := []struct {
		name         string
		cfg          map[string]string
		mode         abi.AccessMode
		wantReadOnly bool
		wantDirectIO bool
	}{
		{name: "writer", mode: abi.AccessSingleNodeWriter, wantDirectIO: true},
		{name: "single writer", mode: abi.AccessSingleNodeSingleWriter, wantDirectIO: true},
		{name: "multi writer", mode: abi.AccessSingleNodeMultiWriter, wantDirectIO: true},
		{name: "reader only", mode: abi.AccessSingleNodeReadOnly, wantReadOnly: true, wantDirectIO: true},
		{name: "buffered", cfg: map[string]string{"direct_io": "false"}, mode: abi.AccessSingleNodeWriter},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, b := newFakePool(t, tc.cfg)
			vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{mountCap("")}})
			if err != nil {
				t.Fatal(err)
			}
			ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}
			path := vol.Context[ctxPath]
			req := &abi.NodeStageRequest{Volume: ref, StagingPath: "/staging", Capability: abi.Capability{AccessMode: tc.mode}}
			st, err := b.NodeStage(req)
			if err != nil {
				t.Fatal(err)
			}
			if st.Device == "" || st.Directory != "" || st.Context[stageDevice] != st.Device {
				t.Errorf("NodeStage = %+v", st)
			}
			if p.attached[path] != st.Device || p.readOnly[path] != tc.wantReadOnly || p.directIO[path] != tc.wantDirectIO {
				t.Errorf("attached %v read-only %v direct %v", p.attached, p.readOnly[path], p.directIO[path])
			}
			// Staging again (a restart) answers the same device.
			if again, err := b.NodeStage(req); err != nil || again.Device != st.Device || len(p.attached) != 1 {
				t.Errorf("re-stage = %+v, %v; attached %v", again, err, p.attached)
			}
			if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: ref, Device: st.Device, StageContext: st.Context}); err != nil {
				t.Fatal(err)
			}
			if len(p.attached) != 0 {
				t.Errorf("still attached after unstage: %v", p.attached)
			}
			if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: ref, Device: st.Device, StageContext: st.Context}); err != nil {
				t.Errorf("second unstage: %v", err)
			}
		})
	}
}

// TestNodeUnstageAfterReboot: the recorded device now backs another
// volume; unstage must detach the device of its own file only.
func TestNodeUnstageAfterReboot(t *testing.T) {
	p, b := newFakePool(t, nil)
	var refs []abi.VolumeRef
	for _, name := range []string{"a", "b"} {
		vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: name, RequiredBytes: sdk.MiB, Capabilities: []abi.Capability{blockCap}})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context})
	}
	// "a" was staged on /dev/loop0 before the reboot; now "b" has it and
	// "a" is attached nowhere.
	other, err := b.NodeStage(&abi.NodeStageRequest{Volume: refs[1], Capability: blockCap})
	if err != nil {
		t.Fatal(err)
	}
	calls := p.mark()
	if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: refs[0], Device: other.Device}); err != nil {
		t.Fatal(err)
	}
	if p.attached[refs[1].Context[ctxPath]] != other.Device || calls() != "loop_find" {
		t.Errorf("unstage of a detached volume touched another: attached %v, calls %q", p.attached, calls())
	}
}

func TestNodeStageOtherNode(t *testing.T) {
	_, b := newFakePool(t, nil)
	ref := abi.VolumeRef{LocalID: sdk.NameID("v", "vol"), Context: map[string]string{ctxNode: "n2", ctxPath: "/pool/" + sdk.NameID("v", "vol") + ".img"}}
	if _, err := b.NodeStage(&abi.NodeStageRequest{Volume: ref, Capability: blockCap}); codeOf(err) != abi.FailedPrecondition {
		t.Errorf("stage of another node's volume: %v, want FAILED_PRECONDITION", err)
	}
}

func TestNodeExpand(t *testing.T) {
	p, b := newFakePool(t, nil)
	vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}
	if _, err := b.NodeExpand(&abi.NodeExpandRequest{Volume: ref, RequiredBytes: 32 * sdk.MiB}); codeOf(err) != abi.NotFound {
		t.Errorf("NodeExpand of a detached volume: %v, want NOT_FOUND", err)
	}
	st, err := b.NodeStage(&abi.NodeStageRequest{Volume: ref, Capability: blockCap})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.NodeExpand(&abi.NodeExpandRequest{Volume: ref, Device: st.Device, RequiredBytes: 32 * sdk.MiB}); codeOf(err) != abi.FailedPrecondition {
		t.Errorf("NodeExpand before ControllerExpand: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref, RequiredBytes: 32 * sdk.MiB}); err != nil {
		t.Fatal(err)
	}
	resp, err := b.NodeExpand(&abi.NodeExpandRequest{Volume: ref, Device: st.Device, RequiredBytes: 32 * sdk.MiB})
	if err != nil || resp.CapacityBytes != 32*sdk.MiB || p.devSize[st.Device] != 32*sdk.MiB {
		t.Errorf("NodeExpand = %+v, %v; device shows %d", resp, err, p.devSize[st.Device])
	}
}

func TestVolumeHealth(t *testing.T) {
	p, b := newFakePool(t, nil)
	vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context, CapacityBytes: vol.CapacityBytes}
	path := vol.Context[ctxPath]
	tests := []struct {
		name   string
		setup  func()
		req    abi.VolumeHealthRequest
		reason string
	}{
		{name: "controller healthy", req: abi.VolumeHealthRequest{Volume: ref}},
		{name: "controller truncated", setup: func() { p.files[path] = 8 * sdk.MiB }, req: abi.VolumeHealthRequest{Volume: ref}, reason: "VolumeFileTruncated"},
		{name: "controller missing", setup: func() { delete(p.files, path) }, req: abi.VolumeHealthRequest{Volume: ref}, reason: "VolumeFileMissing"},
		{name: "node detached", req: abi.VolumeHealthRequest{Volume: ref, OnNode: true, Device: "/dev/loop0"}, reason: "LoopDeviceDetached"},
		{name: "node healthy", setup: func() { p.attached[path] = "/dev/loop0" }, req: abi.VolumeHealthRequest{Volume: ref, OnNode: true, Device: "/dev/loop0"}},
		{name: "node device changed", setup: func() { p.attached[path] = "/dev/loop3" }, req: abi.VolumeHealthRequest{Volume: ref, OnNode: true, Device: "/dev/loop0"}, reason: "LoopDeviceChanged"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p.files[path] = 16 * sdk.MiB
			delete(p.attached, path)
			if tc.setup != nil {
				tc.setup()
			}
			got, err := b.VolumeHealth(&tc.req)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.reason == "" && len(got.Entries) != 0:
				t.Errorf("healthy volume reported %+v", got.Entries)
			case tc.reason != "" && (len(got.Entries) != 1 || got.Entries[0].Reason != tc.reason):
				t.Errorf("entries %+v, want reason %s", got.Entries, tc.reason)
			}
		})
	}
}

func TestStorageHealth(t *testing.T) {
	p, b := newFakePool(t, nil)
	if got, err := b.StorageHealth(); err != nil || len(got.Entries) != 0 {
		t.Errorf("healthy pool: %+v, %v", got, err)
	}
	p.avail = 0
	if got, err := b.StorageHealth(); err != nil || len(got.Entries) != 1 || got.Entries[0].Reason != "PoolFull" {
		t.Errorf("full pool: %+v, %v", got, err)
	}
}

func TestNodeInfo(t *testing.T) {
	_, b := newFakePool(t, nil)
	got, err := b.NodeInfo()
	if err != nil || got.Topology == nil || got.Topology.Segments[TopologyKey] != "n1" {
		t.Errorf("NodeInfo = %+v, %v", got, err)
	}
}

// TestUnconfigured: an instance the host never configured answers
// UNAVAILABLE where it needs the pool or node, and serves volumes whose
// context names their file.
func TestUnconfigured(t *testing.T) {
	p, configured := newFakePool(t, nil)
	vol, err := configured.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}
	b := New()
	for name, err := range map[string]error{
		"CreateVolume": second(b.CreateVolume(&abi.CreateVolumeRequest{Name: "w", RequiredBytes: sdk.MiB, Capabilities: []abi.Capability{blockCap}})),
		"GetCapacity":  second(b.GetCapacity(&abi.GetCapacityRequest{})),
		"NodeInfo":     second(b.NodeInfo()),
		"bare ref":     b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: vol.LocalID}}),
	} {
		if codeOf(err) != abi.Unavailable {
			t.Errorf("%s on an unconfigured instance: %v, want UNAVAILABLE", name, err)
		}
	}
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref, RequiredBytes: 32 * sdk.MiB}); err != nil {
		t.Errorf("ExpandVolume by context: %v", err)
	}
	if _, err := b.NodeStage(&abi.NodeStageRequest{Volume: ref, Capability: blockCap}); err != nil {
		t.Errorf("NodeStage by context: %v", err)
	}
	if !p.directIO[vol.Context[ctxPath]] {
		t.Errorf("unconfigured instance dropped the default direct I/O")
	}
}

func second[T any](_ T, err error) error { return err }
