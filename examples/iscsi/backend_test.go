//go:build !wasip1

package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Native tests of the module's logic against fakeSAN (fake_test.go).

func TestConfigure(t *testing.T) {
	base := map[string]string{configPortal: testPortal, configTargetIQN: testTarget}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	tests := []struct {
		name  string
		role  string
		roots []string
		cfg   map[string]string
		code  abi.Code
		check func(t *testing.T, c config)
	}{
		{"defaults", "all", testRoots, base, abi.OK, func(t *testing.T, c config) {
			if c.pool != "/pool" || c.portal != testPortal || !slices.Equal(c.listen, []string{testPortal}) || c.fsType != "ext4" || c.chap != nil {
				t.Errorf("config %+v", c)
			}
		}},
		{"portal without port", "all", testRoots, with(configPortal, "192.0.2.5"), abi.OK, func(t *testing.T, c config) {
			if c.portal != testPortal {
				t.Errorf("portal %q, want %q", c.portal, testPortal)
			}
		}},
		{"listen on a wildcard", "all", append(slices.Clone(testRoots), "0.0.0.0:3260"), with(configListen, "0.0.0.0:3260, 192.0.2.5:3260"), abi.OK, func(t *testing.T, c config) {
			if !slices.Equal(c.listen, []string{"0.0.0.0:3260", testPortal}) {
				t.Errorf("listen %v", c.listen)
			}
		}},
		{"IPv6 portal", "all", []string{"/pool", testPrefix, "[FD00::5]:3260"}, with(configPortal, "[fd00::5]"), abi.OK, func(t *testing.T, c config) {
			if c.portal != "[fd00::5]:3260" {
				t.Errorf("portal %q", c.portal)
			}
		}},
		{"chap and fs", "all", testRoots, with(configChapUser, "user1", configChapSecret, "secret123456", configFsType, "xfs"), abi.OK, func(t *testing.T, c config) {
			if c.chap == nil || c.chap.user != "user1" || c.chap.secret != "secret123456" || c.fsType != "xfs" {
				t.Errorf("config %+v", c)
			}
		}},
		{"explicit pool", "all", []string{"/a", "/b/", testPrefix, testPortal}, with(configPool, "/b"), abi.OK, func(t *testing.T, c config) {
			if c.pool != "/b" {
				t.Errorf("pool %q", c.pool)
			}
		}},
		{"node needs nothing", "node", []string{testPortal}, map[string]string{}, abi.OK, nil},
		{"node with CHAP", "node", nil, map[string]string{configChapUser: "u", configChapSecret: "secret123456"}, abi.OK, nil},
		{"controller without portal", "controller", testRoots, with(configPortal, ""), abi.InvalidArgument, nil},
		{"controller without target", "controller", testRoots, with(configTargetIQN, ""), abi.InvalidArgument, nil},
		{"no folder root", "all", []string{testPrefix, testPortal}, base, abi.InvalidArgument, nil},
		{"portal not granted", "all", testRoots, with(configPortal, "192.0.2.6:3260"), abi.InvalidArgument, nil},
		{"portal with another port", "all", testRoots, with(configPortal, "192.0.2.5:3261"), abi.InvalidArgument, nil},
		{"portal a host name", "all", testRoots, with(configPortal, "san.example:3260"), abi.InvalidArgument, nil},
		{"listen not granted", "all", testRoots, with(configListen, "0.0.0.0:3260"), abi.InvalidArgument, nil},
		{"target outside the prefixes", "all", testRoots, with(configTargetIQN, "iqn.2024-01.dev.other:pool"), abi.InvalidArgument, nil},
		{"target is the prefix", "all", []string{"/pool", testTarget, testPortal}, base, abi.InvalidArgument, nil},
		{"target in upper case", "all", testRoots, with(configTargetIQN, testPrefix+"Pool"), abi.InvalidArgument, nil},
		{"pool not a root", "all", testRoots, with(configPool, "/pool/sub"), abi.InvalidArgument, nil},
		{"pool relative", "all", testRoots, with(configPool, "pool"), abi.InvalidArgument, nil},
		{"half CHAP", "all", testRoots, with(configChapUser, "user1"), abi.InvalidArgument, nil},
		{"short CHAP secret", "all", testRoots, with(configChapUser, "user1", configChapSecret, "short-s3cr"), abi.InvalidArgument, nil},
		{"CHAP secret with a space", "all", testRoots, with(configChapUser, "user1", configChapSecret, "secret 123456"), abi.InvalidArgument, nil},
		{"unknown fs", "all", testRoots, with(configFsType, "zfs"), abi.InvalidArgument, nil},
		{"unknown key", "all", testRoots, with("portals", testPortal), abi.InvalidArgument, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := New()
			err := b.Configure(&abi.ConfigureRequest{Config: tc.cfg, Roots: tc.roots, NodeID: "n1", Role: tc.role})
			if abi.CodeOf(err) != tc.code {
				t.Fatalf("Configure = %v, want %v", err, tc.code)
			}
			if err != nil {
				if s := tc.cfg[configChapSecret]; s != "" && strings.Contains(err.Error(), s) {
					t.Fatalf("error %q shows the CHAP secret", err)
				}
				if b.configured {
					t.Fatal("a refused configuration was kept")
				}
				return
			}
			if tc.check != nil {
				tc.check(t, b.cfg)
			}
		})
	}
}

