//go:build !wasip1

package main

import (
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/dmthin/dmthintest"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The built module, with each toolchain, against the fake system: the
// artifact an operator ships makes the same decisions as the native code
// (the same thin ids for the same names) and speaks the ABI. In the VM
// tier it runs the files the tier built (the guest has no toolchain).
func TestBuiltModule(t *testing.T) {
	if dmthintest.InVM() {
		// Compiling a standard-Go module takes ~45 s under TCG, and the
		// fake host needs no kernel: the VM tests load the module instead.
		t.Skip("runs outside the VM tier (dmthin_vm_test.go covers the built module there)")
	}
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			wasm := dmthintest.Module(t, tc)
			f := newFakeSystem()
			f.files["/files/data"] = 256 * mib
			f.files["/files/meta"] = 8 * mib
			m := moduletest.Load(t, wasm, moduletest.Options{
				Name:      "dmthin",
				Grant:     modules.Grant{HostCalls: []string{"dm", "file", "loop"}, Roots: testRoots, Config: testConfig()},
				HostCalls: f.host.Funcs(),
			})
			if f.pool == nil || f.pool.name != testPool {
				t.Fatalf("configure did not open the pool: %+v", f.opens)
			}
			var info abi.BackendInfo
			if err := m.Call(abi.OpInfo, &abi.Empty{}, &info); err != nil {
				t.Fatal(err)
			}
			for _, op := range []abi.Op{abi.OpCreateVolume, abi.OpExpandVolume, abi.OpCreateSnapshot, abi.OpGetCapacity, abi.OpNodeStage, abi.OpNodeExpand, abi.OpStorageHealth, abi.OpVolumeHealth, abi.OpSnapshotData} {
				if !slices.Contains(info.Ops, string(op)) {
					t.Errorf("backend_info lacks %s: %v", op, info.Ops)
				}
			}
			if !info.Block || !info.Mount || !info.NodeExpansion || !info.Clone || !info.Restore || info.Granularity != 64*kib {
				t.Errorf("info %+v", info)
			}

			var v abi.CreateVolumeResponse
			if err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "pvc-built", RequiredBytes: 32 * mib, Capabilities: blockCap()}, &v); err != nil {
				t.Fatal(err)
			}
			if want := localID(kindVolume, ownerOf(kindVolume, "pvc-built").probe(0)); v.LocalID != want {
				t.Errorf("module chose %s, native code %s", v.LocalID, want)
			}
			var s abi.CreateSnapshotResponse
			if err := m.Call(abi.OpCreateSnapshot, &abi.CreateSnapshotRequest{Name: "snap-built", Source: ref(&v)}, &s); err != nil {
				t.Fatal(err)
			}
			var st abi.NodeStageResponse
			if err := m.Call(abi.OpNodeStage, &abi.NodeStageRequest{Volume: ref(&v), Capability: blockCap()[0]}, &st); err != nil {
				t.Fatal(err)
			}
			if th := f.thin(idOf(t, v.LocalID)); th == nil || !th.active || th.size != 32*mib {
				t.Errorf("staged thin %+v", th)
			}
			var capacity abi.GetCapacityResponse
			if err := m.Call(abi.OpGetCapacity, &abi.GetCapacityRequest{}, &capacity); err != nil || capacity.AvailableBytes != 4096*64*kib {
				t.Errorf("capacity %+v %v", capacity, err)
			}
			// Errors keep their codes across the boundary.
			err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "pvc-built", RequiredBytes: 64 * mib}, &v)
			if abi.CodeOf(err) != abi.AlreadyExists {
				t.Errorf("same name, other size: %v", err)
			}
			if err := m.Call(abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: abi.SnapshotRef{LocalID: s.LocalID, Context: s.Context}}, &abi.Empty{}); err != nil {
				t.Fatal(err)
			}
			if err := m.Call(abi.OpNodeUnstage, &abi.NodeUnstageRequest{Volume: ref(&v)}, &abi.Empty{}); err != nil {
				t.Fatal(err)
			}
			if err := m.Call(abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: ref(&v)}, &abi.Empty{}); err != nil {
				t.Fatal(err)
			}
			if r := f.records(); len(r) != 0 {
				t.Errorf("records left: %v", r)
			}
		})
	}
}
