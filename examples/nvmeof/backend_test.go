//go:build !wasip1

package main

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

func TestConfigure(t *testing.T) {
	tests := []struct {
		name  string
		cfg   map[string]string
		roots []string
		role  string
		code  abi.Code
	}{
		{"controller", map[string]string{configAddress: testAddress, configNQNPrefix: testSubs}, testRoots, "all", abi.OK},
		{"node needs nothing", nil, []string{testAddress}, "node", abi.OK},
		{"default port", map[string]string{configAddress: "192.0.2.5", configNQNPrefix: testSubs}, testRoots, "all", abi.OK},
		{"address not granted", map[string]string{configAddress: "192.0.2.6:4420", configNQNPrefix: testSubs}, testRoots, "all", abi.InvalidArgument},
		{"listen not granted", map[string]string{configAddress: testAddress, configListen: "0.0.0.0:4420", configNQNPrefix: testSubs}, testRoots, "all", abi.InvalidArgument},
		{"prefix not granted", map[string]string{configAddress: testAddress, configNQNPrefix: "nqn.2024-01.org.other:x."}, testRoots, "all", abi.InvalidArgument},
		{"prefix with comma", map[string]string{configAddress: testAddress, configNQNPrefix: testSubs + "a,b"}, testRoots, "all", abi.InvalidArgument},
		{"pool not granted", map[string]string{configAddress: testAddress, configNQNPrefix: testSubs, configPool: "/elsewhere"}, testRoots, "all", abi.InvalidArgument},
		{"no address", map[string]string{configNQNPrefix: testSubs}, testRoots, "controller", abi.InvalidArgument},
		{"no prefix", map[string]string{configAddress: testAddress}, testRoots, "controller", abi.InvalidArgument},
		{"unknown key", map[string]string{configAddress: testAddress, configNQNPrefix: testSubs, "portal": "x"}, testRoots, "all", abi.InvalidArgument},
		{"bad buffered_io", map[string]string{configAddress: testAddress, configNQNPrefix: testSubs, configBufferedIO: "maybe"}, testRoots, "all", abi.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := New()
			err := b.Configure(&abi.ConfigureRequest{Config: tc.cfg, Roots: tc.roots, NodeID: "n1", Role: tc.role})
			if abi.CodeOf(err) != tc.code {
				t.Fatalf("Configure = %v, want %v", err, tc.code)
			}
		})
	}
}

func ref(v *abi.CreateVolumeResponse) abi.VolumeRef {
	return abi.VolumeRef{LocalID: v.LocalID, Context: v.Context, CapacityBytes: v.CapacityBytes}
}

