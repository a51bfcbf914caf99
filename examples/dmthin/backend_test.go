//go:build !wasip1

package main

import (
	"hash/fnv"
	"slices"
	"strconv"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

const (
	testState = "/state"
	testPool  = "wasmcsi-t-pool"
	testNode  = "node-1"
)

var testRoots = []string{testState, "wasmcsi-t-", "/dev/mapper/wasmcsi-t-", "/files"}

func testConfig() map[string]string {
	return map[string]string{configPool: testPool, configData: "/files/data", configMeta: "/files/meta"}
}

// newSystem returns a fake system with the backing files in place,
// installed as the native host.
func newSystem(t *testing.T) *fakeSystem {
	t.Helper()
	f := newFakeSystem()
	f.files["/files/data"] = 256 * mib
	f.files["/files/meta"] = 8 * mib
	f.install(t)
	return f
}

// configured returns a backend configured with testConfig.
func configured(t *testing.T) *Backend {
	t.Helper()
	b := New()
	if err := b.Configure(&abi.ConfigureRequest{Config: testConfig(), Roots: testRoots, NodeID: testNode, Role: "all"}); err != nil {
		t.Fatal(err)
	}
	return b
}

func wantCode(t *testing.T, what string, err error, code abi.Code) {
	t.Helper()
	if abi.CodeOf(err) != code {
		t.Fatalf("%s: got %v, want code %v", what, err, code)
	}
}

func mountCap(fs string) []abi.Capability {
	return []abi.Capability{{FsType: fs, AccessMode: abi.AccessSingleNodeWriter}}
}

func blockCap() []abi.Capability {
	return []abi.Capability{{Block: true, AccessMode: abi.AccessSingleNodeWriter}}
}

func create(t *testing.T, b *Backend, name string, size int64) *abi.CreateVolumeResponse {
	t.Helper()
	resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: name, RequiredBytes: size, Capabilities: mountCap("")})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return resp
}

func ref(v *abi.CreateVolumeResponse) abi.VolumeRef {
	return abi.VolumeRef{LocalID: v.LocalID, Context: v.Context, CapacityBytes: v.CapacityBytes}
}

func idOf(t *testing.T, local string) uint32 {
	t.Helper()
	id, ok := parseLocalID(local[0], local)
	if !ok {
		t.Fatalf("bad local ID %q", local)
	}
	return id
}

func TestConfigure(t *testing.T) {
	with := func(kv ...string) map[string]string {
		c := testConfig()
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(c, kv[i])
			} else {
				c[kv[i]] = kv[i+1]
			}
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		config map[string]string
		roots  []string
		node   string
		code   abi.Code
	}{
		{name: "files", config: testConfig()},
		{name: "block devices", config: with(configData, "/dev/vdb", configMeta, "/dev/vdc")},
		{name: "block size", config: with(configBlockSize, "1Mi")},
		{name: "fs type", config: with(configFsType, "xfs")},
		{name: "no roots", config: testConfig(), roots: []string{}, code: abi.InvalidArgument},
		{name: "state under /dev", config: testConfig(), roots: []string{"/dev/mapper/x", "wasmcsi-t-"}, code: abi.InvalidArgument},
		{name: "state not clean", config: testConfig(), roots: []string{"/state/../etc", "wasmcsi-t-"}, code: abi.InvalidArgument},
		{name: "no node", config: testConfig(), node: "-", code: abi.InvalidArgument},
		{name: "no pool", config: with(configPool, ""), code: abi.InvalidArgument},
		{name: "pool outside prefix", config: with(configPool, "lvm-pool"), code: abi.PermissionDenied},
		{name: "pool bad byte", config: with(configPool, "wasmcsi-t-a/b"), code: abi.InvalidArgument},
		{name: "pool too long", config: with(configPool, "wasmcsi-t-"+string(make([]byte, 120))), code: abi.InvalidArgument},
		{name: "unknown key", config: with("size", "1Gi"), code: abi.InvalidArgument},
		{name: "block size too small", config: with(configBlockSize, "32Ki"), code: abi.InvalidArgument},
		{name: "block size not multiple", config: with(configBlockSize, "96Ki"), code: abi.InvalidArgument},
		{name: "block size garbage", config: with(configBlockSize, "big"), code: abi.InvalidArgument},
		{name: "bad fs type", config: with(configFsType, "ntfs"), code: abi.InvalidArgument},
		{name: "relative device", config: with(configData, "files/data"), code: abi.InvalidArgument},
		{name: "bare name is in the state folder", config: with(configData, "data"), code: abi.NotFound},
		{name: "tiny data size", config: with(configDataSize, "1Ki"), code: abi.InvalidArgument},
		{name: "unclean device", config: with(configData, "/files/../files/data"), code: abi.InvalidArgument},
		{name: "no metadata device", config: with(configMeta, ""), code: abi.InvalidArgument},
		{name: "same device twice", config: with(configMeta, "/files/data"), code: abi.InvalidArgument},
		{name: "missing file", config: with(configData, "/files/none"), code: abi.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newSystem(t)
			roots, node := testRoots, testNode
			if tc.roots != nil {
				roots = tc.roots
			}
			if tc.node == "-" {
				node = ""
			}
			b := New()
			err := b.Configure(&abi.ConfigureRequest{Config: tc.config, Roots: roots, NodeID: node, Role: "all"})
			wantCode(t, "configure", err, tc.code)
			if err == nil && !b.configured {
				t.Error("configured is false after success")
			}
		})
	}
}