func TestInfo(t *testing.T) {
	_, b := newFakeSAN(t, map[string]string{configFsType: "xfs"})
	info := b.Info()
	if info.DefaultFsType != "xfs" || !info.Mount || !info.Block || !info.Clone || !info.Restore || !info.NodeExpansion {
		t.Errorf("info %+v", info)
	}
	if len(info.TopologyKeys) != 0 {
		t.Errorf("iSCSI volumes are reachable from any node, yet topology keys %v", info.TopologyKeys)
	}
	for _, m := range info.AccessModes {
		if m == int64(abi.AccessMultiNodeMultiWriter) || m == int64(abi.AccessMultiNodeReadOnly) || m == int64(abi.AccessMultiNodeSingleWriter) {
			t.Errorf("multi-node mode %d offered: a LUN under a local filesystem is single-node", m)
		}
	}
	want := []string{"backend_info", "configure", "create_volume", "delete_volume", "expand_volume", "create_snapshot",
		"delete_snapshot", "get_capacity", "controller_publish", "controller_unpublish", "volume_health", "modify_volume",
		"node_info", "node_stage", "node_unstage", "node_expand", "storage_health"}
	if got := sdk.Ops(b); !slices.Equal(got, want) {
		t.Errorf("ops %v\nwant %v", got, want)
	}
	if !slices.Equal(info.MutableParameters, []string{"writeCache"}) {
		t.Errorf("mutable parameters %v, want writeCache", info.MutableParameters)
	}
}

func TestNames(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"pvc-1", "PVC_1", "", "日本語", strings.Repeat("x", 300), "sanity-" + strings.Repeat("9", 60)} {
		id := sdk.NameID(name, "vol")
		if !sdk.ValidNameID(id) {
			t.Errorf("sdk.NameID(%q) = %q: not valid", name, id)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%q and %q share name ID %q", other, name, id)
		}
		seen[id] = name
		order := lunOrder(id)
		sorted := slices.Clone(order[:])
		slices.Sort(sorted)
		for i, l := range sorted {
			if l != i {
				t.Fatalf("lunOrder(%q) is not a permutation of 0..255: %v", id, order)
			}
		}
		if lunOrder(id) != order {
			t.Fatalf("lunOrder(%q) is not deterministic", id)
		}
		for _, lun := range []int{0, 7, 255} {
			vid := volumeID(id, lun)
			n, l, ok := parseVolumeID(vid)
			if !ok || n != id || l != lun {
				t.Errorf("parseVolumeID(%q) = %q, %d, %v", vid, n, l, ok)
			}
		}
	}
	for _, bad := range []string{"", "x", "pvc-1.256", "pvc-1.07", "pvc-1.-1", ".3", "Pvc.3", "a/b.3", "pvc-1.3.img"} {
		if _, _, ok := parseVolumeID(bad); ok {
			t.Errorf("parseVolumeID(%q) accepted", bad)
		}
	}
}

func TestCanonicalPortal(t *testing.T) {
	tests := map[string]string{
		"192.0.2.5:3260": "192.0.2.5:3260",
		"192.0.2.5":      "192.0.2.5:3260",
		"10.0.0.1:860":   "10.0.0.1:860",
		"[FD00::1]":      "[fd00::1]:3260",
		"[fd00::1]:3261": "[fd00::1]:3261",
		"0.0.0.0:3260":   "0.0.0.0:3260",
		"192.0.2.5:0":    "",
		"192.0.2.5:":     "",
		"192.0.2.05":     "",
		"192.0.2":        "",
		"256.0.0.1":      "",
		"fd00::1":        "",
		"[192.0.2.5]":    "",
		"[fd00::1]x":     "",
		"host:3260":      "",
		"":               "",
	}
	for in, want := range tests {
		got, ok := canonicalPortal(in)
		if got != want || ok != (want != "") {
			t.Errorf("canonicalPortal(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// createVolume creates a mount volume of size bytes and fails the test on
// an error.
func createVolume(t *testing.T, b *Backend, name string, size int64) *abi.CreateVolumeResponse {
	t.Helper()
	resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: name, RequiredBytes: size, Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}}})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp
}

