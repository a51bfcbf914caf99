//go:build !wasip1

package main

import (
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/lvm/lvmmodule"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmfake"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The built module, with each toolchain, through the real lvm host calls
// over a fake volume group: the artifact an operator ships makes the same
// decisions as the native code and speaks the ABI.
func TestBuiltModule(t *testing.T) {
	if lvmmodule.InVM() {
		t.Skip("runs outside the VM tier (lvm_vm_test.go covers the built module there)")
	}
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			wasm := lvmmodule.Module(t, tc)
			f := lvmfake.New(t)
			m := moduletest.Load(t, wasm, moduletest.Options{
				Name:      "lvm",
				Grant:     modules.Grant{HostCalls: lvmmodule.HostCalls, Roots: testRoots, Config: testConfig()},
				HostCalls: hostFuncs(f),
			})
			var info abi.BackendInfo
			if err := m.Call(abi.OpInfo, &abi.Empty{}, &info); err != nil {
				t.Fatal(err)
			}
			for _, op := range []abi.Op{abi.OpCreateVolume, abi.OpExpandVolume, abi.OpCreateSnapshot, abi.OpGetCapacity, abi.OpNodeStage, abi.OpNodeExpand, abi.OpStorageHealth, abi.OpVolumeHealth} {
				if !slices.Contains(info.Ops, string(op)) {
					t.Errorf("backend_info lacks %s: %v", op, info.Ops)
				}
			}
			var v abi.CreateVolumeResponse
			if err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "pvc-built", RequiredBytes: 32 << 20, Capabilities: blockCap()}, &v); err != nil {
				t.Fatal(err)
			}
			if want := lvName(kindVolume, "pvc-built"); v.LocalID != want || f.LVs[want] == nil || f.LVs[want].Pool != "pool0" {
				t.Errorf("module chose %s, native code %s", v.LocalID, want)
			}
			var st abi.NodeStageResponse
			if err := m.Call(abi.OpNodeStage, &abi.NodeStageRequest{Volume: ref(&v), Capability: blockCap()[0]}, &st); err != nil {
				t.Fatal(err)
			}
			if st.Device != "/dev/mapper/vg0-"+dmEscape(v.LocalID) || !f.LVs[v.LocalID].Active {
				t.Errorf("staged %+v", st)
			}
			err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "pvc-x", Parameters: map[string]string{paramDeviceClass: "nope"}}, &v)
			if abi.CodeOf(err) != abi.InvalidArgument {
				t.Errorf("unknown class: %v", err)
			}
			err = m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "pvc-big", RequiredBytes: 4 << 30, Parameters: map[string]string{paramDeviceClass: "thick"}}, &v)
			if abi.CodeOf(err) != abi.ResourceExhausted {
				t.Errorf("beyond free space: %v", err)
			}
		})
	}
}

func dmEscape(s string) string {
	out := ""
	for _, c := range s {
		if c == '-' {
			out += "--"
		} else {
			out += string(c)
		}
	}
	return out
}