// A new pool is created with the default block size after an open that
// finds no metadata; a reopen keeps the pool's own block size; an explicit
// block size goes straight to a formatting open.
func TestConfigureOpensPool(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	if len(f.opens) != 2 || f.opens[0].Format || f.opens[0].BlockSectors != 0 || !f.opens[1].Format || f.opens[1].BlockSectors != 128 {
		t.Fatalf("opens %+v", f.opens)
	}
	if f.opens[1].DataDev != "/dev/loop0" || f.opens[1].MetaDev != "/dev/loop1" {
		t.Errorf("pool on %s and %s, want the loop devices", f.opens[1].DataDev, f.opens[1].MetaDev)
	}
	if b.blockBytes != 64*kib || b.Info().Granularity != 64*kib {
		t.Errorf("block %d, info %+v", b.blockBytes, b.Info())
	}
	v := create(t, b, "keep", 64*mib)

	// A restart: the pool opens as it is (one open), volumes stay.
	f.opens = nil
	b2 := configured(t)
	if len(f.opens) != 1 || f.opens[0].Format {
		t.Fatalf("reopen: %+v", f.opens)
	}
	if again := create(t, b2, "keep", 64*mib); again.LocalID != v.LocalID {
		t.Errorf("after restart %s, before %s", again.LocalID, v.LocalID)
	}

	// An explicit block size that contradicts the pool refuses the module.
	c := testConfig()
	c[configBlockSize] = "1Mi"
	err := New().Configure(&abi.ConfigureRequest{Config: c, Roots: testRoots, NodeID: testNode})
	wantCode(t, "contradicting block size", err, abi.InvalidArgument)

	// Block devices are used as they are: no loop device.
	g := newSystem(t)
	c = testConfig()
	c[configData], c[configMeta], c[configBlockSize] = "/dev/vdb", "/dev/vdc", "1Mi"
	bb := New()
	if err := bb.Configure(&abi.ConfigureRequest{Config: c, Roots: testRoots, NodeID: testNode}); err != nil {
		t.Fatal(err)
	}
	if len(g.loops) != 0 || len(g.opens) != 1 || g.opens[0].BlockSectors != 2048 || g.opens[0].DataDev != "/dev/vdb" {
		t.Errorf("loops %v, opens %+v", g.loops, g.opens)
	}
	if bb.Info().Granularity != mib {
		t.Errorf("granularity %d", bb.Info().Granularity)
	}
}

func TestUnconfigured(t *testing.T) {
	newSystem(t)
	b := New()
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "x", RequiredBytes: mib})
	wantCode(t, "create", err, abi.Unavailable)
	_, err = b.NodeStage(&abi.NodeStageRequest{Volume: abi.VolumeRef{LocalID: "t-1"}})
	wantCode(t, "stage", err, abi.Unavailable)
	_, err = b.GetCapacity(&abi.GetCapacityRequest{})
	wantCode(t, "capacity", err, abi.Unavailable)
}

func TestCreateVolume(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	v := create(t, b, "pvc-1", 10*mib+1)
	id := idOf(t, v.LocalID)
	if want := localID(kindVolume, ownerOf(kindVolume, "pvc-1").probe(0)); v.LocalID != want {
		t.Errorf("local ID %s, want the home slot %s", v.LocalID, want)
	}
	if v.CapacityBytes != 10*mib+64*kib {
		t.Errorf("capacity %d, want rounded up to the block size", v.CapacityBytes)
	}
	th := f.thin(id)
	if th == nil || th.active {
		t.Fatalf("thin %d: %+v, want created and inactive", id, th)
	}
	if n, _ := f.file(b.sizePath(id)); n != v.CapacityBytes {
		t.Errorf("size record %d", n)
	}
	if n, _ := f.file(b.claimPath(id)); n != ownerOf(kindVolume, "pvc-1").tag {
		t.Errorf("claim %d", n)
	}
	want := map[string]string{ctxPool: testPool, ctxID: strconv.FormatUint(uint64(id), 10), ctxSize: strconv.FormatInt(v.CapacityBytes, 10), ctxNode: testNode}
	for k, val := range want {
		if v.Context[k] != val {
			t.Errorf("context %s = %q, want %q", k, v.Context[k], val)
		}
	}
	if len(v.Topology) != 1 || v.Topology[0].Segments[TopologyKey] != testNode {
		t.Errorf("topology %+v", v.Topology)
	}

	// Repeats, also from a fresh instance, answer the same volume.
	if again := create(t, b, "pvc-1", 10*mib+1); again.LocalID != v.LocalID || again.CapacityBytes != v.CapacityBytes {
		t.Errorf("repeat %+v", again)
	}
	if again := create(t, configured(t), "pvc-1", 10*mib+1); again.LocalID != v.LocalID {
		t.Errorf("repeat on a new instance %+v", again)
	}
	// The same name with another size is another volume.
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-1", RequiredBytes: 20 * mib})
	wantCode(t, "same name, other size", err, abi.AlreadyExists)
	// A snapshot of the same name is another owner.
	if ownerOf(kindSnapshot, "pvc-1") == ownerOf(kindVolume, "pvc-1") {
		t.Error("volume and snapshot of one name share an owner")
	}
}

