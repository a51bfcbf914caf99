package host_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Rules of the CSI spec that csi-sanity does not check, against a daemon
// serving localdir (quotas off) and the fault fixture.

// specDaemon serves localdir and the fault fixture, whose gated
// create_volume holds a call (and its locks) until the test releases it.
func specDaemon(t *testing.T) (*daemon, *gate) {
	t.Helper()
	g := newGate()
	t.Cleanup(g.release)
	o := localdirOptions(t)
	o.more = []daemonModule{faultModule(nil)}
	o.hostCalls = append(o.hostCalls, g.hostCall())
	return startDaemon(t, o), g
}

// TestCreateVolumeConcurrentSameName: while one CreateVolume of a name is
// in progress, a second one of that name is ABORTED (never run twice), a
// call for another name proceeds, and once the first has won, a repeat
// answers its volume.
func TestCreateVolumeConcurrentSameName(t *testing.T) {
	d, g := specDaemon(t)
	fault := map[string]string{backendParam: "fault"}
	req := &csi.CreateVolumeRequest{Name: "wait-same", Parameters: fault, VolumeCapabilities: rwCaps()}

	type result struct {
		resp *csi.CreateVolumeResponse
		err  error
	}
	first := make(chan result, 1)
	go func() {
		resp, err := d.controller().CreateVolume(callCtx(t), req)
		first <- result{resp, err}
	}()
	select {
	case name := <-g.entered:
		if name != req.Name {
			t.Fatalf("gate entered by %q", name)
		}
	case r := <-first:
		t.Fatalf("first CreateVolume ended before reaching the module: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("first CreateVolume never reached the module")
	}

	// Same name, same arguments: ABORTED while the first runs.
	_, err := d.controller().CreateVolume(callCtx(t), req)
	wantCode(t, err, codes.Aborted, "wait-same")
	// Same name on another backend: the lock is the name's, not the backend's.
	_, err = d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: "wait-same", VolumeCapabilities: rwCaps()})
	wantCode(t, err, codes.Aborted)
	// Another name is not held up.
	other := createVolume(t, d, &csi.CreateVolumeRequest{Name: "other-name"})
	if other.GetVolumeId() == "" {
		t.Fatal("no volume ID")
	}

	g.release()
	var r result
	select {
	case r = <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("first CreateVolume did not finish after the gate opened")
	}
	if r.err != nil {
		t.Fatalf("first CreateVolume: %v", r.err)
	}
	id := r.resp.GetVolume().GetVolumeId()
	t.Cleanup(func() { d.controller().DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}) })
	if id != "fault@test-node:wait-same" {
		t.Errorf("volume ID %q, want fault@test-node:wait-same", id)
	}
	again, err := d.controller().CreateVolume(callCtx(t), req)
	if err != nil || again.GetVolume().GetVolumeId() != id {
		t.Fatalf("repeat after the first won: %v, %v", again, err)
	}
	// The repeat came from the record: the module was called once.
	select {
	case name := <-g.entered:
		t.Errorf("module called again for %q", name)
	default:
	}
	vols, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range vols.GetEntries() {
		if e.GetVolume().GetVolumeId() == id {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%s listed %d times", id, n)
	}
}

// TestCreateVolumeSameNameOtherArguments: a name taken with other
// arguments is ALREADY_EXISTS, never the old volume.
func TestCreateVolumeSameNameOtherArguments(t *testing.T) {
	d, _ := specDaemon(t)
	const mib = 1 << 20
	base := func() *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{
			Name:               "taken",
			CapacityRange:      &csi.CapacityRange{RequiredBytes: mib},
			VolumeCapabilities: rwCaps(),
			Parameters:         map[string]string{},
		}
	}
	vol := createVolume(t, d, base())
	cases := []struct {
		name   string
		change func(*csi.CreateVolumeRequest)
		code   codes.Code
	}{
		{"identical", func(*csi.CreateVolumeRequest) {}, codes.OK},
		{"range still met", func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: mib / 2, LimitBytes: 2 * mib}
		}, codes.OK},
		{"larger required", func(r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = 2 * mib }, codes.AlreadyExists},
		{"limit below capacity", func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{LimitBytes: mib / 2} }, codes.AlreadyExists},
		{"other access mode", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)}
		}, codes.AlreadyExists},
		{"other mount flags", func(r *csi.CreateVolumeRequest) {
			c := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
			c.GetMount().MountFlags = []string{"noatime"}
			r.VolumeCapabilities = []*csi.VolumeCapability{c}
		}, codes.AlreadyExists},
		{"other parameters", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"tier": "fast"} }, codes.AlreadyExists},
		{"other backend", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{backendParam: "fault"} }, codes.AlreadyExists},
		{"other content source", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}}
		}, codes.AlreadyExists},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := base()
			c.change(req)
			resp, err := d.controller().CreateVolume(callCtx(t), req)
			if c.code == codes.OK {
				if err != nil || resp.GetVolume().GetVolumeId() != vol.GetVolumeId() || resp.GetVolume().GetCapacityBytes() != vol.GetCapacityBytes() {
					t.Fatalf("got %v, %v; want the existing volume %v", resp, err, vol)
				}
				return
			}
			wantCode(t, err, c.code, "taken")
		})
	}
}

