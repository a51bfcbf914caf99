package host_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// ControllerModifyVolume and mutable parameters at CreateVolume, against a
// daemon serving loopfile (whose prealloc is mutable) and localdir (which
// has no mutable parameter), on real volume files.

// modifyDaemon serves loopfile, the default backend, and localdir.
func modifyDaemon(t *testing.T) *daemon {
	t.Helper()
	requireRoot(t)
	if _, err := os.Stat("../examples/loopfile"); err != nil {
		t.Skip("example modules not present: ", err)
	}
	ld := localdirOptions(t)
	d := startDaemon(t, daemonOptions{
		backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go),
		hostcalls: []string{"file", "loop"},
		more:      []daemonModule{{name: "localdir", wasm: ld.wasm, hostcalls: ld.hostcalls, config: ld.config}},
	})
	releaseUnder(t, filepath.Dir(d.pool))
	return d
}

// allocatedBytes is what the filesystem holds for the volume's file
// (st_blocks), and its apparent size.
func allocatedBytes(t *testing.T, v *csi.Volume) (allocated, size int64) {
	t.Helper()
	path := v.GetVolumeContext()["path"]
	if path == "" {
		t.Fatalf("volume %s has no path in its context %v", v.GetVolumeId(), v.GetVolumeContext())
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512, st.Size
}

func blockCaps() []*csi.VolumeCapability {
	return []*csi.VolumeCapability{loopCapability(true)}
}

// TestModifyVolumeAdvertised: MODIFY_VOLUME is advertised when a loaded
// backend implements modify_volume, and not when none does.
func TestModifyVolumeAdvertised(t *testing.T) {
	has := func(d *daemon) bool {
		resp, err := d.controller().ControllerGetCapabilities(callCtx(t), &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(resp.GetCapabilities(), func(c *csi.ControllerServiceCapability) bool {
			return c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME
		})
	}
	if !has(modifyDaemon(t)) {
		t.Error("loopfile is loaded, MODIFY_VOLUME is not advertised")
	}
	if has(startDaemon(t, localdirOptions(t))) {
		t.Error("only localdir is loaded, MODIFY_VOLUME is advertised")
	}
}

// TestModifyVolumePreallocates: setting loopfile's mutable prealloc on a
// sparse volume allocates every block of its file at once, the volume's
// record keeps the new value (an expansion afterwards preallocates its new
// part, also after a daemon restart), and a repeat is success.
func TestModifyVolumePreallocates(t *testing.T) {
	d := modifyDaemon(t)
	v := createVolume(t, d, &csi.CreateVolumeRequest{Name: "sparse", VolumeCapabilities: blockCaps(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}})
	if got, size := allocatedBytes(t, v); size != 32<<20 || got > 1<<20 {
		t.Fatalf("new sparse volume: %d of %d bytes allocated", got, size)
	}
	modify := &csi.ControllerModifyVolumeRequest{VolumeId: v.GetVolumeId(), MutableParameters: map[string]string{"prealloc": "true"}}
	for i := range 2 {
		if _, err := d.controller().ControllerModifyVolume(callCtx(t), modify); err != nil {
			t.Fatalf("ControllerModifyVolume #%d: %v", i+1, err)
		}
		if got, size := allocatedBytes(t, v); got < size {
			t.Fatalf("after modify #%d: %d of %d bytes allocated", i+1, got, size)
		}
	}

	d.restart(t)
	if _, err := d.controller().ControllerExpandVolume(callCtx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapability: loopCapability(true),
	}); err != nil {
		t.Fatal(err)
	}
	if got, size := allocatedBytes(t, v); size != 64<<20 || got < size {
		t.Fatalf("expanded after modify and restart: %d of %d bytes allocated, want all", got, size)
	}

	// Back to sparse: the next expansion leaves its new part as holes.
	modify.MutableParameters["prealloc"] = "false"
	if _, err := d.controller().ControllerModifyVolume(callCtx(t), modify); err != nil {
		t.Fatal(err)
	}
	if _, err := d.controller().ControllerExpandVolume(callCtx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 96 << 20}, VolumeCapability: loopCapability(true),
	}); err != nil {
		t.Fatal(err)
	}
	if got, size := allocatedBytes(t, v); size != 96<<20 || got > 65<<20 {
		t.Fatalf("expanded after prealloc=false: %d of %d bytes allocated, want the first 64 MiB", got, size)
	}
}

