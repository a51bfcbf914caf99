//go:build !wasip1

package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// realBackend configures a Backend natively against the real dir host
// calls, confined to a fresh pool like a granted module.
func realBackend(t *testing.T, pool string, config map[string]string) (*Backend, error) {
	t.Helper()
	hostcall.SetHost(moduletest.RealHost(catalog.All(), []string{pool}))
	t.Cleanup(func() { hostcall.SetHost(nil) })
	b := New()
	return b, b.Configure(&abi.ConfigureRequest{Roots: []string{pool}, NodeID: "n1", Config: config})
}

// Names and IDs can never reach outside the pool: hostile names become
// plain directory names, and forged local IDs or planted symlinks are
// refused by the host calls' confinement.
func TestNoEscape(t *testing.T) {
	dir := t.TempDir()
	pool := filepath.Join(dir, "pool")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{pool, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := realBackend(t, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "../outside", RequiredBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := filepath.Dir(resp.Context["path"]); got != pool {
		t.Fatalf("volume for a hostile name lives in %s, not the pool", got)
	}
	for _, id := range []string{"..", ".", "../outside", "v-x/../../outside"} {
		err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: id}})
		if err == nil {
			t.Errorf("DeleteVolume(%q) succeeded", id)
		}
		if _, err := b.NodeStage(&abi.NodeStageRequest{Volume: abi.VolumeRef{LocalID: id}}); err == nil {
			t.Errorf("NodeStage(%q) named a directory", id)
		}
	}
	// A symlink planted in the pool under a volume's name.
	if err := os.Symlink(outside, filepath.Join(pool, "v-planted")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "s", Source: abi.VolumeRef{LocalID: "v-planted"}}); err == nil {
		t.Error("CreateSnapshot copied through a planted symlink")
	}
	if _, err := b.NodeStage(&abi.NodeStageRequest{Volume: abi.VolumeRef{LocalID: "v-planted"}}); err == nil {
		t.Error("NodeStage named a planted symlink")
	}
	// Deleting removes the link itself, never what it points to.
	_ = b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: "v-planted"}})
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("a file outside the pool was touched: %v", err)
	}
}

func TestConfigure(t *testing.T) {
	pool := t.TempDir()
	if _, err := realBackend(t, pool, map[string]string{"quota": "sometimes"}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("bad quota mode: %v", err)
	}
	if _, err := realBackend(t, pool, map[string]string{"colour": "blue"}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("unknown key: %v", err)
	}
	if _, err := realBackend(t, pool, map[string]string{"quota": "off"}); err != nil {
		t.Fatal(err)
	}
}

// offers reports whether backend_info, as the daemon reads it, lists op.
func offers(t *testing.T, b *Backend, op abi.Op) bool {
	t.Helper()
	out, code := sdk.Dispatch(b, abi.OpInfo, nil)
	var info abi.BackendInfo
	if code != abi.OK {
		t.Fatalf("backend_info: %s %s", code, out)
	}
	if err := info.UnmarshalWire(out); err != nil {
		t.Fatal(err)
	}
	return slices.Contains(info.Ops, string(op))
}

// TestExpandWithoutQuotas: on a pool without quotas capacity is advisory
// from creation on, and expansion is offered all the same and records the
// new advisory size, so the plugin-wide EXPAND_VOLUME holds for localdir
// on every pool. A volume whose directory is gone is NOT_FOUND.
func TestExpandWithoutQuotas(t *testing.T) {
	b, err := realBackend(t, t.TempDir(), map[string]string{"quota": "off"})
	if err != nil {
		t.Fatal(err)
	}
	if !offers(t, b, abi.OpExpandVolume) {
		t.Fatal("expansion not offered without quotas")
	}
	vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "grow", RequiredBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if vol.Context["quota"] != "false" {
		t.Errorf("volume context %v does not say capacity is not enforced", vol.Context)
	}
	resp, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: abi.VolumeRef{LocalID: vol.LocalID, Context: vol.Context, CapacityBytes: 1 << 20}, RequiredBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if resp.CapacityBytes != 2<<20 || resp.NodeExpansionRequired {
		t.Errorf("expansion answered %+v, want 2 MiB and no node step", resp)
	}
	if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: abi.VolumeRef{LocalID: "v-gone"}, RequiredBytes: 2 << 20}); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("ExpandVolume of a missing directory: %v, want NOT_FOUND", err)
	}
}

func TestParameters(t *testing.T) {
	b, err := realBackend(t, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "p", RequiredBytes: 1, Parameters: map[string]string{"speed": "fast"}}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("unknown parameter: %v", err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "p", RequiredBytes: 1, Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": "x"}}); err != nil {
		t.Errorf("the CO's own parameter: %v", err)
	}
}

func TestTopology(t *testing.T) {
	b, err := realBackend(t, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	other := []abi.Topology{{Segments: map[string]string{TopologyKey: "n2"}}}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 1, Requisite: other}); abi.CodeOf(err) != abi.ResourceExhausted {
		t.Errorf("volume on an excluded node: %v", err)
	}
	here := append(other, abi.Topology{Segments: map[string]string{TopologyKey: "n1"}})
	resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "v", RequiredBytes: 1, Requisite: here})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Topology) != 1 || resp.Topology[0].Segments[TopologyKey] != "n1" {
		t.Errorf("topology %v", resp.Topology)
	}
}
