//go:build !wasip1

package main

import (
	"context"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmfake"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

var testRoots = []string{"lvm:vg0", "lvm:vg0:pool0"}

func testConfig() map[string]string {
	return map[string]string{"class.thick": "vg0", "class.thin": "vg0/pool0", "default_class": "thin"}
}

// hostFuncs are the real lvm host calls over the fake volume group.
func hostFuncs(f *lvmfake.VG) map[string]hostcalls.Func {
	out := map[string]hostcalls.Func{}
	for _, fn := range lvm.BindingsWith(f) {
		fn.Available = nil
		out[fn.Name] = fn
	}
	return out
}

// setup installs the family over a fake VG as the native host and
// configures a backend with both classes.
func setup(t *testing.T) (*Backend, *lvmfake.VG) {
	t.Helper()
	f := lvmfake.New(t)
	funcs := hostFuncs(f)
	hostcall.SetHost(func(name string, req []byte) ([]byte, error) {
		fn, ok := funcs[name]
		if !ok {
			return nil, abi.Errorf(abi.Unimplemented, "no host call %s", name)
		}
		return fn.Call(context.Background(), &hostcalls.Env{Module: "lvm", Roots: testRoots}, req)
	})
	t.Cleanup(func() { hostcall.SetHost(nil) })
	b := New()
	if err := b.Configure(&abi.ConfigureRequest{Config: testConfig(), Roots: testRoots, NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	return b, f
}

func blockCap() []abi.Capability {
	return []abi.Capability{{Block: true, AccessMode: abi.AccessSingleNodeWriter}}
}

func ref(v *abi.CreateVolumeResponse) abi.VolumeRef {
	return abi.VolumeRef{LocalID: v.LocalID, Context: v.Context, CapacityBytes: v.CapacityBytes}
}

func TestConfigure(t *testing.T) {
	for _, c := range []struct {
		config map[string]string
		roots  []string
		want   string
	}{
		{map[string]string{"class.a": "vg1"}, testRoots, "not granted"},
		{map[string]string{"class.a": "vg0/other"}, testRoots, "not granted"},
		{map[string]string{"class.a": "vg0", "class.b": "vg0/pool0"}, testRoots, ""},
		{map[string]string{"class.a": "vg0", "default_class": "b"}, testRoots, "no device class"},
		{map[string]string{"class.a": "vg0/pool0,stripes=2"}, testRoots, "thin pool's own"},
		{map[string]string{"class.a": "vg0,stripes=x"}, testRoots, "stripes"},
		{map[string]string{"pool": "x"}, testRoots, "unknown config key"},
		{map[string]string{}, testRoots, "no device class"},
	} {
		_, err := parseConfig(&abi.ConfigureRequest{Config: c.config, Roots: c.roots, NodeID: "n1"})
		if c.want == "" {
			if err != nil {
				t.Errorf("%v: %v", c.config, err)
			}
			continue
		}
		if abi.CodeOf(err) != abi.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want INVALID_ARGUMENT with %q", c.config, err, c.want)
		}
	}
}

// The controller's decisions on a fake VG with an operator's own LVs in
// it: thick and thin volumes by device class, unknown classes, a size
// beyond free space, restore into a larger volume, clone, expansion,
// snapshots only of thin volumes, deletion, and the operator's LVs
// untouched throughout.
func TestVolumes(t *testing.T) {
	b, f := setup(t)
	f.LVs["db"] = &lvmfake.LV{Name: "db", Size: 64 << 20, Active: true, Tags: []string{"operator"}}
	create := func(name, class string, size int64, src *abi.VolumeSource) (*abi.CreateVolumeResponse, error) {
		params := map[string]string{}
		if class != "" {
			params[paramDeviceClass] = class
		}
		return b.CreateVolume(&abi.CreateVolumeRequest{Name: name, RequiredBytes: size, Parameters: params, Capabilities: blockCap(), Source: src})
	}
	thick, err := create("pvc-thick", "thick", 10<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	lv := f.LVs[thick.LocalID]
	if lv == nil || lv.Pool != "" || lv.Size != 12<<20 || thick.CapacityBytes != 12<<20 || !strings.HasPrefix(thick.LocalID, "v-pvc-thick-") {
		t.Fatalf("thick %+v, LV %+v", thick, lv)
	}
	if lv.Active {
		t.Error("a new volume is left active")
	}
	if again, err := create("pvc-thick", "thick", 10<<20, nil); err != nil || again.LocalID != thick.LocalID {
		t.Errorf("repeat: %+v %v", again, err)
	}
	if _, err := create("pvc-thick", "thick", 40<<20, nil); abi.CodeOf(err) != abi.AlreadyExists {
		t.Errorf("same name, larger: %v", err)
	}
	if _, err := create("pvc-x", "fast", 10<<20, nil); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("unknown class: %v", err)
	}
	before := len(f.LVs)
	if _, err := create("pvc-big", "thick", 2<<30, nil); abi.CodeOf(err) != abi.ResourceExhausted {
		t.Errorf("beyond free space: %v", err)
	}
	if len(f.LVs) != before || f.Ran("lvcreate") != 1 {
		t.Errorf("a refused create made something: %v", f.Commands)
	}
	if _, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snap-thick", Source: ref(thick)}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("snapshot of a thick volume: %v", err)
	}

	thin, err := create("pvc-thin", "", 16<<20, nil) // the default class
	if err != nil {
		t.Fatal(err)
	}
	if f.LVs[thin.LocalID].Pool != "pool0" || thin.Context[ctxPool] != "pool0" {
		t.Fatalf("thin %+v", thin)
	}
	snap, err := b.CreateSnapshot(&abi.CreateSnapshotRequest{Name: "snapshot-1", Source: ref(thin)})
	if err != nil {
		t.Fatal(err)
	}
	if s := f.LVs[snap.LocalID]; s == nil || s.Origin != thin.LocalID || !s.RO || s.Active || snap.SizeBytes != 16<<20 {
		t.Errorf("snapshot %+v, LV %+v", snap, s)
	}
	sref := abi.SnapshotRef{LocalID: snap.LocalID, Context: snap.Context, SizeBytes: snap.SizeBytes}
	restored, err := create("pvc-restored", "thin", 40<<20, &abi.VolumeSource{Snapshot: &sref})
	if err != nil {
		t.Fatal(err)
	}
	if r := f.LVs[restored.LocalID]; r == nil || r.Origin != snap.LocalID || r.RO || r.Size != 40<<20 || restored.CapacityBytes != 40<<20 {
		t.Errorf("restored %+v, LV %+v", restored, r)
	}
	// Restoring into a thick class cannot share blocks: refused.
	if _, err := create("pvc-r2", "thick", 40<<20, &abi.VolumeSource{Snapshot: &sref}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("restore into a thick class: %v", err)
	}
	tref := ref(thin)
	clone, err := create("pvc-clone", "thin", 1<<20, &abi.VolumeSource{Volume: &tref})
	if err != nil {
		t.Fatal(err)
	}
	if c := f.LVs[clone.LocalID]; c.Origin != thin.LocalID || c.Size != 16<<20 {
		t.Errorf("clone LV %+v", c)
	}
	// The source goes; a repeat of the clone's create still answers it.
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: tref}); err != nil {
		t.Fatal(err)
	}
	f.LVs[clone.LocalID].Origin = "" // LVM forgets a removed origin
	if again, err := create("pvc-clone", "thin", 1<<20, &abi.VolumeSource{Volume: &tref}); err != nil || again.LocalID != clone.LocalID {
		t.Errorf("repeat of the clone after its source went: %+v %v", again, err)
	}
	ex, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: ref(thick), RequiredBytes: 30 << 20})
	if err != nil || ex.CapacityBytes != 32<<20 || !ex.NodeExpansionRequired || f.LVs[thick.LocalID].Size != 32<<20 {
		t.Errorf("expand %+v %v", ex, err)
	}
	if err := b.DeleteSnapshot(&abi.DeleteSnapshotRequest{Snapshot: sref}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []*abi.CreateVolumeResponse{thick, restored, clone, thin} {
		if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref(v)}); err != nil {
			t.Errorf("delete %s: %v", v.LocalID, err)
		}
	}
	if len(f.LVs) != 2 || f.LVs["db"] == nil || f.LVs["db"].Size != 64<<20 || !f.LVs["db"].Active {
		t.Errorf("left: %v", f.LVs)
	}
	for _, c := range f.Commands {
		if strings.Contains(c, "vg0/db") && !strings.HasPrefix(c, "lvs ") {
			t.Errorf("a command touched the operator's LV: %s", c)
		}
	}
}