// TestCreateVolumeParameters: a backend parameter naming no loaded backend,
// and a StorageClass parameter the backend does not accept, are
// INVALID_ARGUMENT before anything is provisioned.
func TestCreateVolumeParameters(t *testing.T) {
	d, _ := specDaemon(t)
	_, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
		Name: "nobackend", VolumeCapabilities: rwCaps(), Parameters: map[string]string{backendParam: "nosuch"},
	})
	wantCode(t, err, codes.InvalidArgument, "nosuch", "not loaded")
	if entries, _ := os.ReadDir(d.pool); len(entries) != 0 {
		t.Errorf("pool holds %d entries after refused creates", len(entries))
	}
}

// TestCreateVolumeUnknownParameter: a backend that takes StorageClass
// parameters refuses one it does not know with INVALID_ARGUMENT, and the
// host passes that code to the CO. loopfile's CreateVolume needs no root
// or loop device.
func TestCreateVolumeUnknownParameter(t *testing.T) {
	if _, err := os.Stat("../examples/loopfile"); err != nil {
		t.Skip("example modules not present: ", err)
	}
	d := startDaemon(t, daemonOptions{backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go), hostcalls: []string{"file", "loop"}})
	_, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
		Name: "unknownparam", VolumeCapabilities: rwCaps(), CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
		Parameters: map[string]string{"no-such-parameter": "1"},
	})
	wantCode(t, err, codes.InvalidArgument, "no-such-parameter")
	if entries, _ := os.ReadDir(d.pool); len(entries) != 0 {
		t.Errorf("pool holds %d entries after a refused create", len(entries))
	}
}

// TestCreateVolumeSizes: sizes are rounded up to the backend's granularity
// (localdir: 4096 bytes), a missing size is the backend's default (1 GiB)
// or the most the limit allows, and OUT_OF_RANGE answers a range no
// multiple of the granularity fits.
func TestCreateVolumeSizes(t *testing.T) {
	d, _ := specDaemon(t)
	const gib, mib = 1 << 30, 1 << 20
	cases := []struct {
		name            string
		required, limit int64
		want            int64 // 0: OUT_OF_RANGE
	}{
		{"one byte", 1, 0, 4096},
		{"one over a unit", 4097, 0, 8192},
		{"exact", 8192, 8192, 8192},
		{"rounded within limit", 5000, 8192, 8192},
		{"default", 0, 0, gib},
		{"limit only", 0, mib + 100, mib},
		{"limit only above default", 0, 2 * gib, gib},
		{"no unit fits", 5000, 6000, 0},
		{"limit below a unit", 0, 100, 0},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := &csi.CreateVolumeRequest{
				Name: fmt.Sprintf("size-%d", i), VolumeCapabilities: rwCaps(),
				CapacityRange: &csi.CapacityRange{RequiredBytes: c.required, LimitBytes: c.limit},
			}
			if c.want == 0 {
				_, err := d.controller().CreateVolume(callCtx(t), req)
				wantCode(t, err, codes.OutOfRange, "4096")
				return
			}
			v := createVolume(t, d, req)
			if v.GetCapacityBytes() != c.want {
				t.Errorf("capacity %d, want %d", v.GetCapacityBytes(), c.want)
			}
			got, err := d.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()})
			if err != nil || got.GetVolume().GetCapacityBytes() != c.want {
				t.Errorf("recorded capacity: %v, %v", got, err)
			}
		})
	}
}