func ref(r *abi.CreateVolumeResponse) abi.VolumeRef {
	return abi.VolumeRef{LocalID: r.LocalID, Context: r.Context, CapacityBytes: r.CapacityBytes}
}

func TestCreateVolume(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	since := s.mark()
	v := createVolume(t, b, "pvc-1", 64*sdk.MiB)
	nameID := sdk.NameID("pvc-1", "vol")
	first := lunOrder(nameID)[0]
	if v.LocalID != volumeID(nameID, first) || v.CapacityBytes != 64*sdk.MiB {
		t.Fatalf("volume %+v, want ID %s of 64 MiB", v, volumeID(nameID, first))
	}
	path := "/pool/" + v.LocalID + ".img"
	want := map[string]string{ctxTarget: testTarget, ctxPortal: testPortal, ctxLUN: strconv.Itoa(first), ctxPath: path, ctxFsType: "ext4", ctxWriteCache: "false"}
	if !mapsEqual(v.Context, want) {
		t.Errorf("context %v, want %v", v.Context, want)
	}
	if lun := s.luns[testTarget][int32(first)]; lun == nil || lun.path != path || lun.size != 64*sdk.MiB {
		t.Fatalf("LUN %d: %+v", first, lun)
	}
	if len(s.acls[testTarget]) != 0 {
		t.Fatal("a new volume is granted to someone")
	}
	if calls := since(); strings.Count(calls, "file_stat") < maxLUN+1 || !strings.HasSuffix(calls, "file_create file_stat lio_lun_create") {
		t.Errorf("calls %s: want a scan of every LUN's file, then file_create and lio_lun_create", calls)
	}

	// A repeat finds the file of the first call and makes nothing new.
	since = s.mark()
	again := createVolume(t, b, "pvc-1", 64*sdk.MiB)
	if again.LocalID != v.LocalID || strings.Contains(since(), "file_create") || len(s.files) != 1 {
		t.Fatalf("repeat: %+v, calls %s, files %v", again, since(), s.files)
	}
}

func TestCreateVolumeLUNCollision(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	nameID := sdk.NameID("pvc-2", "vol")
	order := lunOrder(nameID)
	// Another volume holds the first two LUNs of pvc-2's order.
	for _, lun := range order[:2] {
		other := "/pool/other-" + strconv.Itoa(lun) + ".img"
		s.files[other] = sdk.MiB
		s.luns[testTarget] = map[int32]*fakeLUN{}
	}
	for _, lun := range order[:2] {
		s.luns[testTarget][int32(lun)] = &fakeLUN{path: "/pool/other-" + strconv.Itoa(lun) + ".img", size: sdk.MiB}
	}
	v := createVolume(t, b, "pvc-2", 16*sdk.MiB)
	if v.LocalID != volumeID(nameID, order[2]) {
		t.Fatalf("volume %s, want LUN %d (the first free in its order)", v.LocalID, order[2])
	}
	for _, lun := range order[:2] {
		if _, ok := s.files["/pool/"+volumeID(nameID, lun)+".img"]; ok {
			t.Errorf("the file tried for taken LUN %d was left behind", lun)
		}
	}
	// One of the taken LUNs is freed; a repeat (the host lost its record)
	// must finish the volume it made, not make a second one.
	delete(s.luns[testTarget], int32(order[0]))
	again := createVolume(t, b, "pvc-2", 16*sdk.MiB)
	if again.LocalID != v.LocalID {
		t.Fatalf("repeat after a LUN was freed made %s, want %s", again.LocalID, v.LocalID)
	}
	if _, ok := s.luns[testTarget][int32(order[0])]; ok {
		t.Fatal("the repeat took the freed LUN as well")
	}
}

func TestCreateVolumeTargetFull(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	s.luns[testTarget] = map[int32]*fakeLUN{}
	for lun := range int32(maxLUN + 1) {
		p := "/pool/x" + strconv.Itoa(int(lun)) + ".img"
		s.files[p] = sdk.MiB
		s.luns[testTarget][lun] = &fakeLUN{path: p, size: sdk.MiB}
	}
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "one-too-many", RequiredBytes: sdk.MiB})
	if abi.CodeOf(err) != abi.ResourceExhausted {
		t.Fatalf("CreateVolume on a full target = %v, want RESOURCE_EXHAUSTED", err)
	}
	if len(s.files) != maxLUN+1 {
		t.Fatalf("%d files after a refused create, want %d", len(s.files), maxLUN+1)
	}
}

