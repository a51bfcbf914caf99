package host_test

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/wasmcsi/wasmcsi/examples/lvm/lvmmodule"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmfake"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Start-up finds storage no record explains (list_owned): the lvm backend
// on a fake volume group, where a crash left a tagged LV of a volume and
// one of a snapshot that no record names (a CreateSnapshot cut off before
// its record, a create answered with an error after lvcreate). Without
// reconcile.clean_storage they are reported and kept (reconcile.clean,
// which releases mounts and attachments, deletes no storage); with it they
// are removed,
// while every recorded volume and snapshot and the operator's untagged LV
// stay, and the daemon serves its volumes as before.
func TestStartupRemovesUnrecordedStorage(t *testing.T) {
	requireRoot(t)
	f := lvmfake.New(t)
	f.LVs["db"] = &lvmfake.LV{Name: "db", Size: 64 << 20, Active: true, Tags: []string{"operator"}}
	var fakes []hostcalls.Func
	for _, fn := range lvm.BindingsWith(f) {
		fn.Available = nil
		fakes = append(fakes, fn)
	}
	wasm := lvmmodule.Module(t, moduletest.Go)
	d := startDaemon(t, daemonOptions{backend: "lvm", wasm: wasm, hostcalls: lvmmodule.HostCalls, hostCalls: fakes,
		config:     map[string]string{"class.thick": "vg0", "class.thin": "vg0/pool0", "default_class": "thin"},
		extraRoots: []string{"lvm:vg0", "lvm:vg0:pool0"}})
	ctx := context.Background()
	ctl := d.controller()
	blockCaps := []*csi.VolumeCapability{blockAccess}
	kept, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-kept", VolumeCapabilities: blockCaps,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-kept", SourceVolumeId: kept.GetVolume().GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	thick, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-thick", VolumeCapabilities: blockCaps,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}, Parameters: map[string]string{"deviceClass": "thick"}})
	if err != nil {
		t.Fatal(err)
	}
	// What a crash leaves: the module's LVs, tagged, with no record.
	f.LVs["v-pvc-lost-0123456789abcdef"] = &lvmfake.LV{Name: "v-pvc-lost-0123456789abcdef", Pool: "pool0", Size: 8 << 20,
		Tags: []string{"wasmcsi.dev", "wasmcsi.dev/name=pvc-lost"}}
	f.LVs["s-snapshot-lost-0123456789abcdef"] = &lvmfake.LV{Name: "s-snapshot-lost-0123456789abcdef", Pool: "pool0", Size: 8 << 20,
		Origin: "v-pvc-lost-0123456789abcdef", RO: true, Tags: []string{"wasmcsi.dev"}}
	lvs := func() string {
		var names []string
		for n := range f.LVs {
			names = append(names, n)
		}
		return strings.Join(sortedStrings(names), " ")
	}
	recorded := []string{"db", "pool0", kept.GetVolume().GetVolumeId(), snap.GetSnapshot().GetSnapshotId(), thick.GetVolume().GetVolumeId()}

	d.restart(t) // clean off: reported, kept
	if _, ok := f.LVs["v-pvc-lost-0123456789abcdef"]; !ok {
		t.Errorf("without reconcile.clean_storage an unrecorded LV was removed: %s", lvs())
	}
	d.cfg.Reconcile.Clean = true
	d.restart(t) // mounts and attachments only
	if _, ok := f.LVs["v-pvc-lost-0123456789abcdef"]; !ok {
		t.Errorf("reconcile.clean alone removed an unrecorded LV: %s", lvs())
	}
	d.cfg.Reconcile.CleanStorage = true
	d.restart(t)
	for _, n := range []string{"v-pvc-lost-0123456789abcdef", "s-snapshot-lost-0123456789abcdef"} {
		if _, ok := f.LVs[n]; ok {
			t.Errorf("start-up left the unrecorded LV %s: %s", n, lvs())
		}
	}
	if len(f.LVs) != 5 || f.LVs["db"] == nil || f.LVs["db"].Size != 64<<20 || !f.LVs["db"].Active {
		t.Errorf("start-up touched recorded or foreign LVs %v: %s", recorded, lvs())
	}
	for _, c := range f.Commands {
		if strings.Contains(c, "vg0/db") && !strings.HasPrefix(c, "lvs ") {
			t.Errorf("a command touched the operator's LV: %s", c)
		}
	}
	// The recorded ones still serve.
	ctl = d.controller()
	if _, err := ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []*csi.CreateVolumeResponse{kept, thick} {
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
	if got := lvs(); got != "db pool0" {
		t.Errorf("after the deletions: %s", got)
	}
}

func sortedStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}