// TestDeleteVolumeUnknown: deleting what does not exist is success, for
// IDs of a loaded backend, of an unknown backend and of no format at all.
func TestDeleteVolumeUnknown(t *testing.T) {
	d, _ := specDaemon(t)
	for _, id := range []string{"localdir:v-never-created", "fault:never", "nosuch:x", "not an id of ours"} {
		if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume %q: %v", id, err)
		}
	}
	v := createVolume(t, d, &csi.CreateVolumeRequest{Name: "deleted-twice"})
	for i := range 2 {
		if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Errorf("DeleteVolume #%d: %v", i+1, err)
		}
	}
	if _, err := d.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()}); status.Code(err) != codes.NotFound {
		t.Errorf("ControllerGetVolume after delete: %v, want NOT_FOUND", err)
	}
}

// TestListVolumesPaging: max_entries 1 walks every volume exactly once, a
// deletion during the walk does not disturb it, and a token the plugin did
// not issue is ABORTED.
func TestListVolumesPaging(t *testing.T) {
	d, _ := specDaemon(t)
	want := map[string]bool{}
	for i := range 5 {
		want[createVolume(t, d, &csi.CreateVolumeRequest{Name: fmt.Sprintf("page-%d", i)}).GetVolumeId()] = true
	}
	want[createVolume(t, d, &csi.CreateVolumeRequest{Name: "page-fault", Parameters: map[string]string{backendParam: "fault"}}).GetVolumeId()] = true

	walk := func(t *testing.T, max int32, during func(seen []string)) []string {
		var seen []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatal("ListVolumes does not end")
			}
			resp, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{MaxEntries: max, StartingToken: token})
			if err != nil {
				t.Fatalf("page %d: %v", pages, err)
			}
			if max > 0 && len(resp.GetEntries()) > int(max) {
				t.Fatalf("page %d has %d entries, max_entries %d", pages, len(resp.GetEntries()), max)
			}
			for _, e := range resp.GetEntries() {
				seen = append(seen, e.GetVolume().GetVolumeId())
			}
			if during != nil {
				during(seen)
			}
			if token = resp.GetNextToken(); token == "" {
				return seen
			}
		}
	}
	t.Run("max 1", func(t *testing.T) {
		seen := walk(t, 1, nil)
		if len(seen) != len(want) || len(slices.Compact(slices.Sorted(slices.Values(seen)))) != len(want) {
			t.Fatalf("walk saw %v, want each of %d volumes once", seen, len(want))
		}
		for _, id := range seen {
			if !want[id] {
				t.Errorf("unexpected volume %s", id)
			}
		}
	})
	t.Run("unpaged, within the budget", func(t *testing.T) {
		resp, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
		if err != nil || len(resp.GetEntries()) != len(want) || resp.GetNextToken() != "" {
			t.Fatalf("ListVolumes without max_entries: %d entries, next_token %q, %v; want all %d in one answer", len(resp.GetEntries()), resp.GetNextToken(), err, len(want))
		}
	})
	t.Run("unpaged, past the budget", func(t *testing.T) {
		// A budget of one byte: each answer ends after its first chunk.
		setUnpaged(t, 1, 2)
		seen := walk(t, 0, nil)
		if len(seen) != len(want) || len(slices.Compact(slices.Sorted(slices.Values(seen)))) != len(want) {
			t.Fatalf("unpaged walk saw %v, want each of %d volumes once", seen, len(want))
		}
		resp, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
		if err != nil || len(resp.GetEntries()) != 2 || resp.GetNextToken() == "" {
			t.Fatalf("first unpaged answer: %d entries, next_token %q, %v; want 2 and a token", len(resp.GetEntries()), resp.GetNextToken(), err)
		}
	})
	t.Run("deletion during the walk", func(t *testing.T) {
		var deleted string
		seen := walk(t, 2, func(seen []string) {
			if deleted == "" {
				deleted = seen[0]
				if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: deleted}); err != nil {
					t.Fatal(err)
				}
			}
		})
		if len(seen) != len(want) || len(slices.Compact(slices.Sorted(slices.Values(seen)))) != len(want) {
			t.Fatalf("walk saw %v, want each of %d volumes once", seen, len(want))
		}
		delete(want, deleted)
	})
	t.Run("bad token", func(t *testing.T) {
		for _, tok := range []string{"not-a-token", "zzzz:zzzz", "\x00"} {
			_, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{MaxEntries: 1, StartingToken: tok})
			wantCode(t, err, codes.Aborted)
		}
	})
}

// setUnpaged sets the byte budget and the chunk of unpaged List answers
// for the rest of t.
func setUnpaged(t *testing.T, budget, chunk int) {
	t.Cleanup(host.SetUnpaged(budget, chunk))
}