func TestCreateVolumeSizes(t *testing.T) {
	newSystem(t)
	b := configured(t)
	for i, tc := range []struct {
		name            string
		required, limit int64
		caps            []abi.Capability
		want            int64
		code            abi.Code
	}{
		{name: "rounded", required: mib + 1, caps: blockCap(), want: mib + 64*kib},
		{name: "minimum", required: 64 * kib, caps: blockCap(), want: mib},
		{name: "default", caps: blockCap(), want: gib},
		{name: "ext4", required: 4 * mib, caps: mountCap("ext4"), want: 4 * mib},
		{name: "default fs", required: 4 * mib, caps: mountCap(""), want: 4 * mib},
		{name: "xfs minimum", required: 4 * mib, caps: mountCap("xfs"), want: 300 * mib},
		{name: "btrfs minimum", required: 4 * mib, caps: mountCap("btrfs"), want: 109 * mib},
		{name: "within limit", required: mib + 1, limit: 2 * mib, caps: blockCap(), want: mib + 64*kib},
		{name: "limit below rounding", required: mib + 1, limit: mib + 100, caps: blockCap(), code: abi.OutOfRange},
		{name: "limit below xfs", required: 4 * mib, limit: 100 * mib, caps: mountCap("xfs"), code: abi.OutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "size-" + strconv.Itoa(i), RequiredBytes: tc.required, LimitBytes: tc.limit, Capabilities: tc.caps})
			wantCode(t, "create", err, tc.code)
			if err == nil && resp.CapacityBytes != tc.want {
				t.Errorf("capacity %d, want %d", resp.CapacityBytes, tc.want)
			}
		})
	}
}

func TestCreateVolumeParameters(t *testing.T) {
	newSystem(t)
	b := configured(t)
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "p", RequiredBytes: mib, Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": "x"}})
	wantCode(t, "sidecar parameter", err, abi.OK)
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "q", RequiredBytes: mib, Parameters: map[string]string{"thin": "yes"}})
	wantCode(t, "unknown parameter", err, abi.InvalidArgument)
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "r", RequiredBytes: mib,
		Requisite: []abi.Topology{{Segments: map[string]string{TopologyKey: "elsewhere"}}}})
	wantCode(t, "requisite elsewhere", err, abi.ResourceExhausted)
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "s", RequiredBytes: mib,
		Requisite: []abi.Topology{{Segments: map[string]string{TopologyKey: "elsewhere"}}, {Segments: map[string]string{TopologyKey: testNode}}}})
	wantCode(t, "requisite includes this node", err, abi.OK)
}

// Another owner's claim on the home slot moves the volume to the next
// free id; the other owner keeps its id.
func TestCreateVolumeProbesPastOtherClaims(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	o := ownerOf(kindVolume, "pvc-2")
	for i := 0; i < 3; i++ {
		f.files[b.claimPath(o.probe(i))] = o.tag + 1 // someone else's
	}
	v := create(t, b, "pvc-2", mib)
	if id := idOf(t, v.LocalID); id != o.probe(3) {
		t.Errorf("id %d, want %d (the fourth candidate)", id, o.probe(3))
	}
	for i := 0; i < 3; i++ {
		if n := f.files[b.claimPath(o.probe(i))]; n != o.tag+1 {
			t.Errorf("another owner's claim changed to %d", n)
		}
	}
	// All candidates taken: RESOURCE_EXHAUSTED.
	q := ownerOf(kindVolume, "pvc-3")
	for i := 0; i < maxProbes; i++ {
		f.files[b.claimPath(q.probe(i))] = q.tag + 1
	}
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-3", RequiredBytes: mib})
	wantCode(t, "no free id", err, abi.ResourceExhausted)
}

