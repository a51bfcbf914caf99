package lvm_test

import (
	"context"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmfake"
)

// call runs host call name of bindings over f through the wire codec.
func call(t *testing.T, f *lvmfake.VG, roots []string, name string, req, resp abi.Message) error {
	t.Helper()
	for _, fn := range lvm.BindingsWith(f) {
		if fn.Name != name {
			continue
		}
		out, err := fn.Call(context.Background(), &hostcalls.Env{Module: "lvm", Roots: roots}, req.AppendWire(nil))
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

var bothRoots = []string{"lvm:vg0", "lvm:vg0:pool0"}

// An operator's LV without the tag is invisible: every call answers
// NOT_FOUND for it and changes nothing, a create of its name is refused
// without touching it, and a listing leaves it out.
func TestUntaggedLVInvisible(t *testing.T) {
	f := lvmfake.New(t)
	f.LVs["db"] = &lvmfake.LV{Name: "db", Size: 64 << 20, Active: true, Tags: []string{"operator"}}
	f.LVs["thin-op"] = &lvmfake.LV{Name: "thin-op", Pool: "pool0", Size: 64 << 20}
	for _, name := range []string{"db", "thin-op"} {
		for _, c := range []struct {
			call string
			req  abi.Message
		}{
			{abi.HostCallLvmLvStatus, &abi.LvmLvRequest{VG: "vg0", Name: name}},
			{abi.HostCallLvmLvRemove, &abi.LvmLvRequest{VG: "vg0", Name: name}},
			{abi.HostCallLvmLvActivate, &abi.LvmLvRequest{VG: "vg0", Name: name}},
			{abi.HostCallLvmLvDeactivate, &abi.LvmLvRequest{VG: "vg0", Name: name}},
			{abi.HostCallLvmLvExtend, &abi.LvmExtendRequest{VG: "vg0", Name: name, SizeBytes: 128 << 20}},
			{abi.HostCallLvmLvSnapshot, &abi.LvmSnapshotRequest{VG: "vg0", Origin: name, Name: "s1", Writable: true}},
		} {
			if err := call(t, f, bothRoots, c.call, c.req, nil); abi.CodeOf(err) != abi.NotFound {
				t.Errorf("%s of untagged %s: %v, want NOT_FOUND", c.call, name, err)
			}
		}
		err := call(t, f, bothRoots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: "vg0", Name: name, SizeBytes: 8 << 20}, nil)
		if abi.CodeOf(err) != abi.AlreadyExists {
			t.Errorf("create over untagged %s: %v, want ALREADY_EXISTS", name, err)
		}
	}
	for _, cmd := range []string{"lvcreate", "lvremove", "lvchange", "lvextend"} {
		if n := f.Ran(cmd); n != 0 {
			t.Errorf("%d %s commands ran against untagged LVs: %v", n, cmd, f.Commands)
		}
	}
	if f.LVs["db"].Size != 64<<20 || !f.LVs["db"].Active || f.LVs["thin-op"].Size != 64<<20 {
		t.Error("an untagged LV changed")
	}
	var made abi.LvmLv
	if err := call(t, f, bothRoots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: "vg0", Name: "vol-a", SizeBytes: 8 << 20, Tags: []string{"k=v"}}, &made); err != nil {
		t.Fatal(err)
	}
	var list abi.LvmLvList
	if err := call(t, f, bothRoots, abi.HostCallLvmLvList, &abi.LvmListRequest{VG: "vg0"}, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.LVs) != 1 || list.LVs[0].Name != "vol-a" || len(list.LVs[0].Tags) != 1 || list.LVs[0].Tags[0] != "k=v" {
		t.Errorf("list: %+v", list.LVs)
	}
}