// TestListSnapshotsUnpagedBounded: a ListSnapshots without max_entries past
// the byte budget ends with a next_token, and following it lists every
// snapshot once, also filtered by source volume.
func TestListSnapshotsUnpagedBounded(t *testing.T) {
	d, _ := specDaemon(t)
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "snapsrc"})
	want := map[string]bool{}
	for i := range 5 {
		sn, err := d.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: fmt.Sprintf("snap-%d", i), SourceVolumeId: vol.GetVolumeId()})
		if err != nil {
			t.Fatal(err)
		}
		want[sn.GetSnapshot().GetSnapshotId()] = true
	}
	setUnpaged(t, 1, 2)
	for _, src := range []string{"", vol.GetVolumeId()} {
		var seen []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatal("ListSnapshots does not end")
			}
			resp, err := d.controller().ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{SourceVolumeId: src, StartingToken: token})
			if err != nil {
				t.Fatalf("source %q, page %d: %v", src, pages, err)
			}
			if len(resp.GetEntries()) > 2 {
				t.Fatalf("source %q, page %d: %d entries past a budget of one byte and chunks of 2", src, pages, len(resp.GetEntries()))
			}
			for _, e := range resp.GetEntries() {
				seen = append(seen, e.GetSnapshot().GetSnapshotId())
			}
			if token = resp.GetNextToken(); token == "" {
				break
			}
		}
		if len(seen) != len(want) || len(slices.Compact(slices.Sorted(slices.Values(seen)))) != len(want) {
			t.Errorf("source %q: walk saw %v, want each of %d snapshots once", src, seen, len(want))
		}
	}
}

// TestOperationBackendLacks: an operation on a volume whose backend lacks
// it is UNIMPLEMENTED and names the backend, although the plugin-wide
// capability is advertised for the backends that have it.
func TestOperationBackendLacks(t *testing.T) {
	d, _ := specDaemon(t)
	faulty := createVolume(t, d, &csi.CreateVolumeRequest{Name: "nosnap", Parameters: map[string]string{backendParam: "fault"}})

	_, err := d.controller().ControllerExpandVolume(callCtx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: faulty.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}, VolumeCapability: rwCap,
	})
	wantCode(t, err, codes.Unimplemented, "fault")
	got, err := d.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: faulty.GetVolumeId()})
	if err != nil || got.GetVolume().GetCapacityBytes() != faulty.GetCapacityBytes() {
		t.Errorf("after refused expansion: %v, %v (want %d recorded)", got, err, faulty.GetCapacityBytes())
	}

	caps, err := d.controller().ControllerGetCapabilities(callCtx(t), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasControllerCap(caps, csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT) {
		t.Fatal("snapshots not advertised although localdir has them")
	}
	_, err = d.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "snap-of-fault", SourceVolumeId: faulty.GetVolumeId()})
	wantCode(t, err, codes.Unimplemented, "fault")
	if _, err := d.controller().ListSnapshots(callCtx(t), &csi.ListSnapshotsRequest{SourceVolumeId: faulty.GetVolumeId()}); err != nil {
		t.Errorf("ListSnapshots: %v", err)
	}
}

// TestExpandAdvisoryCapacity: localdir on a pool without quotas (the
// default pool of make run) keeps the EXPAND_VOLUME the daemon advertises:
// its capacity was advisory at creation, and expansion records the new
// advisory size instead of answering UNIMPLEMENTED.
func TestExpandAdvisoryCapacity(t *testing.T) {
	d, _ := specDaemon(t)
	local := createVolume(t, d, &csi.CreateVolumeRequest{Name: "advisory", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
	if local.GetVolumeContext()["quota"] != "false" {
		t.Errorf("volume context %v does not say the capacity is not enforced", local.GetVolumeContext())
	}
	resp, err := d.controller().ControllerExpandVolume(callCtx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: local.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}, VolumeCapability: rwCap,
	})
	if err != nil {
		t.Fatalf("ControllerExpandVolume: %v", err)
	}
	if resp.GetCapacityBytes() != 2<<20 || resp.GetNodeExpansionRequired() {
		t.Errorf("expansion answered %v, want 2 MiB and no node step", resp)
	}
	got, err := d.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: local.GetVolumeId()})
	if err != nil || got.GetVolume().GetCapacityBytes() != 2<<20 {
		t.Errorf("after expansion: %v, %v (want 2 MiB recorded)", got, err)
	}
}