// TestLifecycle: a volume is its own subsystem that allows no host until
// ControllerPublish; the node connects, expands, and unpublish fences
// it; a publish after a reboot of the storage host serves the volume
// again; delete leaves nothing.
func TestLifecycle(t *testing.T) {
	s, b := newFakeFabric(t, nil)
	block := []abi.Capability{{Block: true, AccessMode: abi.AccessSingleNodeWriter}}
	v, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-1", RequiredBytes: 16 * sdk.MiB, Capabilities: block})
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-1", RequiredBytes: 16 * sdk.MiB, Capabilities: block})
	if err != nil || again.LocalID != v.LocalID {
		t.Fatalf("repeated create = %+v, %v", again, err)
	}
	sub := v.Context[ctxSubsystem]
	if sub != testSubs+v.LocalID || len(s.subs) != 1 || len(s.subs[sub].hosts) != 0 {
		t.Fatalf("after create: subsystem %q, subsystems %+v", sub, s.subs)
	}
	node, err := b.NodeInfo()
	if err != nil || node.Context[NodeContextHostNQN] != testHostNQN {
		t.Fatalf("node info %+v, %v", node, err)
	}
	if _, err := b.NodeStage(&abi.NodeStageRequest{Volume: ref(v), Capability: block[0]}); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("stage before publish = %v, want PERMISSION_DENIED", err)
	}
	pubReq := &abi.ControllerPublishRequest{Volume: ref(v), NodeID: "n1", NodeContext: node.Context}
	pub, err := b.ControllerPublish(pubReq)
	if err != nil {
		t.Fatal(err)
	}
	if pub.PublishContext[pubAddress] != testAddress || pub.PublishContext[pubSubsystem] != sub || pub.PublishContext[pubUUID] != v.Context[ctxUUID] {
		t.Fatalf("publish context %v", pub.PublishContext)
	}
	st, err := b.NodeStage(&abi.NodeStageRequest{Volume: ref(v), PublishContext: pub.PublishContext, Capability: block[0]})
	if err != nil || st.Device == "" {
		t.Fatalf("stage = %+v, %v", st, err)
	}
	exp, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 32 * sdk.MiB})
	if err != nil || exp.CapacityBytes != 32*sdk.MiB || !exp.NodeExpansionRequired || s.subs[sub].size != 32*sdk.MiB {
		t.Fatalf("expand = %+v, %v; namespace %d", exp, err, s.subs[sub].size)
	}
	nexp, err := b.NodeExpand(&abi.NodeExpandRequest{Volume: ref(v), RequiredBytes: 32 * sdk.MiB, StageContext: st.Context})
	if err != nil || nexp.CapacityBytes != 32*sdk.MiB {
		t.Fatalf("node expand = %+v, %v", nexp, err)
	}
	h, err := b.VolumeHealth(&abi.VolumeHealthRequest{Volume: ref(v), OnNode: true})
	if err != nil || len(h.Entries) != 0 {
		t.Fatalf("node health while connected = %+v, %v", h, err)
	}

	// The storage host rebooted: nvmet forgot the subsystem; health says
	// so and a publish serves it again with the node allowed.
	s.subs = map[string]*fakeSubsystem{}
	h, err = b.VolumeHealth(&abi.VolumeHealthRequest{Volume: ref(v)})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Reason != "NotExported" {
		t.Fatalf("controller health after a storage reboot = %+v, %v", h, err)
	}
	if _, err := b.ControllerPublish(pubReq); err != nil {
		t.Fatal(err)
	}
	if s.subs[sub] == nil || len(s.subs[sub].hosts) != 1 || s.subs[sub].size != 32*sdk.MiB {
		t.Fatalf("after a publish following a storage reboot: %+v", s.subs[sub])
	}

	// Unpublish fences the node: its controller ends and cannot return.
	for range 2 {
		if err := b.ControllerUnpublish(&abi.ControllerUnpublishRequest{Volume: ref(v), NodeID: "n1", NodeContext: node.Context}); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.subs[sub].hosts) != 0 || len(s.ctrls) != 0 {
		t.Fatalf("after unpublish: hosts %v, controllers %v", s.subs[sub].hosts, s.ctrls)
	}
	h, err = b.VolumeHealth(&abi.VolumeHealthRequest{Volume: ref(v), OnNode: true})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Reason != "ControllerLost" {
		t.Fatalf("node health after the fence = %+v, %v", h, err)
	}
	if _, err := b.NodeStage(&abi.NodeStageRequest{Volume: ref(v), PublishContext: pub.PublishContext, Capability: block[0]}); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("stage after unpublish = %v, want PERMISSION_DENIED", err)
	}
	if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: ref(v), StageContext: st.Context}); err != nil {
		t.Fatal(err)
	}

	// Snapshot, restore into a larger volume, clone.
	snap, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snap-1", Source: ref(v)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-2", RequiredBytes: 64 * sdk.MiB, Capabilities: block,
		Source: &abi.VolumeSource{Snapshot: &abi.SnapshotRef{LocalID: snap.LocalID, Context: snap.Context}}})
	if err != nil || r.CapacityBytes != 64*sdk.MiB || s.files[r.Context[ctxPath]] != 64*sdk.MiB {
		t.Fatalf("restore = %+v, %v", r, err)
	}
	c, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-3", RequiredBytes: 16 * sdk.MiB, Capabilities: block,
		Source: &abi.VolumeSource{Volume: &abi.VolumeRef{LocalID: v.LocalID, Context: v.Context}}})
	if err != nil || c.CapacityBytes != 32*sdk.MiB {
		t.Fatalf("clone = %+v, %v", c, err)
	}
	for _, x := range []*abi.CreateVolumeResponse{v, r, c} {
		for range 2 {
			if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref(x)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.DeleteSnapshot(&abi.DeleteSnapshotRequest{Snapshot: abi.SnapshotRef{LocalID: snap.LocalID, Context: snap.Context}}); err != nil {
		t.Fatal(err)
	}
	if len(s.subs) != 0 || len(s.files) != 0 {
		t.Fatalf("left after deleting everything: subsystems %v, files %v", s.subs, s.files)
	}
}

// TestBadInput: refusals create nothing.
func TestBadInput(t *testing.T) {
	s, b := newFakeFabric(t, nil)
	block := []abi.Capability{{Block: true, AccessMode: abi.AccessSingleNodeWriter}}
	for name, params := range map[string]map[string]string{
		"lvm source":    {paramSource: "lvm:fast"},
		"unknown param": {"pool": "/other"},
	} {
		_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: name, RequiredBytes: sdk.MiB, Capabilities: block, Parameters: params})
		if abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("%s: CreateVolume = %v, want INVALID_ARGUMENT", name, err)
		}
	}
	mount := []abi.Capability{{FsType: "xfs", AccessMode: abi.AccessSingleNodeWriter}}
	v, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "ext", RequiredBytes: 16 * sdk.MiB,
		Capabilities: []abi.Capability{{FsType: "ext4", AccessMode: abi.AccessSingleNodeWriter}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "as-xfs", RequiredBytes: 400 * sdk.MiB, Capabilities: mount,
		Source: &abi.VolumeSource{Volume: &abi.VolumeRef{LocalID: v.LocalID, Context: v.Context}}}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("clone of an ext4 volume as xfs = %v, want INVALID_ARGUMENT", err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "huge", RequiredBytes: 200 * sdk.GiB, Capabilities: block}); abi.CodeOf(err) != abi.OutOfRange {
		t.Fatalf("a volume beyond the pool = %v, want OUT_OF_RANGE", err)
	}
	if len(s.subs) != 1 || len(s.files) != 1 {
		t.Fatalf("refusals created something: subsystems %v, files %v", s.subs, s.files)
	}
	if _, err := b.ControllerPublish(&abi.ControllerPublishRequest{Volume: ref(v), NodeID: "n2"}); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("publish to a node without a host NQN = %v, want FAILED_PRECONDITION", err)
	}
}