func TestCapacityAndHealth(t *testing.T) {
	b, f := setup(t)
	capOf := func(class string, topo *abi.Topology) int64 {
		t.Helper()
		c, err := b.GetCapacity(&abi.GetCapacityRequest{Parameters: map[string]string{paramDeviceClass: class}, Topology: topo})
		if err != nil {
			t.Fatal(err)
		}
		return c.AvailableBytes
	}
	if got := capOf("thick", nil); got != 768<<20 {
		t.Errorf("thick capacity %d, want the VG's free 768 MiB", got)
	}
	if got := capOf("thin", nil); got != 224<<20 {
		t.Errorf("thin capacity %d, want 7/8 of the 256 MiB pool", got)
	}
	if got := capOf("thick", &abi.Topology{Segments: map[string]string{TopologyKey: "n2"}}); got != 0 {
		t.Errorf("another node's capacity %d", got)
	}
	if _, err := b.GetCapacity(&abi.GetCapacityRequest{Parameters: map[string]string{paramDeviceClass: "nope"}}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("capacity of an unknown class: %v", err)
	}
	v, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-h", RequiredBytes: 8 << 20, Capabilities: blockCap()})
	if err != nil {
		t.Fatal(err)
	}
	health := func() []string {
		t.Helper()
		h, err := b.VolumeHealth(&abi.VolumeHealthRequest{Volume: ref(v)})
		if err != nil {
			t.Fatal(err)
		}
		var reasons []string
		for _, e := range h.Entries {
			reasons = append(reasons, e.Reason)
		}
		return reasons
	}
	if r := health(); len(r) != 0 {
		t.Errorf("healthy volume: %v", r)
	}
	f.PoolData = "91.00"
	if r := health(); strings.Join(r, ",") != "PoolDataNearlyFull" {
		t.Errorf("pool 91%% full: %v", r)
	}
	f.PoolData, f.PoolHealth = "12.00", 'M'
	if r := health(); strings.Join(r, ",") != "PoolReadOnly" {
		t.Errorf("read-only pool: %v", r)
	}
	if got := capOf("thin", nil); got != 0 {
		t.Errorf("capacity of a read-only pool %d", got)
	}
	f.PoolHealth = '-'
	delete(f.LVs, v.LocalID)
	if r := health(); strings.Join(r, ",") != "LogicalVolumeMissing" {
		t.Errorf("LV gone: %v", r)
	}
}