func hasControllerCap(resp *csi.ControllerGetCapabilitiesResponse, want csi.ControllerServiceCapability_RPC_Type) bool {
	for _, c := range resp.GetCapabilities() {
		if c.GetRpc().GetType() == want {
			return true
		}
	}
	return false
}

// TestNodePublishWithoutStage: publishing a volume that is not staged (at
// that staging path) is FAILED_PRECONDITION and mounts nothing.
func TestNodePublishWithoutStage(t *testing.T) {
	d, _ := specDaemon(t)
	v := createVolume(t, d, &csi.CreateVolumeRequest{Name: "unstaged"})
	w := workDir(t)
	_, err := d.node().NodePublishVolume(callCtx(t), &csi.NodePublishVolumeRequest{
		VolumeId: v.GetVolumeId(), StagingTargetPath: stagingPath(w, "unstaged"), TargetPath: targetPath(w, "unstaged"),
		VolumeCapability: rwCap, VolumeContext: v.GetVolumeContext(),
	})
	wantCode(t, err, codes.FailedPrecondition, "not staged")
	if ms := mountsUnder(t, w); len(ms) != 0 {
		t.Errorf("mounts after a refused publish: %v", ms)
	}
}

// localVolume is a localdir volume with its node paths.
type localVolume struct {
	vol             *csi.Volume
	staging, target string
}

func newLocalVolume(t *testing.T, d *daemon, name string) *localVolume {
	t.Helper()
	w := workDir(t)
	return &localVolume{vol: createVolume(t, d, &csi.CreateVolumeRequest{Name: name}), staging: stagingPath(w, name), target: targetPath(w, name)}
}

func (v *localVolume) stage(ctx context.Context, d *daemon) error {
	_, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext(),
	})
	return err
}

func (v *localVolume) publish(ctx context.Context, d *daemon) error {
	_, err := d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext(),
	})
	return err
}

func (v *localVolume) unpublish(ctx context.Context, d *daemon) error {
	_, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.vol.GetVolumeId(), TargetPath: v.target})
	return err
}

func (v *localVolume) unstage(ctx context.Context, d *daemon) error {
	_, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging})
	return err
}

// wantMounts checks that the staging and target paths carry exactly the
// given number of mounts each.
func (v *localVolume) wantMounts(t *testing.T, staging, target int) {
	t.Helper()
	if n := mountsAt(t, v.staging); n != staging {
		t.Errorf("%d mounts at the staging path, want %d", n, staging)
	}
	if n := mountsAt(t, v.target); n != target {
		t.Errorf("%d mounts at the target path, want %d", n, target)
	}
}

// TestNodeStagePublishIdempotent: repeated NodeStage and NodePublish add
// no second mount; NodeUnstage while published is FAILED_PRECONDITION and
// leaves both mounts; the volume's data is visible at the target.
func TestNodeStagePublishIdempotent(t *testing.T) {
	requireRoot(t)
	d, _ := specDaemon(t)
	v := newLocalVolume(t, d, "idem")
	ctx := callCtx(t)
	for i := range 3 {
		if err := v.stage(ctx, d); err != nil {
			t.Fatalf("NodeStage #%d: %v", i+1, err)
		}
	}
	v.wantMounts(t, 1, 0)
	for i := range 3 {
		if err := v.publish(ctx, d); err != nil {
			t.Fatalf("NodePublish #%d: %v", i+1, err)
		}
	}
	v.wantMounts(t, 1, 1)
	if err := v.stage(ctx, d); err != nil {
		t.Fatalf("NodeStage while published: %v", err)
	}
	v.wantMounts(t, 1, 1)

	// The target shows the volume's directory in the pool.
	if err := os.WriteFile(filepath.Join(v.target, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(v.vol.GetVolumeContext()["path"], "hello")); err != nil {
		t.Errorf("write through the target did not reach the pool: %v", err)
	}

	wantCode(t, v.unstage(ctx, d), codes.FailedPrecondition, "published")
	v.wantMounts(t, 1, 1)

	for i := range 2 {
		if err := v.unpublish(ctx, d); err != nil {
			t.Fatalf("NodeUnpublish #%d: %v", i+1, err)
		}
	}
	v.wantMounts(t, 1, 0)
	if _, err := os.Stat(v.target); !os.IsNotExist(err) {
		t.Errorf("target path left behind: %v", err)
	}
	for i := range 2 {
		if err := v.unstage(ctx, d); err != nil {
			t.Fatalf("NodeUnstage #%d: %v", i+1, err)
		}
	}
	v.wantMounts(t, 0, 0)
}