func TestCreateVolumeSizes(t *testing.T) {
	mount := func(fs string) []abi.Capability {
		return []abi.Capability{{FsType: fs, AccessMode: abi.AccessSingleNodeWriter}}
	}
	block := []abi.Capability{{Block: true, AccessMode: abi.AccessSingleNodeWriter}}
	tests := []struct {
		name            string
		required, limit int64
		caps            []abi.Capability
		want            int64
		code            abi.Code
	}{
		{"default", 0, 0, mount(""), defaultSizeBytes, abi.OK},
		{"rounded to MiB", 5*sdk.MiB + 1, 0, block, 6 * sdk.MiB, abi.OK},
		{"xfs minimum", 10 * sdk.MiB, 0, mount("xfs"), 300 * sdk.MiB, abi.OK},
		{"xfs above the limit", 10 * sdk.MiB, 100 * sdk.MiB, mount("xfs"), 0, abi.OutOfRange},
		{"no MiB in range", sdk.MiB + 1, sdk.MiB + 100, block, 0, abi.OutOfRange},
		{"larger than the pool", 200 * sdk.GiB, 0, block, 0, abi.OutOfRange},
		{"two filesystems", sdk.MiB, 0, append(mount("ext4"), mount("xfs")...), 0, abi.InvalidArgument},
		{"unknown fs", sdk.MiB, 0, mount("zfs"), 0, abi.InvalidArgument},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, b := newFakeSAN(t, nil)
			resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v" + strconv.Itoa(i), RequiredBytes: tc.required, LimitBytes: tc.limit, Capabilities: tc.caps})
			if abi.CodeOf(err) != tc.code {
				t.Fatalf("CreateVolume = %v, want %v", err, tc.code)
			}
			if err == nil && resp.CapacityBytes != tc.want {
				t.Fatalf("capacity %d, want %d", resp.CapacityBytes, tc.want)
			}
		})
	}
	_, b := newFakeSAN(t, nil)
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "p", Parameters: map[string]string{"thin": "yes"}}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("unknown parameter: %v", err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "p", RequiredBytes: sdk.MiB, Parameters: map[string]string{kubernetesPrefix + "pvc/name": "x"}}); err != nil {
		t.Fatalf("CO metadata parameter: %v", err)
	}
}

func TestDeleteVolume(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	v := createVolume(t, b, "pvc-1", 16*sdk.MiB)
	lun := int32(lunOrder(sdk.NameID("pvc-1", "vol"))[0])
	for range 2 { // idempotent
		if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref(v)}); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.files) != 0 || s.luns[testTarget][lun] != nil {
		t.Fatalf("after delete: files %v, LUNs %v", s.files, s.luns)
	}
	// The LUN number went to another volume meanwhile: a late repeat of the
	// delete leaves it alone.
	other := createVolume(t, b, "other", 16*sdk.MiB)
	s.luns[testTarget][lun] = s.luns[testTarget][int32(mustLUN(t, other.LocalID))]
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref(v)}); err != nil {
		t.Fatal(err)
	}
	if s.luns[testTarget][lun] == nil {
		t.Fatal("a repeated delete removed a LUN that serves another volume")
	}
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: "not-ours"}}); err != nil {
		t.Fatalf("delete of a foreign ID = %v, want success", err)
	}
	bad := ref(v)
	bad.Context = map[string]string{ctxPath: "/etc/passwd"}
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: bad}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("delete with a context path of another file = %v, want INVALID_ARGUMENT", err)
	}
}

func mustLUN(t *testing.T, id string) int {
	t.Helper()
	_, lun, ok := parseVolumeID(id)
	if !ok {
		t.Fatalf("bad volume ID %q", id)
	}
	return lun
}

func TestExpandVolume(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	v := createVolume(t, b, "pvc-1", 16*sdk.MiB)
	lun := int32(mustLUN(t, v.LocalID))
	for range 2 { // idempotent
		resp, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 40*sdk.MiB + 1})
		if err != nil {
			t.Fatal(err)
		}
		if resp.CapacityBytes != 41*sdk.MiB || !resp.NodeExpansionRequired {
			t.Fatalf("expand: %+v", resp)
		}
	}
	if s.files[v.Context[ctxPath]] != 41*sdk.MiB || s.luns[testTarget][lun].size != 41*sdk.MiB {
		t.Fatalf("file %d, LUN %d bytes; want both 41 MiB", s.files[v.Context[ctxPath]], s.luns[testTarget][lun].size)
	}
	// The target host rebooted: the LUN is gone and comes back grown.
	delete(s.luns[testTarget], lun)
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 64 * sdk.MiB}); err != nil {
		t.Fatal(err)
	}
	if s.luns[testTarget][lun].size != 64*sdk.MiB {
		t.Fatalf("LUN after expansion of a lost LUN: %+v", s.luns[testTarget][lun])
	}
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 200 * sdk.GiB}); abi.CodeOf(err) != abi.OutOfRange {
		t.Fatalf("expand beyond the pool = %v, want OUT_OF_RANGE", err)
	}
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 65*sdk.MiB + 1, LimitBytes: 65*sdk.MiB + 2}); abi.CodeOf(err) != abi.OutOfRange {
		t.Fatalf("expand with no MiB in range = %v, want OUT_OF_RANGE", err)
	}
}

