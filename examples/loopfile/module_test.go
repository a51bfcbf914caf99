//go:build !wasip1

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Tests of the built module (.wasm, both toolchains) in the daemon's
// runtime against the real host calls: real files in a temporary pool and
// real loop devices.

func requireLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: attaches real loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
}

// loadReal loads the module built with tc, granted file and loop over a
// fresh pool folder. Every loop device left over a file of the pool is
// detached when the test ends, also when it fails.
func loadReal(t *testing.T, tc moduletest.Toolchain, cfg map[string]string) (*moduletest.Module, string) {
	t.Helper()
	wasm := moduletest.Build(t, ".", tc)
	pool := t.TempDir()
	t.Cleanup(func() { detachPool(t, pool) })
	m := moduletest.Load(t, wasm, moduletest.Options{
		Name:      "loopfile",
		HostCalls: catalog.All(),
		Grant:     modules.Grant{HostCalls: []string{"file", "loop"}, Roots: []string{pool}, Config: cfg},
	})
	return m, pool
}

func detachPool(t *testing.T, pool string) {
	devs, err := loop.List(context.Background())
	if err != nil {
		t.Errorf("list loop devices: %v", err)
		return
	}
	for _, d := range devs {
		if strings.HasPrefix(d.BackingFile, pool+"/") {
			if err := loop.Detach(context.Background(), d.Path); err != nil {
				t.Errorf("detach %s (%s): %v", d.Path, d.BackingFile, err)
			}
		}
	}
}

// call runs op and fails the test on an error.
func call[R any, PR interface {
	*R
	abi.Message
}](t *testing.T, m *moduletest.Module, op abi.Op, req abi.Message) PR {
	t.Helper()
	resp := PR(new(R))
	if err := m.Call(op, req, resp); err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	return resp
}

// pattern is 4 KiB of bytes that say where they were written.
func pattern(tag string, off int64) []byte {
	b := bytes.Repeat([]byte(tag+"@"+itoa(off)+";"), 4096)
	return b[:4096]
}