// A daemon killed after any step of CreateVolume: the repeat completes the
// volume on the same id and leaves nothing behind.
func TestCreateVolumeAfterCrash(t *testing.T) {
	for _, step := range []string{"claim", "size", "thin", "active thin"} {
		t.Run(step, func(t *testing.T) {
			f := newSystem(t)
			b := configured(t)
			o := ownerOf(kindVolume, "crash")
			id := o.probe(0)
			f.files[b.claimPath(id)] = o.tag
			if step != "claim" {
				f.files[b.sizePath(id)] = 4 * mib
			}
			if step == "thin" || step == "active thin" {
				f.pool.thins[id] = &fakeThin{active: step == "active thin", size: 4 * mib}
			}
			v := create(t, b, "crash", 4*mib)
			if got := idOf(t, v.LocalID); got != id {
				t.Fatalf("id %d, want %d", got, id)
			}
			if th := f.thin(id); th == nil || th.active {
				t.Errorf("thin %+v, want present and inactive", th)
			}
			if len(f.records()) != 2 {
				t.Errorf("records %v, want the claim and the size", f.records())
			}
		})
	}
}

// When the thin device cannot be made, the claim and size record go, so
// the id is free again.
func TestCreateVolumeRollsBack(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	f.failNext(abi.HostCallDmThinCreate, abi.Errorf(abi.Internal, "ioctl failed"))
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "fails", RequiredBytes: mib})
	wantCode(t, "create", err, abi.Internal)
	if r := f.records(); len(r) != 0 {
		t.Errorf("records left: %v", r)
	}
	create(t, b, "fails", mib)
}

// A pool that can take no data refuses new volumes, releasing the claim,
// but still answers a repeat of a volume it holds.
func TestCreateVolumePoolFull(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	v := create(t, b, "before", mib)
	f.status.UsedDataBlocks = f.status.TotalDataBlocks
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "after", RequiredBytes: mib})
	wantCode(t, "full pool", err, abi.ResourceExhausted)
	if len(f.records()) != 2 {
		t.Errorf("records %v, want only the first volume's", f.records())
	}
	if again := create(t, b, "before", mib); again.LocalID != v.LocalID {
		t.Errorf("repeat on a full pool: %+v", again)
	}
}

func TestSnapshotRestoreClone(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	v := create(t, b, "origin", 64*mib)
	vid := idOf(t, v.LocalID)

	s, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snap", Source: ref(v)})
	if err != nil {
		t.Fatal(err)
	}
	sid := idOf(t, s.LocalID)
	if s.LocalID[0] != 's' || !s.ReadyToUse || s.SizeBytes != 64*mib || s.Context[ctxSize] != strconv.FormatInt(64*mib, 10) {
		t.Errorf("snapshot %+v", s)
	}
	if th := f.thin(sid); th == nil || th.origin != vid {
		t.Fatalf("snapshot thin %+v, want a snapshot of %d", th, vid)
	}
	if again, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snap", Source: ref(v)}); err != nil || again.LocalID != s.LocalID {
		t.Errorf("repeat snapshot %+v %v", again, err)
	}

	// Restore, bigger than the snapshot: a snapshot of the snapshot, whose
	// size record is the bigger size.
	sref := abi.SnapshotRef{LocalID: s.LocalID, Context: s.Context, SizeBytes: s.SizeBytes}
	r, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "restored", RequiredBytes: 128 * mib, Source: &abi.VolumeSource{Snapshot: &sref}})
	if err != nil {
		t.Fatal(err)
	}
	rid := idOf(t, r.LocalID)
	if th := f.thin(rid); th == nil || th.origin != sid || r.CapacityBytes != 128*mib {
		t.Errorf("restored %+v thin %+v", r, th)
	}
	if n, _ := f.file(b.sizePath(rid)); n != 128*mib {
		t.Errorf("restored size record %d", n)
	}
	// Clone asking less than the source: the source's size.
	c, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "clone", RequiredBytes: mib, Source: &abi.VolumeSource{Volume: &abi.VolumeRef{LocalID: v.LocalID, Context: v.Context}}})
	if err != nil {
		t.Fatal(err)
	}
	if th := f.thin(idOf(t, c.LocalID)); th == nil || th.origin != vid || c.CapacityBytes != 64*mib {
		t.Errorf("clone %+v thin %+v", c, th)
	}
	// A clone no bigger than its limit allows.
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "clone-2", RequiredBytes: mib, LimitBytes: 32 * mib, Source: &abi.VolumeSource{Volume: &abi.VolumeRef{LocalID: v.LocalID, Context: v.Context}}})
	wantCode(t, "clone above limit", err, abi.OutOfRange)

	// Sources that are gone, foreign or not ours.
	gone := abi.VolumeRef{LocalID: "t-4242", Context: map[string]string{ctxPool: testPool, ctxSize: "1048576"}}
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "from-gone", RequiredBytes: mib, Source: &abi.VolumeSource{Volume: &gone}})
	wantCode(t, "clone of a missing volume", err, abi.NotFound)
	foreign := abi.VolumeRef{LocalID: v.LocalID, Context: map[string]string{ctxPool: "wasmcsi-t-other", ctxNode: "node-2"}}
	_, err = b.CreateVolume(&abi.CreateVolumeRequest{Name: "from-foreign", RequiredBytes: mib, Source: &abi.VolumeSource{Volume: &foreign}})
	wantCode(t, "clone from another pool", err, abi.NotFound)
	_, err = b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snap-bad", Source: abi.VolumeRef{LocalID: "v-1"}})
	wantCode(t, "snapshot of a foreign ID", err, abi.NotFound)
	for _, p := range f.records() {
		for _, name := range []string{"from-gone", "from-foreign"} {
			if id := ownerOf(kindVolume, name).probe(0); p == b.claimPath(id) || p == b.sizePath(id) {
				t.Errorf("record %s left by a failed create", p)
			}
		}
	}

	// Deleting the snapshot keeps the restored volume.
	if err := b.DeleteSnapshot(&abi.DeleteSnapshotRequest{Snapshot: sref}); err != nil {
		t.Fatal(err)
	}
	if f.thin(sid) != nil || f.thin(rid) == nil {
		t.Error("snapshot delete: wrong thin devices left")
	}
	if err := b.DeleteSnapshot(&abi.DeleteSnapshotRequest{Snapshot: sref}); err != nil {
		t.Errorf("second snapshot delete: %v", err)
	}
}

