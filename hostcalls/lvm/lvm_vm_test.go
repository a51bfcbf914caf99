package lvm_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmtest"
)

// realCall runs a host call of the real family through the wire codec.
func realCall(t *testing.T, roots []string, name string, req, resp abi.Message) error {
	t.Helper()
	for _, fn := range lvm.Bindings() {
		if fn.Name != name {
			continue
		}
		start := time.Now()
		out, err := fn.Call(context.Background(), &hostcalls.Env{Module: "lvm", Roots: roots}, req.AppendWire(nil))
		t.Logf("%s: %v", name, time.Since(start).Round(time.Millisecond))
		if err != nil {
			return err
		}
		if resp != nil {
			if err := resp.UnmarshalWire(out); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	}
	t.Fatalf("no host call %s", name)
	return nil
}

func devSize(t *testing.T, path string) int64 {
	t.Helper()
	n, err := fs.DeviceSize(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// The family on a real volume group (VM tier): thick and thin LVs,
// repeat, extend live, thin snapshot and a larger writable copy with the
// data checked, the device owner check by device number, refusals, and
// the operator's untagged LV untouched throughout.
func TestFamilyOnVolumeGroup(t *testing.T) {
	fx := lvmtest.New(t, "fam", 256<<20, 96<<20)
	roots := fx.Roots()
	vg := fx.VG

	var vgs abi.LvmVgStatus
	if err := realCall(t, roots, abi.HostCallLvmVgStatus, &abi.LvmVgRequest{VG: vg}, &vgs); err != nil {
		t.Fatal(err)
	}
	if vgs.ExtentBytes != 1<<20 || vgs.FreeBytes <= 0 || vgs.FreeBytes >= vgs.SizeBytes {
		t.Errorf("vg %+v", vgs)
	}

	// Beyond the free space: RESOURCE_EXHAUSTED, nothing created.
	err := realCall(t, roots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: vg, Name: "too-big", SizeBytes: vgs.FreeBytes + 1<<20}, nil)
	if abi.CodeOf(err) != abi.ResourceExhausted {
		t.Errorf("create beyond free space: %v", err)
	}
	if err := realCall(t, roots, abi.HostCallLvmLvStatus, &abi.LvmLvRequest{VG: vg, Name: "too-big"}, nil); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("after the refused create: %v", err)
	}

	var thick abi.LvmLv
	if err := realCall(t, roots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: vg, Name: "thick-a", SizeBytes: 10<<20 + 512, Tags: []string{"wasmcsi.dev/name=a"}, Activate: true}, &thick); err != nil {
		t.Fatal(err)
	}
	if !thick.Active || thick.SizeBytes != 11<<20 || devSize(t, thick.Path) != 11<<20 || thick.ThinPool != "" {
		t.Errorf("thick %+v", thick)
	}
	var again abi.LvmLv
	if err := realCall(t, roots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: vg, Name: "thick-a", SizeBytes: 10 << 20}, &again); err != nil || !again.Existed || again.UUID != thick.UUID {
		t.Errorf("repeat %+v %v", again, err)
	}
	// The repeat without Activate left it as it was (it may be in use).
	if !again.Active {
		t.Errorf("a repeat without Activate deactivated it")
	}
	// The device owner check knows it by its number, active.
	if err := realCall(t, roots, abi.HostCallLvmLvActivate, &abi.LvmLvRequest{VG: vg, Name: "thick-a"}, &thick); err != nil {
		t.Fatal(err)
	}
	id, owned, err := lvm.Devices.OwnsDevice(context.Background(), hostcalls.Device{Path: thick.Path}, roots)
	if err != nil || !owned || id != thick.UUID {
		t.Errorf("owner of %s: %q %v %v", thick.Path, id, owned, err)
	}
	if _, owned, _ := lvm.Devices.OwnsDevice(context.Background(), hostcalls.Device{Path: fx.OperatorPath()}, roots); owned {
		t.Error("the operator's LV is claimed as the family's")
	}
	if _, owned, _ := lvm.Devices.OwnsDevice(context.Background(), hostcalls.Device{Path: thick.Path}, []string{"lvm:other"}); owned {
		t.Error("an LV of a VG not granted is claimed")
	}
	pattern := bytes.Repeat([]byte{0xa5}, 1<<20)
	writeAt(t, thick.Path, 0, pattern)
	var grown abi.LvmLv
	if err := realCall(t, roots, abi.HostCallLvmLvExtend, &abi.LvmExtendRequest{VG: vg, Name: "thick-a", SizeBytes: 20 << 20}, &grown); err != nil {
		t.Fatal(err)
	}
	if grown.SizeBytes != 20<<20 || devSize(t, thick.Path) != 20<<20 || !bytes.Equal(readAt(t, thick.Path, 0, 1<<20), pattern) {
		t.Errorf("grown live: %+v, device %d bytes", grown, devSize(t, thick.Path))
	}
	if err := realCall(t, roots, abi.HostCallLvmLvSnapshot, &abi.LvmSnapshotRequest{VG: vg, Origin: "thick-a", Name: "snap-thick"}, nil); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("snapshot of a thick LV: %v", err)
	}

	// Thin: create, write, snapshot, a larger writable copy of the snapshot.
	var thin abi.LvmLv
	if err := realCall(t, roots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: vg, Name: "thin-a", SizeBytes: 32 << 20, ThinPool: fx.Pool, Activate: true}, &thin); err != nil {
		t.Fatal(err)
	}
	if thin.ThinPool != fx.Pool || thin.SizeBytes != 32<<20 || thin.ThinID == 0 || devSize(t, thin.Path) != 32<<20 {
		t.Errorf("thin %+v", thin)
	}
	writeAt(t, thin.Path, 0, pattern)
	var snap abi.LvmLv
	if err := realCall(t, roots, abi.HostCallLvmLvSnapshot, &abi.LvmSnapshotRequest{VG: vg, Origin: "thin-a", Name: "snap-a", Tags: []string{"kind=snapshot"}}, &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Active || !snap.ReadOnly || snap.Origin != "thin-a" {
		t.Errorf("snapshot %+v", snap)
	}
	writeAt(t, thin.Path, 0, bytes.Repeat([]byte{0x11}, 1<<20))
	var copyLV abi.LvmLv
	if err := realCall(t, roots, abi.HostCallLvmLvSnapshot, &abi.LvmSnapshotRequest{VG: vg, Origin: "snap-a", Name: "restored", Writable: true, Activate: true, SizeBytes: 48 << 20}, &copyLV); err != nil {
		t.Fatal(err)
	}
	if !copyLV.Active || copyLV.ReadOnly || copyLV.SizeBytes != 48<<20 || devSize(t, copyLV.Path) != 48<<20 {
		t.Errorf("restored %+v", copyLV)
	}
	if !bytes.Equal(readAt(t, copyLV.Path, 0, 1<<20), pattern) {
		t.Error("the restored copy does not hold the snapshot's data")
	}
	var pool abi.LvmPoolStatus
	if err := realCall(t, roots, abi.HostCallLvmPoolStatus, &abi.LvmPoolRequest{VG: vg, Pool: fx.Pool}, &pool); err != nil {
		t.Fatal(err)
	}
	if !pool.Active || pool.SizeBytes != 96<<20 || pool.DataUsedBytes < 19<<20/10 || pool.DataUsedBytes > 4<<20 || pool.MetadataBytes == 0 {
		t.Errorf("pool %+v", pool)
	}
	var list abi.LvmLvList
	if err := realCall(t, roots, abi.HostCallLvmLvList, &abi.LvmListRequest{VG: vg}, &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, lv := range list.LVs {
		names = append(names, lv.Name)
	}
	if want := "restored snap-a thick-a thin-a"; joined(names) != want {
		t.Errorf("list: %s, want %s", joined(names), want)
	}
	// An open LV is not removed.
	f, err := os.Open(thin.Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := realCall(t, roots, abi.HostCallLvmLvRemove, &abi.LvmLvRequest{VG: vg, Name: "thin-a"}, nil); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Errorf("remove of an open LV: %v", err)
	}
	f.Close()
	for _, n := range []string{"restored", "snap-a", "thin-a", "thick-a"} {
		if err := realCall(t, roots, abi.HostCallLvmLvRemove, &abi.LvmLvRequest{VG: vg, Name: n}, nil); err != nil {
			t.Errorf("remove %s: %v", n, err)
		}
		if err := realCall(t, roots, abi.HostCallLvmLvRemove, &abi.LvmLvRequest{VG: vg, Name: n}, nil); abi.CodeOf(err) != abi.NotFound {
			t.Errorf("remove %s again: %v", n, err)
		}
	}
	// The operator's LV: invisible, untouched.
	for _, c := range []string{abi.HostCallLvmLvRemove, abi.HostCallLvmLvDeactivate, abi.HostCallLvmLvStatus} {
		if err := realCall(t, roots, c, &abi.LvmLvRequest{VG: vg, Name: fx.OperatorLV}, nil); abi.CodeOf(err) != abi.NotFound {
			t.Errorf("%s of the operator's LV: %v", c, err)
		}
	}
	if err := realCall(t, roots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: vg, Name: fx.OperatorLV, SizeBytes: 4 << 20}, nil); abi.CodeOf(err) != abi.AlreadyExists {
		t.Errorf("create over the operator's LV: %v", err)
	}
	fx.CheckOperator(t)
}

func joined(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}