func TestSnapshotsAndClones(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	v := createVolume(t, b, "pvc-1", 16*sdk.MiB)
	var snap *abi.CreateSnapshotResponse
	for range 2 { // idempotent
		var err error
		snap, err = b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snap-1", Source: ref(v)})
		if err != nil {
			t.Fatal(err)
		}
	}
	snapPath := "/pool/" + sdk.NameID("snap-1", "snap") + ".snap"
	if snap.LocalID != sdk.NameID("snap-1", "snap") || snap.SizeBytes != 16*sdk.MiB || !snap.ReadyToUse || snap.Context[ctxPath] != snapPath || snap.Context[ctxFsType] != "ext4" {
		t.Fatalf("snapshot %+v", snap)
	}
	snapRef := abi.SnapshotRef{LocalID: snap.LocalID, Context: snap.Context, SizeBytes: snap.SizeBytes, Source: ref(v)}
	restored, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "restored", RequiredBytes: 32 * sdk.MiB,
		Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}}, Source: &abi.VolumeSource{Snapshot: &snapRef}})
	if err != nil {
		t.Fatal(err)
	}
	if restored.CapacityBytes != 32*sdk.MiB || s.files[restored.Context[ctxPath]] != 32*sdk.MiB {
		t.Fatalf("restored volume %+v", restored)
	}
	if s.luns[testTarget][int32(mustLUN(t, restored.LocalID))] == nil {
		t.Fatal("restored volume has no LUN")
	}
	src := ref(v)
	clone, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "clone", RequiredBytes: 16 * sdk.MiB,
		Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}}, Source: &abi.VolumeSource{Volume: &src}})
	if err != nil {
		t.Fatal(err)
	}
	if clone.LocalID == v.LocalID || s.files[clone.Context[ctxPath]] != 16*sdk.MiB {
		t.Fatalf("clone %+v", clone)
	}
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "xfs-clone", RequiredBytes: 300 * sdk.MiB,
		Capabilities: []abi.Capability{{FsType: "xfs", AccessMode: abi.AccessSingleNodeWriter}}, Source: &abi.VolumeSource{Volume: &src}})
	if abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("xfs clone of an ext4 volume = %v, want INVALID_ARGUMENT", err)
	}
	for range 2 {
		if err := b.DeleteSnapshot(&abi.DeleteSnapshotRequest{Snapshot: snapRef}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.files[snapPath]; ok {
		t.Fatal("snapshot file left after DeleteSnapshot")
	}
	if _, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "s", Source: ref(v), Parameters: map[string]string{"x": "y"}}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("snapshot parameter: %v", err)
	}
}