func TestDeleteVolume(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	v := create(t, b, "doomed", mib)
	id := idOf(t, v.LocalID)
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref(v)}); err != nil {
		t.Fatal(err)
	}
	if f.thin(id) != nil || len(f.records()) != 0 {
		t.Errorf("left: thin %+v, records %v", f.thin(id), f.records())
	}
	for _, r := range []abi.VolumeRef{ref(v), {LocalID: "garbage"}, {LocalID: "t-0"}} {
		if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: r}); err != nil {
			t.Errorf("delete %q again: %v", r.LocalID, err)
		}
	}
	// A device the kernel will not let go keeps its records.
	w := create(t, b, "busy", mib)
	f.failNext(abi.HostCallDmThinDelete, abi.Errorf(abi.FailedPrecondition, "device is open"))
	err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref(w)})
	wantCode(t, "delete an open volume", err, abi.FailedPrecondition)
	if len(f.records()) != 2 {
		t.Errorf("records %v after a refused delete", f.records())
	}
}

func TestExpandAndNodeStage(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	v := create(t, b, "grow", 64*mib)
	id := idOf(t, v.LocalID)

	// Expanded while inactive: only the record changes.
	resp, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 100*mib + 1})
	if err != nil {
		t.Fatal(err)
	}
	want := 100*mib + 64*kib
	if resp.CapacityBytes != want || !resp.NodeExpansionRequired || resp.Context[ctxSize] != strconv.FormatInt(want, 10) || resp.Context[ctxPool] != testPool {
		t.Errorf("expand %+v", resp)
	}
	if n, _ := f.file(b.sizePath(id)); n != want {
		t.Errorf("size record %d", n)
	}
	if again, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 80 * mib}); err != nil || again.CapacityBytes != want {
		t.Errorf("smaller expand: %+v %v", again, err)
	}
	_, err = b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 200*mib + 1, LimitBytes: 200*mib + 100})
	wantCode(t, "expand above limit", err, abi.OutOfRange)

	// Staged with the context of its creation (64 MiB): the record wins.
	stage := &abi.NodeStageRequest{Volume: abi.VolumeRef{LocalID: v.LocalID, Context: v.Context}, Capability: mountCap("")[0]}
	st, err := b.NodeStage(stage)
	if err != nil {
		t.Fatal(err)
	}
	if st.Device != "/dev/mapper/"+testPool+"-"+strconv.FormatUint(uint64(id), 10) {
		t.Errorf("device %q", st.Device)
	}
	if th := f.thin(id); !th.active || th.size != want {
		t.Fatalf("active thin %+v, want %d bytes", th, want)
	}
	if again, err := b.NodeStage(stage); err != nil || again.Device != st.Device {
		t.Errorf("repeat stage %+v %v", again, err)
	}

	// Expanded while active: the device grows at once.
	resp, err = b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 128 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if th := f.thin(id); th.size != 128*mib || resp.CapacityBytes != 128*mib {
		t.Errorf("active thin %d bytes after expand, answered %d", th.size, resp.CapacityBytes)
	}
	ne, err := b.NodeExpand(&abi.NodeExpandRequest{Volume: stage.Volume, Device: st.Device, RequiredBytes: 128 * mib})
	if err != nil || ne.CapacityBytes != 128*mib {
		t.Errorf("node expand %+v %v", ne, err)
	}
	_, err = b.NodeExpand(&abi.NodeExpandRequest{Volume: stage.Volume, Device: st.Device, RequiredBytes: 256 * mib})
	wantCode(t, "node expand past the controller", err, abi.OutOfRange)

	// An active device that lags behind its record is grown on staging.
	f.pool.thins[id].size = 64 * mib
	if _, err := b.NodeStage(stage); err != nil {
		t.Fatal(err)
	}
	if th := f.thin(id); th.size != 128*mib {
		t.Errorf("lagging device %d bytes after stage", th.size)
	}

	if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: stage.Volume, Device: st.Device}); err != nil {
		t.Fatal(err)
	}
	if f.thin(id).active {
		t.Error("active after unstage")
	}
	if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: stage.Volume, Device: st.Device}); err != nil {
		t.Errorf("second unstage: %v", err)
	}

	// Without a record the creation's context still stages the volume.
	delete(f.files, b.sizePath(id))
	if _, err := b.NodeStage(stage); err != nil {
		t.Fatal(err)
	}
	if th := f.thin(id); th.size != 64*mib {
		t.Errorf("staged from context: %d bytes", th.size)
	}
}