// TestCreateVolumeMutableParameters: mutable parameters at CreateVolume
// take precedence over the StorageClass's, are checked against what the
// backend can change (nothing is created otherwise), and count for a
// repeated CreateVolume.
func TestCreateVolumeMutableParameters(t *testing.T) {
	d := modifyDaemon(t)
	req := &csi.CreateVolumeRequest{Name: "vac", VolumeCapabilities: blockCaps(),
		CapacityRange:     &csi.CapacityRange{RequiredBytes: 16 << 20},
		Parameters:        map[string]string{"prealloc": "false"},
		MutableParameters: map[string]string{"prealloc": "true"}}
	v := createVolume(t, d, req)
	if got, size := allocatedBytes(t, v); got < size {
		t.Fatalf("created with mutable prealloc=true over prealloc=false: %d of %d bytes allocated", got, size)
	}
	if _, err := d.controller().CreateVolume(callCtx(t), req); err != nil {
		t.Fatalf("repeated CreateVolume: %v", err)
	}
	again := &csi.CreateVolumeRequest{Name: req.Name, VolumeCapabilities: req.VolumeCapabilities, CapacityRange: req.CapacityRange,
		Parameters: req.Parameters, MutableParameters: map[string]string{"prealloc": "false"}}
	_, err := d.controller().CreateVolume(callCtx(t), again)
	wantCode(t, err, codes.AlreadyExists, "mutable")

	for _, tc := range []struct {
		name    string
		params  map[string]string
		mutable map[string]string
		words   []string
	}{
		{"unknown key", nil, map[string]string{"XXX_FakeKey": "x"}, []string{"XXX_FakeKey", "prealloc"}},
		{"the backend parameter", nil, map[string]string{backendParam: "localdir"}, []string{backendParam}},
		{"bad value", nil, map[string]string{"prealloc": "maybe"}, []string{"maybe"}},
		{"backend without mutable parameters", map[string]string{backendParam: "localdir"}, map[string]string{"prealloc": "true"}, []string{"localdir", "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "refused-" + filepath.Base(tc.name)
			caps := blockCaps()
			if tc.params[backendParam] == "localdir" {
				caps = rwCaps()
			}
			_, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: caps,
				Parameters: tc.params, MutableParameters: tc.mutable})
			wantCode(t, err, codes.InvalidArgument, tc.words...)
			list, err := d.controller().ListVolumes(callCtx(t), &csi.ListVolumesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(list.GetEntries()); n != 1 {
				t.Errorf("%d volumes after a refused CreateVolume, want the one from before", n)
			}
		})
	}
	for _, pool := range d.pools {
		entries, _ := os.ReadDir(pool)
		if len(entries) > 1 {
			t.Errorf("pool %s holds %d entries after refused creates, want at most 1", pool, len(entries))
		}
	}
}

// TestModifyVolumeErrors: the spec's error table, and a refused request
// changes nothing.
func TestModifyVolumeErrors(t *testing.T) {
	d := modifyDaemon(t)
	v := createVolume(t, d, &csi.CreateVolumeRequest{Name: "errs", VolumeCapabilities: blockCaps(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}})
	dir := createVolume(t, d, &csi.CreateVolumeRequest{Name: "dir", Parameters: map[string]string{backendParam: "localdir"}})
	c := d.controller()

	_, err := c.ControllerModifyVolume(callCtx(t), &csi.ControllerModifyVolumeRequest{MutableParameters: map[string]string{"prealloc": "true"}})
	wantCode(t, err, codes.InvalidArgument, "volume_id")
	_, err = c.ControllerModifyVolume(callCtx(t), &csi.ControllerModifyVolumeRequest{VolumeId: "loopfile:nope", MutableParameters: map[string]string{"prealloc": "true"}})
	wantCode(t, err, codes.NotFound)
	_, err = c.ControllerModifyVolume(callCtx(t), &csi.ControllerModifyVolumeRequest{VolumeId: "nope"})
	wantCode(t, err, codes.NotFound)

	for _, tc := range []struct {
		name  string
		id    string
		param map[string]string
		words []string
	}{
		{"unknown key", v.GetVolumeId(), map[string]string{"prealloc": "true", "XXX_FakeKey": "x"}, []string{"XXX_FakeKey", "prealloc"}},
		{"immutable key", v.GetVolumeId(), map[string]string{"fsType": "xfs"}, []string{"fsType"}},
		{"bad value", v.GetVolumeId(), map[string]string{"prealloc": "maybe"}, []string{"maybe"}},
		{"backend without mutable parameters", dir.GetVolumeId(), map[string]string{"prealloc": "true"}, []string{"localdir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ControllerModifyVolume(callCtx(t), &csi.ControllerModifyVolumeRequest{VolumeId: tc.id, MutableParameters: tc.param})
			wantCode(t, err, codes.InvalidArgument, tc.words...)
		})
	}
	if got, _ := allocatedBytes(t, v); got > 1<<20 {
		t.Errorf("refused modifications allocated %d bytes", got)
	}
	// Nothing asked, nothing to do: success on any backend.
	for _, id := range []string{v.GetVolumeId(), dir.GetVolumeId()} {
		if _, err := c.ControllerModifyVolume(callCtx(t), &csi.ControllerModifyVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("ControllerModifyVolume %s with no parameters: %v", id, err)
		}
	}
}