func TestGetCapacity(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	s.total, s.avail = 10*sdk.GiB+5, 3*sdk.GiB+7
	resp, err := b.GetCapacity(&abi.GetCapacityRequest{Capability: &abi.Capability{FsType: "xfs"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.AvailableBytes != 3*sdk.GiB || resp.MaximumVolumeSize != 10*sdk.GiB || resp.MinimumVolumeSize != 300*sdk.MiB {
		t.Fatalf("capacity %+v", resp)
	}
	s.total = 100 * sdk.MiB
	if resp, _ := b.GetCapacity(&abi.GetCapacityRequest{Capability: &abi.Capability{FsType: "xfs"}}); resp.MaximumVolumeSize != 0 {
		t.Fatalf("a pool smaller than xfs's minimum offers %+v", resp)
	}
}

// TestWriteCache: writeCache from the StorageClass, overridden by the
// mutable parameters at creation, changed live by ModifyVolume (nothing
// changes for a bad value), kept in the context, and restored with the
// LUN a reboot of the target host took away.
func TestWriteCache(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	caps := []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}}
	lunOf := func(v *abi.CreateVolumeResponse) *fakeLUN { return s.luns[testTarget][int32(mustLUN(t, v.LocalID))] }
	for _, tc := range []struct {
		params, mutable map[string]string
		want            bool
		code            abi.Code
	}{
		{nil, nil, false, abi.OK},
		{map[string]string{"writeCache": "true"}, nil, true, abi.OK},
		{map[string]string{"writeCache": "true"}, map[string]string{"writeCache": "false"}, false, abi.OK},
		{nil, map[string]string{"writeCache": "true"}, true, abi.OK},
		{map[string]string{"writeCache": "often"}, nil, false, abi.InvalidArgument},
		{nil, map[string]string{"writeCache": "often"}, false, abi.InvalidArgument},
		{map[string]string{"cache": "true"}, nil, false, abi.InvalidArgument},
	} {
		name := "v-" + strconv.Itoa(len(s.files))
		v, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: name, RequiredBytes: 16 * sdk.MiB, Capabilities: caps, Parameters: tc.params, MutableParameters: tc.mutable})
		if abi.CodeOf(err) != tc.code {
			t.Fatalf("params %v mutable %v: %v, want %v", tc.params, tc.mutable, err, tc.code)
		}
		if err != nil {
			continue
		}
		if lunOf(v).writeCache != tc.want || v.Context[ctxWriteCache] != strconv.FormatBool(tc.want) {
			t.Errorf("params %v mutable %v: LUN %+v, context %v; want writeCache %v", tc.params, tc.mutable, lunOf(v), v.Context, tc.want)
		}
	}

	v := createVolume(t, b, "modified", 16*sdk.MiB)
	r := ref(v)
	if _, err := b.ModifyVolume(&abi.ModifyVolumeRequest{Volume: r, MutableParameters: map[string]string{"writeCache": "sometimes"}}); abi.CodeOf(err) != abi.InvalidArgument || lunOf(v).writeCache {
		t.Fatalf("writeCache=sometimes: %v, LUN %+v", err, lunOf(v))
	}
	mod, err := b.ModifyVolume(&abi.ModifyVolumeRequest{Volume: r, MutableParameters: map[string]string{"writeCache": "true"}})
	if err != nil || !lunOf(v).writeCache || mod.Context[ctxWriteCache] != "true" || mod.Context[ctxPath] != v.Context[ctxPath] {
		t.Fatalf("writeCache=true: %+v, %v, LUN %+v", mod, err, lunOf(v))
	}
	r.Context = mod.Context
	s.luns = map[string]map[int32]*fakeLUN{} // the target host rebooted
	info, err := b.NodeInfo()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ControllerPublish(&abi.ControllerPublishRequest{Volume: r, NodeID: "n1", NodeContext: info.Context, Capability: caps[0]}); err != nil {
		t.Fatal(err)
	}
	if !lunOf(v).writeCache {
		t.Fatalf("LUN re-created by ControllerPublish after a target reboot lost its write cache: %+v", lunOf(v))
	}
	if _, err := b.GetCapacity(&abi.GetCapacityRequest{Parameters: map[string]string{"writeCache": "true"}}); err != nil {
		t.Errorf("GetCapacity with the StorageClass's writeCache: %v", err)
	}
}

func TestPublishUnpublish(t *testing.T) {
	s, b := newFakeSAN(t, map[string]string{configChapUser: "user1", configChapSecret: "secret123456"})
	v := createVolume(t, b, "pvc-1", 16*sdk.MiB)
	lun := int32(mustLUN(t, v.LocalID))
	node := map[string]string{NodeContextInitiator: testInitiator}
	pub := &abi.ControllerPublishRequest{Volume: ref(v), NodeID: "n1;x", NodeContext: node, Capability: abi.Capability{AccessMode: abi.AccessSingleNodeWriter}}
	resp, err := b.ControllerPublish(pub)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{pubPortal: testPortal, pubTarget: testTarget, pubLUN: strconv.Itoa(int(lun))}
	if !mapsEqual(resp.PublishContext, want) {
		t.Fatalf("publish context %v, want %v", resp.PublishContext, want)
	}
	if !slices.Equal(s.acls[testTarget][testInitiator], []int32{lun}) || s.chap[testTarget][testInitiator] != "user1:secret123456" {
		t.Fatalf("ACL %v, CHAP %q", s.acls[testTarget], s.chap[testTarget][testInitiator])
	}
	for _, v := range resp.PublishContext {
		if strings.Contains(v, "secret123456") {
			t.Fatal("the CHAP secret is in the publish context")
		}
	}
	// The target host rebooted: LIO forgot the LUN and the grant; a
	// publish brings both back.
	s.luns, s.acls = map[string]map[int32]*fakeLUN{}, map[string]map[string][]int32{}
	if _, err := b.ControllerPublish(pub); err != nil {
		t.Fatal(err)
	}
	if s.luns[testTarget][lun] == nil || !slices.Equal(s.acls[testTarget][testInitiator], []int32{lun}) {
		t.Fatalf("publish after a target reboot: LUNs %v, ACLs %v", s.luns, s.acls)
	}
	for range 2 { // idempotent
		if err := b.ControllerUnpublish(&abi.ControllerUnpublishRequest{Volume: ref(v), NodeID: "n1;x", NodeContext: node}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.acls[testTarget][testInitiator]; ok {
		t.Fatalf("ACL after unpublish: %v", s.acls[testTarget])
	}

	noName := *pub
	noName.NodeContext = nil
	if _, err := b.ControllerPublish(&noName); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("publish to a node without an initiator name = %v, want FAILED_PRECONDITION", err)
	}
	if err := b.ControllerUnpublish(&abi.ControllerUnpublishRequest{Volume: ref(v), NodeID: "n2;"}); err != nil {
		t.Fatalf("unpublish from a node without an initiator name = %v, want success", err)
	}
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref(v)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ControllerPublish(pub); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("publish of a deleted volume = %v, want NOT_FOUND", err)
	}
}