func writeAt(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("write %s at %d: %v", path, off, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s at %d: %v", path, off, err)
	}
	return b
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestModuleLifecycle drives one volume through its life with the real
// host calls: create, stage on a loop device, write, snapshot, restore,
// clone, expand (file and device), health, unstage, delete.
func TestModuleLifecycle(t *testing.T) {
	requireLoop(t)
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			m, pool := loadReal(t, tc, map[string]string{"granularity": "4Mi"})
			ctx := context.Background()

			vol := call[abi.CreateVolumeResponse](t, m, abi.OpCreateVolume, &abi.CreateVolumeRequest{
				Name: "data", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap}})
			path := vol.Context[ctxPath]
			if filepath.Dir(path) != pool || vol.CapacityBytes != 16*sdk.MiB || fileSize(t, path) != 16*sdk.MiB {
				t.Fatalf("created %+v in pool %s", vol, pool)
			}
			ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context, CapacityBytes: vol.CapacityBytes}

			// Stage: a real loop device over the file; data written to
			// the device lands in the file.
			st := call[abi.NodeStageResponse](t, m, abi.OpNodeStage, &abi.NodeStageRequest{
				Volume: ref, StagingPath: "/unused", Capability: blockCap})
			d, ok, err := loop.Find(ctx, path)
			if err != nil || !ok || d.Path != st.Device || d.SizeBytes != 16*sdk.MiB || d.ReadOnly {
				t.Fatalf("after stage: device %+v found=%v err=%v, stage answered %s", d, ok, err, st.Device)
			}
			writeAt(t, st.Device, 0, pattern("a", 0))
			writeAt(t, st.Device, 8*sdk.MiB, pattern("a", 8*sdk.MiB))
			if got := readAt(t, path, 8*sdk.MiB, 4096); !bytes.Equal(got, pattern("a", 8*sdk.MiB)) {
				t.Fatalf("file does not hold what was written to %s", st.Device)
			}
			if again := call[abi.NodeStageResponse](t, m, abi.OpNodeStage, &abi.NodeStageRequest{
				Volume: ref, StagingPath: "/unused", Capability: blockCap}); again.Device != st.Device {
				t.Errorf("re-stage answered %s, first %s", again.Device, st.Device)
			}
			health := call[abi.HealthResponse](t, m, abi.OpVolumeHealth, &abi.VolumeHealthRequest{Volume: ref, OnNode: true, Device: st.Device})
			if len(health.Entries) != 0 {
				t.Errorf("staged volume unhealthy: %+v", health.Entries)
			}
			var empty abi.Empty
			if err := m.Call(abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: ref}, &empty); abi.CodeOf(err) != abi.FailedPrecondition {
				t.Errorf("delete of an attached volume: %v, want FAILED_PRECONDITION", err)
			}

			// Snapshot, restore (bigger) and clone hold the data.
			sn := call[abi.CreateSnapshotResponse](t, m, abi.OpCreateSnapshot, &abi.CreateSnapshotRequest{Name: "snap", Source: ref})
			if !sn.ReadyToUse || sn.SizeBytes != 16*sdk.MiB || !strings.HasSuffix(sn.Context[ctxPath], ".snap") {
				t.Fatalf("snapshot %+v", sn)
			}
			writeAt(t, st.Device, 0, pattern("b", 0)) // after the snapshot
			snRef := abi.SnapshotRef{LocalID: sn.LocalID, Context: sn.Context, SizeBytes: sn.SizeBytes, Source: ref}
			data := call[abi.SnapshotDataResponse](t, m, abi.OpSnapshotData, &abi.SnapshotDataRequest{Snapshot: snRef})
			if data.Path != sn.Context[ctxPath] || data.SizeBytes != 16*sdk.MiB {
				t.Errorf("snapshot data %+v", data)
			}
			restored := call[abi.CreateVolumeResponse](t, m, abi.OpCreateVolume, &abi.CreateVolumeRequest{
				Name: "restored", RequiredBytes: 32 * sdk.MiB, Capabilities: []abi.Capability{blockCap},
				Source: &abi.VolumeSource{Snapshot: &snRef}})
			rpath := restored.Context[ctxPath]
			if restored.CapacityBytes != 32*sdk.MiB || fileSize(t, rpath) != 32*sdk.MiB {
				t.Errorf("restored %+v, file %d bytes", restored, fileSize(t, rpath))
			}
			if !bytes.Equal(readAt(t, rpath, 0, 4096), pattern("a", 0)) || !bytes.Equal(readAt(t, rpath, 8*sdk.MiB, 4096), pattern("a", 8*sdk.MiB)) {
				t.Errorf("restored volume does not hold the snapshot's data")
			}
			clone := call[abi.CreateVolumeResponse](t, m, abi.OpCreateVolume, &abi.CreateVolumeRequest{
				Name: "clone", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{blockCap},
				Source: &abi.VolumeSource{Volume: &ref}})
			if !bytes.Equal(readAt(t, clone.Context[ctxPath], 0, 4096), pattern("b", 0)) {
				t.Errorf("clone does not hold the source's current data")
			}

			// Expand: the file on the controller, the device on the node.
			exp := call[abi.ExpandVolumeResponse](t, m, abi.OpExpandVolume, &abi.ExpandVolumeRequest{Volume: ref, RequiredBytes: 48 * sdk.MiB})
			if exp.CapacityBytes != 48*sdk.MiB || !exp.NodeExpansionRequired || fileSize(t, path) != 48*sdk.MiB {
				t.Errorf("expand: %+v, file %d bytes", exp, fileSize(t, path))
			}
			nexp := call[abi.NodeExpandResponse](t, m, abi.OpNodeExpand, &abi.NodeExpandRequest{Volume: ref, Device: st.Device, RequiredBytes: 48 * sdk.MiB})
			if d, _, _ := loop.Find(ctx, path); nexp.CapacityBytes != 48*sdk.MiB || d.SizeBytes != 48*sdk.MiB {
				t.Errorf("node expand answered %d, device shows %d", nexp.CapacityBytes, d.SizeBytes)
			}

			// prealloc=true on the staged volume allocates its whole file
			// and keeps what the workload wrote.
			mod := call[abi.ModifyVolumeResponse](t, m, abi.OpModifyVolume, &abi.ModifyVolumeRequest{Volume: ref, MutableParameters: map[string]string{"prealloc": "true"}})
			var fst unix.Stat_t
			if err := unix.Stat(path, &fst); err != nil || fst.Blocks*512 < 48*sdk.MiB || mod.Context[ctxPrealloc] != "true" {
				t.Errorf("after prealloc=true: %d of %d bytes allocated (%v), context %v", fst.Blocks*512, fst.Size, err, mod.Context)
			}
			if !bytes.Equal(readAt(t, path, 0, 4096), pattern("b", 0)) || !bytes.Equal(readAt(t, path, 8*sdk.MiB, 4096), pattern("a", 8*sdk.MiB)) {
				t.Errorf("prealloc=true changed the volume's data")
			}

			// Unstage detaches; the node then sees the volume unreachable.
			call[abi.Empty](t, m, abi.OpNodeUnstage, &abi.NodeUnstageRequest{Volume: ref, Device: st.Device, StageContext: st.Context})
			if _, ok, _ := loop.Find(ctx, path); ok {
				t.Errorf("%s still attached after unstage", path)
			}
			call[abi.Empty](t, m, abi.OpNodeUnstage, &abi.NodeUnstageRequest{Volume: ref, Device: st.Device, StageContext: st.Context})
			health = call[abi.HealthResponse](t, m, abi.OpVolumeHealth, &abi.VolumeHealthRequest{Volume: ref, OnNode: true, Device: st.Device})
			if len(health.Entries) != 1 || health.Entries[0].Reason != "LoopDeviceDetached" {
				t.Errorf("node health after unstage: %+v", health.Entries)
			}

			capResp := call[abi.GetCapacityResponse](t, m, abi.OpGetCapacity, &abi.GetCapacityRequest{})
			if capResp.AvailableBytes <= 0 || capResp.MaximumVolumeSize < capResp.AvailableBytes || capResp.AvailableBytes%(4*sdk.MiB) != 0 {
				t.Errorf("capacity %+v", capResp)
			}

			// Delete everything; the pool ends empty.
			for _, v := range []*abi.CreateVolumeResponse{vol, restored, clone} {
				r := abi.VolumeRef{LocalID: v.LocalID, Context: v.Context}
				call[abi.Empty](t, m, abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: r})
				call[abi.Empty](t, m, abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: r})
			}
			health = call[abi.HealthResponse](t, m, abi.OpVolumeHealth, &abi.VolumeHealthRequest{Volume: ref})
			if len(health.Entries) != 1 || health.Entries[0].Reason != "VolumeFileMissing" {
				t.Errorf("controller health of a deleted volume: %+v", health.Entries)
			}
			call[abi.Empty](t, m, abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: snRef})
			call[abi.Empty](t, m, abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: snRef})
			if left, _ := os.ReadDir(pool); len(left) != 0 {
				t.Errorf("pool not empty: %v", left)
			}
		})
	}
}