// Grants: a VG or pool no root names is PERMISSION_DENIED and nothing
// runs; a thick grant does not cover the VG's thin pools, nor the reverse.
func TestGrantsConfine(t *testing.T) {
	f := lvmfake.New(t)
	cases := []struct {
		roots []string
		req   *abi.LvmCreateRequest
	}{
		{[]string{"lvm:vg0:pool0"}, &abi.LvmCreateRequest{VG: "vg0", Name: "a", SizeBytes: 4 << 20}},
		{[]string{"lvm:vg0"}, &abi.LvmCreateRequest{VG: "vg0", Name: "a", SizeBytes: 4 << 20, ThinPool: "pool0"}},
		{[]string{"lvm:vg1", "/dev/vg0", "vg0"}, &abi.LvmCreateRequest{VG: "vg0", Name: "a", SizeBytes: 4 << 20}},
		{[]string{"lvm:vg0:other"}, &abi.LvmCreateRequest{VG: "vg0", Name: "a", SizeBytes: 4 << 20, ThinPool: "pool0"}},
	}
	for _, c := range cases {
		if err := call(t, f, c.roots, abi.HostCallLvmLvCreate, c.req, nil); abi.CodeOf(err) != abi.PermissionDenied {
			t.Errorf("roots %v, create %+v: %v, want PERMISSION_DENIED", c.roots, c.req, err)
		}
	}
	if err := call(t, f, []string{"lvm:vg1"}, abi.HostCallLvmVgStatus, &abi.LvmVgRequest{VG: "vg0"}, nil); abi.CodeOf(err) != abi.PermissionDenied {
		t.Errorf("vg status of an ungranted VG: %v", err)
	}
	if len(f.Commands) != 0 {
		t.Errorf("commands ran: %v", f.Commands)
	}
	// A thin LV made under the pool's grant is out of reach of a module
	// granted only the VG's thick LVs.
	if err := call(t, f, bothRoots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: "vg0", Name: "t", SizeBytes: 4 << 20, ThinPool: "pool0"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := call(t, f, []string{"lvm:vg0"}, abi.HostCallLvmLvRemove, &abi.LvmLvRequest{VG: "vg0", Name: "t"}, nil); abi.CodeOf(err) != abi.PermissionDenied {
		t.Errorf("remove of a thin LV with only the thick grant: %v", err)
	}
	if _, ok := f.LVs["t"]; !ok {
		t.Error("the thin LV was removed")
	}
}

// A thick LV beyond the VG's free space is RESOURCE_EXHAUSTED before lvm
// creates anything; names and sizes LVM would refuse are INVALID_ARGUMENT.
func TestCreateRefusals(t *testing.T) {
	f := lvmfake.New(t)
	err := call(t, f, bothRoots, abi.HostCallLvmLvCreate, &abi.LvmCreateRequest{VG: "vg0", Name: "big", SizeBytes: 2 << 30}, nil)
	if abi.CodeOf(err) != abi.ResourceExhausted {
		t.Errorf("create beyond free space: %v", err)
	}
	if f.Ran("lvcreate") != 0 || len(f.LVs) != 1 {
		t.Errorf("something was created: %v", f.Commands)
	}
	for _, req := range []*abi.LvmCreateRequest{
		{VG: "vg0", Name: "a/b", SizeBytes: 4096},
		{VG: "vg0", Name: "x_tmeta", SizeBytes: 4096},
		{VG: "vg0", Name: "snapshot1", SizeBytes: 4096},
		{VG: "vg0", Name: "-a", SizeBytes: 4096},
		{VG: "vg0", Name: "a", SizeBytes: 1000},
		{VG: "vg0", Name: "a", SizeBytes: 4096, Tags: []string{"a b"}},
		{VG: "vg0", Name: "a", SizeBytes: 4096, ThinPool: "pool0", Stripes: 2},
	} {
		if err := call(t, f, bothRoots, abi.HostCallLvmLvCreate, req, nil); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("create %+v: %v, want INVALID_ARGUMENT", req, err)
		}
	}
}

// Create, repeat, snapshot as a larger writable copy, extend, remove: the
// answers say what LVM made, and a repeat finds it.
func TestLifecycle(t *testing.T) {
	f := lvmfake.New(t)
	var lv abi.LvmLv
	req := &abi.LvmCreateRequest{VG: "vg0", Name: "vol-a", SizeBytes: 10 << 20, ThinPool: "pool0", Activate: true}
	if err := call(t, f, bothRoots, abi.HostCallLvmLvCreate, req, &lv); err != nil {
		t.Fatal(err)
	}
	if lv.Existed || !lv.Active || lv.Path != "/dev/mapper/vg0-vol--a" || lv.SizeBytes != 12<<20 || lv.Major != 253 {
		t.Errorf("created %+v", lv)
	}
	if err := call(t, f, bothRoots, abi.HostCallLvmLvCreate, req, &lv); err != nil || !lv.Existed {
		t.Errorf("repeat: %+v, %v", lv, err)
	}
	var snap abi.LvmLv
	if err := call(t, f, bothRoots, abi.HostCallLvmLvSnapshot, &abi.LvmSnapshotRequest{VG: "vg0", Origin: "vol-a", Name: "snap-a"}, &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Active || snap.Origin != "vol-a" || !snap.ReadOnly {
		t.Errorf("snapshot %+v", snap)
	}
	var copyLV abi.LvmLv
	if err := call(t, f, bothRoots, abi.HostCallLvmLvSnapshot, &abi.LvmSnapshotRequest{VG: "vg0", Origin: "snap-a", Name: "vol-r",
		Writable: true, Activate: true, SizeBytes: 20 << 20}, &copyLV); err != nil {
		t.Fatal(err)
	}
	if !copyLV.Active || copyLV.ReadOnly || copyLV.SizeBytes != 20<<20 {
		t.Errorf("writable copy %+v", copyLV)
	}
	if err := call(t, f, bothRoots, abi.HostCallLvmLvRemove, &abi.LvmLvRequest{VG: "vg0", Name: "vol-a"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := call(t, f, bothRoots, abi.HostCallLvmLvRemove, &abi.LvmLvRequest{VG: "vg0", Name: "vol-a"}, nil); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("second remove: %v", err)
	}
	var pool abi.LvmPoolStatus
	if err := call(t, f, bothRoots, abi.HostCallLvmPoolStatus, &abi.LvmPoolRequest{VG: "vg0", Pool: "pool0"}, &pool); err != nil {
		t.Fatal(err)
	}
	if pool.DataPercent != 1250 || pool.DataUsedBytes != 32<<20 || pool.MetadataUsedBytes != (4<<20)/100 {
		t.Errorf("pool %+v", pool)
	}
}