// stage publishes v to the test node and stages it, as the CO would.
func stage(t *testing.T, b *Backend, v *abi.CreateVolumeResponse) *abi.NodeStageResponse {
	t.Helper()
	info, err := b.NodeInfo()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := b.ControllerPublish(&abi.ControllerPublishRequest{Volume: ref(v), NodeID: "n1", NodeContext: info.Context})
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.NodeStage(&abi.NodeStageRequest{Volume: ref(v), PublishContext: pub.PublishContext, StagingPath: "/staging/" + v.LocalID})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestNodeSharedSession(t *testing.T) {
	s, b := newFakeSAN(t, map[string]string{configChapUser: "user1", configChapSecret: "secret123456"})
	info, err := b.NodeInfo()
	if err != nil || info.Context[NodeContextInitiator] != testInitiator || info.Topology != nil {
		t.Fatalf("node info %+v, %v", info, err)
	}
	v1, v2 := createVolume(t, b, "pvc-1", 16*sdk.MiB), createVolume(t, b, "pvc-2", 16*sdk.MiB)
	st1, st2 := stage(t, b, v1), stage(t, b, v2)
	if again := stage(t, b, v1); again.Device != st1.Device {
		t.Fatalf("staging again answered %s, first %s", again.Device, st1.Device)
	}
	if st1.Device == st2.Device || s.logins != 1 || len(s.sessions) != 1 {
		t.Fatalf("devices %s, %s; %d logins, sessions %v: want two disks over one session", st1.Device, st2.Device, s.logins, s.sessions)
	}
	want := map[string]string{pubPortal: testPortal, pubTarget: testTarget, pubLUN: strconv.Itoa(mustLUN(t, v1.LocalID))}
	if !mapsEqual(st1.Context, want) {
		t.Fatalf("stage context %v, want %v", st1.Context, want)
	}
	unstage := func(v *abi.CreateVolumeResponse, st *abi.NodeStageResponse) {
		t.Helper()
		if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: ref(v), Device: st.Device, StageContext: st.Context}); err != nil {
			t.Fatal(err)
		}
	}
	unstage(v1, st1)
	if len(s.sessions) != 1 {
		t.Fatal("unstaging the first volume ended the session the second uses")
	}
	unstage(v1, st1) // idempotent
	unstage(v2, st2)
	if len(s.sessions) != 0 {
		t.Fatalf("sessions after the last unstage: %v", s.sessions)
	}
}

func TestNodeStageErrors(t *testing.T) {
	s, b := newFakeSAN(t, map[string]string{configChapUser: "user1", configChapSecret: "secret123456"})
	v := createVolume(t, b, "pvc-1", 16*sdk.MiB)
	lun := strconv.Itoa(mustLUN(t, v.LocalID))
	pubCtx := map[string]string{pubPortal: testPortal, pubTarget: testTarget, pubLUN: lun}
	stageWith := func(vol abi.VolumeRef, ctx map[string]string) error {
		_, err := b.NodeStage(&abi.NodeStageRequest{Volume: vol, PublishContext: ctx, StagingPath: "/staging/x"})
		return err
	}
	if err := stageWith(ref(v), pubCtx); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("stage before publish = %v, want PERMISSION_DENIED (no ACL)", err)
	}
	stage(t, b, v) // publish and stage
	tests := []struct {
		name string
		vol  abi.VolumeRef
		ctx  map[string]string
		code abi.Code
	}{
		{"publish context", ref(v), pubCtx, abi.OK},
		{"volume context only", ref(v), nil, abi.OK},
		{"LUN differs from the ID", ref(v), map[string]string{pubPortal: testPortal, pubTarget: testTarget, pubLUN: "300"}, abi.InvalidArgument},
		{"no portal anywhere", abi.VolumeRef{LocalID: v.LocalID}, nil, abi.InvalidArgument},
		{"foreign ID", abi.VolumeRef{LocalID: "x"}, pubCtx, abi.NotFound},
		{"ungranted portal", ref(v), map[string]string{pubPortal: "198.51.100.1:3260", pubTarget: testTarget}, abi.PermissionDenied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := stageWith(tc.vol, tc.ctx); abi.CodeOf(err) != tc.code {
				t.Fatalf("NodeStage = %v, want %v", err, tc.code)
			}
		})
	}
	// A node whose CHAP credentials differ from the target's is refused,
	// and the error shows neither secret.
	nb := New()
	if err := nb.Configure(&abi.ConfigureRequest{Roots: testRoots, Role: "node",
		Config: map[string]string{configChapUser: "user1", configChapSecret: "wrong-secret-1"}}); err != nil {
		t.Fatal(err)
	}
	_, err := nb.NodeStage(&abi.NodeStageRequest{Volume: ref(v), PublishContext: pubCtx, StagingPath: "/staging/y"})
	if abi.CodeOf(err) != abi.PermissionDenied || strings.Contains(err.Error(), "secret") {
		t.Fatalf("stage with wrong CHAP credentials = %v, want PERMISSION_DENIED without the secret", err)
	}
	if s.logins != 1 {
		t.Fatalf("%d logins, want the first node's one", s.logins)
	}
}