// TestModuleReadOnlyStage attaches reader-only volumes read-only, and a
// mount volume of xfs at xfs's minimum size.
func TestModuleReadOnlyStage(t *testing.T) {
	requireLoop(t)
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			m, _ := loadReal(t, tc, map[string]string{"fs_type": "xfs", "prealloc": "false"})
			vol := call[abi.CreateVolumeResponse](t, m, abi.OpCreateVolume, &abi.CreateVolumeRequest{
				Name: "ro", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeReadOnly}}})
			if vol.CapacityBytes != 300*sdk.MiB || vol.Context[ctxFsType] != "xfs" {
				t.Fatalf("xfs volume %+v", vol)
			}
			ref := abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context}
			st := call[abi.NodeStageResponse](t, m, abi.OpNodeStage, &abi.NodeStageRequest{
				Volume: ref, Capability: abi.Capability{AccessMode: abi.AccessSingleNodeReadOnly}})
			d, ok, err := loop.Find(context.Background(), vol.Context[ctxPath])
			if err != nil || !ok || !d.ReadOnly || d.Path != st.Device {
				t.Errorf("reader-only stage: %+v found=%v err=%v", d, ok, err)
			}
			// A writer stage of the same attached file is refused.
			var resp abi.NodeStageResponse
			if err := m.Call(abi.OpNodeStage, &abi.NodeStageRequest{Volume: ref, Capability: abi.Capability{AccessMode: abi.AccessSingleNodeWriter}}, &resp); abi.CodeOf(err) != abi.FailedPrecondition {
				t.Errorf("writer stage over a read-only attachment: %v, want FAILED_PRECONDITION", err)
			}
			call[abi.Empty](t, m, abi.OpNodeUnstage, &abi.NodeUnstageRequest{Volume: ref, Device: st.Device})
		})
	}
}

// TestModuleRefusesBadConfig: the daemon's runtime refuses the module at
// load when configure rejects the operator's config.
func TestModuleRefusesBadConfig(t *testing.T) {
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			wasm := moduletest.Build(t, ".", tc)
			dir := t.TempDir()
			data, err := os.ReadFile(wasm)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "loopfile.wasm"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			grant := modules.Grant{HostCalls: []string{"file", "loop"}, Roots: []string{t.TempDir()}, Config: map[string]string{"fs_type": "ntfs"}}
			rt, err := modules.New(ctx, modules.Config{
				Dir: dir, HostCalls: catalog.All(), Grants: map[string]modules.Grant{"loopfile": grant},
				Limits: modules.Limits{CallTimeout: 5 * time.Second, MemoryPages: 4096, PoolSize: 1, AcquireTimeout: time.Second},
				OnLoad: func(ctx context.Context, m *modules.Module) error {
					req := abi.ConfigureRequest{Config: grant.Config, Roots: grant.Roots, NodeID: "n1", Role: "all"}
					_, err := m.Call(ctx, abi.OpConfigure, req.AppendWire(nil))
					return err
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close(ctx)
			errs := rt.Load(ctx)
			if err := errs["loopfile"]; abi.CodeOf(err) != abi.InvalidArgument || !strings.Contains(err.Error(), "fs_type") {
				t.Errorf("load with fs_type ntfs: %v, want INVALID_ARGUMENT naming fs_type", err)
			}
			if _, ok := rt.Module("loopfile"); ok {
				t.Error("module with a bad config is loaded")
			}
		})
	}
}
