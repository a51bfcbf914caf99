package dm

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// A module's view: the host calls, through the wire codec, on real devices.
func TestBindingsOnAPool(t *testing.T) {
	newMapper(t, "dm_thin_pool")
	meta, _ := looptest.Device(t, 4<<20)
	data, _ := looptest.Device(t, 64<<20)
	pool := testPrefix + "bind"
	env := &hostcalls.Env{Module: "thin", Roots: []string{testPrefix + "bind", meta, data}}
	m, _ := New(testPrefix)
	t.Cleanup(func() { removePool(t, m, pool) })

	open := &abi.DmPoolOpenRequest{Pool: pool, MetaDev: meta, DataDev: data, BlockSectors: 128, Format: true}
	var opened abi.DmPoolOpenResponse
	if err := callFunc(t, env, abi.HostCallDmPoolOpen, open, &opened); err != nil {
		t.Fatal(err)
	}
	if !opened.Formatted || opened.Path != "/dev/mapper/"+pool || opened.Status.TotalDataBlocks != 64<<20/(128*512) {
		t.Errorf("open: %+v", opened)
	}
	var thin abi.DmThinResponse
	if err := callFunc(t, env, abi.HostCallDmThinCreate, &abi.DmThinRequest{Pool: pool, ID: 3, SizeBytes: 32 << 20}, &thin); err != nil {
		t.Fatal(err)
	}
	if thin.Path != "/dev/mapper/"+pool+"-3" || size(t, thin.Path) != 32<<20 {
		t.Errorf("thin %+v", thin)
	}
	writeAt(t, thin.Path, 0, make([]byte, 1<<20))
	if err := callFunc(t, env, abi.HostCallDmThinSnapshot, &abi.DmThinSnapshotRequest{Pool: pool, OriginID: 3, SnapshotID: 4}, nil); err != nil {
		t.Fatal(err)
	}
	if err := callFunc(t, env, abi.HostCallDmThinResize, &abi.DmThinRequest{Pool: pool, ID: 3, SizeBytes: 48 << 20}, nil); err != nil {
		t.Fatal(err)
	}
	if got := size(t, thin.Path); got != 48<<20 {
		t.Errorf("size after resize %d", got)
	}
	var st abi.DmPoolStatus
	if err := callFunc(t, env, abi.HostCallDmPoolStatus, &abi.DmPoolRequest{Pool: pool}, &st); err != nil {
		t.Fatal(err)
	}
	if st.UsedDataBlocks != 16 || st.BlockSectors != 128 {
		t.Errorf("status %+v", st)
	}
	// Opening again, Format or not, keeps the volumes.
	if err := callFunc(t, env, abi.HostCallDmPoolOpen, open, &opened); err != nil || opened.Formatted {
		t.Errorf("second open: %+v, %v", opened, err)
	}
	for _, id := range []uint32{3, 4} {
		if err := callFunc(t, env, abi.HostCallDmThinDeactivate, &abi.DmThinRequest{Pool: pool, ID: id}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Remove(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if err := callFunc(t, env, abi.HostCallDmThinActivate, &abi.DmThinRequest{Pool: pool, ID: 4, SizeBytes: 32 << 20}, nil); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Errorf("activate in a closed pool: %v", err)
	}
	if err := callFunc(t, env, abi.HostCallDmPoolOpen, open, &opened); err != nil || opened.Formatted || opened.Status.UsedDataBlocks != 16 {
		t.Errorf("reopen with Format: %+v, %v", opened, err)
	}
	if err := callFunc(t, env, abi.HostCallDmThinActivate, &abi.DmThinRequest{Pool: pool, ID: 4, SizeBytes: 32 << 20}, &thin); err != nil {
		t.Fatal(err)
	}
	if err := callFunc(t, env, abi.HostCallDmThinDelete, &abi.DmThinRequest{Pool: pool, ID: 4}, nil); err != nil {
		t.Fatal(err)
	}
	if err := callFunc(t, env, abi.HostCallDmThinDelete, &abi.DmThinRequest{Pool: pool, ID: 4}, nil); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("second delete: %v", err)
	}
}