func TestNodeStageRefuses(t *testing.T) {
	newSystem(t)
	b := configured(t)
	v := create(t, b, "elsewhere", mib)
	for _, tc := range []struct {
		name string
		ref  abi.VolumeRef
		code abi.Code
	}{
		{"foreign ID", abi.VolumeRef{LocalID: "v-1"}, abi.NotFound},
		{"snapshot ID", abi.VolumeRef{LocalID: "s-1"}, abi.NotFound},
		{"another pool", abi.VolumeRef{LocalID: v.LocalID, Context: map[string]string{ctxPool: "wasmcsi-t-b", ctxNode: "n2"}}, abi.NotFound},
		// Another node's pool of the same name: its thin IDs name other devices.
		{"same pool name on another node", abi.VolumeRef{LocalID: v.LocalID, Context: map[string]string{ctxPool: testPool, ctxNode: "n2"}}, abi.NotFound},
		{"no size", abi.VolumeRef{LocalID: "t-77"}, abi.NotFound},
		{"not in the pool", abi.VolumeRef{LocalID: "t-77", Context: map[string]string{ctxSize: "1048576"}}, abi.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.NodeStage(&abi.NodeStageRequest{Volume: tc.ref})
			wantCode(t, "stage", err, tc.code)
		})
	}
}

func TestCapacity(t *testing.T) {
	healthy := abi.DmPoolStatus{BlockSectors: 128, TotalDataBlocks: 4096, UsedDataBlocks: 96, TotalMetaBlocks: 2048, UsedMetaBlocks: 20}
	with := func(f func(*abi.DmPoolStatus)) *abi.DmPoolStatus {
		s := healthy
		f(&s)
		return &s
	}
	for _, tc := range []struct {
		name string
		st   *abi.DmPoolStatus
		want int64
	}{
		{"free data", &healthy, 4000 * 64 * kib},
		{"bigger blocks", with(func(s *abi.DmPoolStatus) { s.BlockSectors = 2048 }), 4000 * mib},
		{"full data", with(func(s *abi.DmPoolStatus) { s.UsedDataBlocks = 4096 }), 0},
		// 2048 metadata blocks, reserve 512, used 1530: 6 blocks left map
		// 6 × 4096 / 48 = 512 data blocks.
		{"metadata nearly full", with(func(s *abi.DmPoolStatus) { s.UsedMetaBlocks = 1530 }), 512 * 64 * kib},
		{"metadata at the reserve", with(func(s *abi.DmPoolStatus) { s.UsedMetaBlocks = 1536 }), 0},
		{"metadata full", with(func(s *abi.DmPoolStatus) { s.UsedMetaBlocks = 2048 }), 0},
		// Large metadata: the reserve is capped at 1024 blocks (4 MiB).
		{"reserve capped", with(func(s *abi.DmPoolStatus) { s.TotalMetaBlocks, s.UsedMetaBlocks = 100000, 98970 }), 4096 * 6 / 48 * 64 * kib},
		{"failed", with(func(s *abi.DmPoolStatus) { s.Failed = true }), 0},
		{"read-only", with(func(s *abi.DmPoolStatus) { s.ReadOnly = true }), 0},
		{"needs check", with(func(s *abi.DmPoolStatus) { s.NeedsCheck = true }), 0},
		{"out of data space", with(func(s *abi.DmPoolStatus) { s.OutOfDataSpace = true }), 0},
		{"no block size", with(func(s *abi.DmPoolStatus) { s.BlockSectors = 0 }), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := capacity(tc.st)
			if got != tc.want {
				t.Errorf("capacity %d, want %d", got, tc.want)
			}
			if (got == 0) != (why != "") {
				t.Errorf("reason %q for %d", why, got)
			}
		})
	}
}