func TestNodeExpand(t *testing.T) {
	_, b := newFakeSAN(t, nil)
	v := createVolume(t, b, "pvc-1", 16*sdk.MiB)
	st := stage(t, b, v)
	expand := func(required int64) (*abi.NodeExpandResponse, error) {
		return b.NodeExpand(&abi.NodeExpandRequest{Volume: ref(v), Device: st.Device, RequiredBytes: required, StageContext: st.Context})
	}
	if _, err := expand(32 * sdk.MiB); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("node expand before the controller's = %v, want FAILED_PRECONDITION", err)
	}
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 32 * sdk.MiB}); err != nil {
		t.Fatal(err)
	}
	resp, err := expand(32 * sdk.MiB)
	if err != nil || resp.CapacityBytes != 32*sdk.MiB {
		t.Fatalf("node expand: %+v, %v", resp, err)
	}
}

func TestHealth(t *testing.T) {
	s, b := newFakeSAN(t, nil)
	v := createVolume(t, b, "pvc-1", 16*sdk.MiB)
	health := func(onNode bool, vol abi.VolumeRef) string {
		t.Helper()
		r, err := b.VolumeHealth(&abi.VolumeHealthRequest{Volume: vol, OnNode: onNode})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Entries) == 0 {
			return ""
		}
		return r.Entries[0].Reason
	}
	if got := health(false, ref(v)); got != "" {
		t.Fatalf("controller health of a new volume: %s", got)
	}
	if got := health(true, ref(v)); got != "LunNotLoggedIn" {
		t.Fatalf("node health of an unstaged volume: %q, want LunNotLoggedIn", got)
	}
	stage(t, b, v)
	if got := health(true, ref(v)); got != "" {
		t.Fatalf("node health of a staged volume: %s", got)
	}
	bigger := ref(v)
	bigger.CapacityBytes = 32 * sdk.MiB
	if got := health(true, bigger); got != "LunSmallerThanVolume" {
		t.Fatalf("node health of an unfinished expansion: %q", got)
	}
	if got := health(false, bigger); got != "VolumeFileTruncated" {
		t.Fatalf("controller health of a short file: %q", got)
	}
	delete(s.files, v.Context[ctxPath])
	if got := health(false, ref(v)); got != "VolumeFileMissing" {
		t.Fatalf("controller health of a lost file: %q", got)
	}
	r, err := b.StorageHealth()
	if err != nil || len(r.Entries) != 0 {
		t.Fatalf("storage health: %+v, %v", r, err)
	}
	s.initiator = ""
	if r, _ := b.StorageHealth(); len(r.Entries) == 0 || r.Entries[0].Reason != "NoInitiatorName" {
		t.Fatalf("storage health without an initiator name: %+v", r)
	}
	if info, err := b.NodeInfo(); err != nil || len(info.Context) != 0 {
		t.Fatalf("node info without an initiator name: %+v, %v (want an empty answer, not an error)", info, err)
	}
	s.avail = 0
	s.initiator = testInitiator
	if r, _ := b.StorageHealth(); len(r.Entries) == 0 || r.Entries[0].Reason != "PoolFull" {
		t.Fatalf("storage health of a full pool: %+v", r)
	}
}

func TestNodeRoleServesNoTarget(t *testing.T) {
	b := New()
	if err := b.Configure(&abi.ConfigureRequest{Roots: []string{testPortal}, Role: "node"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "x"}); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("CreateVolume on a node = %v, want FAILED_PRECONDITION", err)
	}
	if _, err := New().CreateVolume(&abi.CreateVolumeRequest{Name: "x"}); abi.CodeOf(err) != abi.Unavailable {
		t.Fatalf("CreateVolume unconfigured = %v, want UNAVAILABLE", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