func TestGetCapacity(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	f.status.UsedDataBlocks = 1000
	resp, err := b.GetCapacity(&abi.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.AvailableBytes != 3096*64*kib || resp.MinimumVolumeSize != mib || resp.MaximumVolumeSize != 0 {
		t.Errorf("capacity %+v", resp)
	}
	resp, err = b.GetCapacity(&abi.GetCapacityRequest{Topology: &abi.Topology{Segments: map[string]string{TopologyKey: "node-2"}}})
	if err != nil || resp.AvailableBytes != 0 {
		t.Errorf("another node's capacity %+v %v", resp, err)
	}
}

func TestPoolHealth(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   abi.DmPoolStatus
		want []string
	}{
		{"healthy", abi.DmPoolStatus{TotalDataBlocks: 100, UsedDataBlocks: 50, TotalMetaBlocks: 100, UsedMetaBlocks: 10}, nil},
		{"failed", abi.DmPoolStatus{Failed: true}, []string{"PoolFailed"}},
		{"data low", abi.DmPoolStatus{TotalDataBlocks: 100, UsedDataBlocks: 96, TotalMetaBlocks: 100}, []string{"PoolDataLow"}},
		{"metadata low", abi.DmPoolStatus{TotalDataBlocks: 100, TotalMetaBlocks: 100, UsedMetaBlocks: 99}, []string{"PoolMetadataLow"}},
		{"out of space, read-only", abi.DmPoolStatus{TotalDataBlocks: 100, UsedDataBlocks: 100, TotalMetaBlocks: 100, OutOfDataSpace: true, ReadOnly: true},
			[]string{"PoolReadOnly", "PoolOutOfDataSpace"}},
		{"needs check", abi.DmPoolStatus{TotalDataBlocks: 100, TotalMetaBlocks: 100, NeedsCheck: true}, []string{"PoolNeedsCheck"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range poolHealth(&tc.st, testPool) {
				got = append(got, e.Reason)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("reasons %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStorageHealth(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	h, err := b.StorageHealth()
	if err != nil || len(h.Entries) != 0 {
		t.Errorf("healthy pool: %+v %v", h, err)
	}
	f.pool = nil // the pool device went away
	h, err = b.StorageHealth()
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Status != abi.HealthInaccessible {
		t.Errorf("missing pool: %+v %v", h, err)
	}
}

// TestVolumeHealth: the pool's conditions, a thin device deleted behind
// the daemon's back, and on a node a staged device that is gone or
// another one.
func TestVolumeHealth(t *testing.T) {
	f := newSystem(t)
	b := configured(t)
	v := create(t, b, "pvc-health", 32*mib)
	r := ref(v)
	id := idOf(t, v.LocalID)
	reasons := func(req *abi.VolumeHealthRequest) []string {
		t.Helper()
		h, err := b.VolumeHealth(req)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range h.Entries {
			out = append(out, e.Reason)
		}
		return out
	}
	controller := &abi.VolumeHealthRequest{Volume: r}
	if got := reasons(controller); len(got) != 0 {
		t.Fatalf("a new volume: %v", got)
	}
	st, err := b.NodeStage(&abi.NodeStageRequest{Volume: r, StagingPath: "/staging", Capability: blockCap()[0]})
	if err != nil {
		t.Fatal(err)
	}
	node := &abi.VolumeHealthRequest{Volume: r, OnNode: true, Device: st.Device}
	if got := reasons(node); len(got) != 0 {
		t.Fatalf("a staged volume: %v", got)
	}
	if got := reasons(&abi.VolumeHealthRequest{Volume: r, OnNode: true, Device: "/dev/mapper/other"}); !slices.Equal(got, []string{"DeviceChanged"}) {
		t.Errorf("staged on another device: %v", got)
	}
	f.status.OutOfDataSpace, f.status.UsedDataBlocks = true, f.status.TotalDataBlocks
	if got := reasons(node); !slices.Equal(got, []string{"PoolOutOfDataSpace"}) {
		t.Errorf("pool out of data space: %v", got)
	}
	f.status.OutOfDataSpace, f.status.UsedDataBlocks, f.status.ReadOnly, f.status.NeedsCheck = false, 0, true, true
	if got := reasons(controller); !slices.Equal(got, []string{"PoolNeedsCheck", "PoolReadOnly"}) {
		t.Errorf("pool read-only, needs check: %v", got)
	}
	f.status.ReadOnly, f.status.NeedsCheck = false, false
	f.thin(id).active = false // removed behind the daemon's back
	if got := reasons(node); !slices.Equal(got, []string{"DeviceMissing"}) {
		t.Errorf("staged device removed: %v", got)
	}
	if got := reasons(controller); len(got) != 0 {
		t.Errorf("controller, volume inactive: %v", got)
	}
	delete(f.pool.thins, id) // and deleted from the pool
	h, err := b.VolumeHealth(controller)
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Reason != "ThinDeviceDeleted" || h.Entries[0].Status != abi.HealthDataLoss {
		t.Errorf("thin deleted: %+v, %v", h, err)
	}
	f.status.Failed = true
	if got := reasons(controller); !slices.Equal(got, []string{"PoolFailed"}) {
		t.Errorf("failed pool: %v", got)
	}
	if _, err := b.VolumeHealth(&abi.VolumeHealthRequest{Volume: abi.VolumeRef{LocalID: "x-1"}}); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("not a dmthin volume: %v", err)
	}
}

func TestSnapshotData(t *testing.T) {
	newSystem(t)
	b := configured(t)
	v := create(t, b, "pvc-data", 32*mib)
	sn, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snap-data", Source: ref(v)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.SnapshotData(&abi.SnapshotDataRequest{Snapshot: abi.SnapshotRef{LocalID: sn.LocalID, Context: sn.Context, SizeBytes: sn.SizeBytes}})
	if err != nil || got.ThinPool != testPool || got.ThinID != idOf(t, sn.LocalID) || got.SizeBytes != 32*mib || got.Path != "" {
		t.Fatalf("snapshot data %+v, %v", got, err)
	}
	if _, err := b.SnapshotData(&abi.SnapshotDataRequest{Snapshot: abi.SnapshotRef{LocalID: v.LocalID}}); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("a volume's ID as a snapshot: %v", err)
	}
}

func TestLocalIDs(t *testing.T) {
	for _, tc := range []struct {
		kind byte
		in   string
		id   uint32
		ok   bool
	}{
		{'t', "t-1", 1, true},
		{'t', "t-16777215", maxThinID, true},
		{'s', "s-42", 42, true},
		{'t', "s-42", 0, false},
		{'t', "t-0", 0, false},
		{'t', "t-01", 0, false},
		{'t', "t-+1", 0, false},
		{'t', "t-16777216", 0, false},
		{'t', "t-", 0, false},
		{'t', "t-1a", 0, false},
		{'t', "", 0, false},
	} {
		id, ok := parseLocalID(tc.kind, tc.in)
		if id != tc.id || ok != tc.ok {
			t.Errorf("parseLocalID(%c, %q) = %d, %v", tc.kind, tc.in, id, ok)
		}
		if ok && localID(tc.kind, id) != tc.in {
			t.Errorf("localID round trip of %q", tc.in)
		}
	}
}

func TestOwners(t *testing.T) {
	// The probe sequence stays inside 1..maxThinID and wraps.
	o := owner{home: maxThinID - 1}
	if got := []uint32{o.probe(0), o.probe(1), o.probe(2)}; !slices.Equal(got, []uint32{maxThinID, 1, 2}) {
		t.Errorf("wrapping probes %v", got)
	}
	// Owners are stable (ids must not move between releases) and differ
	// per name and kind.
	if got := fnv64('t', "pvc-1"); got != fnv64('t', "pvc-1") || got == fnv64('t', "pvc-2") || got == fnv64('s', "pvc-1") {
		t.Error("fnv64 is not a function of kind and name")
	}
	// The hash is FNV-1a 64 of "<kind>/<name>", as hash/fnv computes it.
	for _, name := range []string{"", "pvc-1", "snapshot-ü"} {
		h := fnv.New64a()
		h.Write([]byte("s/" + name))
		if got := fnv64('s', name); got != h.Sum64() {
			t.Errorf("fnv64(s, %q) = %x, want %x", name, got, h.Sum64())
		}
	}
	seen := map[uint32]bool{}
	for i := 0; i < 1000; i++ {
		o := ownerOf(kindVolume, "pvc-"+strconv.Itoa(i))
		if o.tag < 1 || o.tag > 1<<ownerBits {
			t.Fatalf("tag %d out of range", o.tag)
		}
		seen[o.probe(0)] = true
	}
	if len(seen) < 990 {
		t.Errorf("1000 names share %d home slots", len(seen))
	}
}

// A module refused at load leaves no loop devices behind.
func TestRefusedConfigureReleasesLoops(t *testing.T) {
	f := newSystem(t)
	f.failNext(abi.HostCallDmPoolOpen, abi.Errorf(abi.Unavailable, "device-mapper is not available"))
	err := New().Configure(&abi.ConfigureRequest{Config: testConfig(), Roots: testRoots, NodeID: testNode, Role: "all"})
	wantCode(t, "configure without device-mapper", err, abi.Unavailable)
	if len(f.loops) != 0 {
		t.Fatalf("loop devices left attached: %v", f.loops)
	}
}

// data_size creates a missing development pool file.
func TestDataSizeCreatesFile(t *testing.T) {
	f := newSystem(t)
	delete(f.files, "/files/data")
	c := testConfig()
	c[configDataSize] = "64Mi"
	if err := New().Configure(&abi.ConfigureRequest{Config: c, Roots: testRoots, NodeID: testNode, Role: "all"}); err != nil {
		t.Fatal(err)
	}
	if f.files["/files/data"] != 64*mib {
		t.Fatalf("data file: %d bytes", f.files["/files/data"])
	}
}
