//go:build !wasip1

package main

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/nvmeof/nvmeoftest"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Tests of the built module (.wasm, both toolchains) in the daemon's
// runtime against fakeFabric: the imports, grants and codec of the
// artifact an operator ships. The VM tier runs the same module against
// nvmet and the kernel's initiator for real (nvmeof_vm_test.go,
// host/nvmeof_vm_test.go, host/sanity_test.go).

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

func TestBuiltModuleLifecycle(t *testing.T) {
	if nvmeoftest.InVM() {
		t.Skip("runs outside the VM tier (nvmeof_vm_test.go covers the built module there)")
	}
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			wasm := nvmeoftest.Module(t, tc)
			s := newFabric()
			m := moduletest.Load(t, wasm, moduletest.Options{
				Name:      "nvmeof",
				HostCalls: s.host.Funcs(),
				Grant: modules.Grant{HostCalls: nvmeoftest.HostCalls, Roots: testRoots, Config: map[string]string{
					configAddress: testAddress, configNQNPrefix: testSubs,
				}},
			})
			if m.Info.Name != "nvmeof" || !m.Info.Block || m.Info.Granularity != granularity {
				t.Fatalf("backend info %+v", m.Info)
			}
			info := call[abi.NodeInfoResponse](t, m, abi.OpNodeInfo, &abi.Empty{})
			if info.Context[NodeContextHostNQN] != testHostNQN {
				t.Fatalf("node info %+v", info)
			}
			v := call[abi.CreateVolumeResponse](t, m, abi.OpCreateVolume, &abi.CreateVolumeRequest{
				Name: "pvc-1", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}}})
			pub := call[abi.ControllerPublishResponse](t, m, abi.OpControllerPublish, &abi.ControllerPublishRequest{
				Volume: ref(v), NodeID: "moduletest", NodeContext: info.Context})
			if pub.PublishContext[pubSubsystem] != v.Context[ctxSubsystem] || len(s.subs[v.Context[ctxSubsystem]].hosts) != 1 {
				t.Fatalf("publish context %v, subsystem %+v", pub.PublishContext, s.subs[v.Context[ctxSubsystem]])
			}
			st := call[abi.NodeStageResponse](t, m, abi.OpNodeStage, &abi.NodeStageRequest{
				Volume: ref(v), PublishContext: pub.PublishContext, StagingPath: "/staging/v"})
			if st.Device == "" || len(s.ctrls) != 1 {
				t.Fatalf("stage %+v, controllers %v", st, s.ctrls)
			}
			exp := call[abi.ExpandVolumeResponse](t, m, abi.OpExpandVolume, &abi.ExpandVolumeRequest{Volume: ref(v), RequiredBytes: 32 * sdk.MiB})
			if exp.CapacityBytes != 32*sdk.MiB || !exp.NodeExpansionRequired {
				t.Fatalf("expand %+v", exp)
			}
			nexp := call[abi.NodeExpandResponse](t, m, abi.OpNodeExpand, &abi.NodeExpandRequest{
				Volume: ref(v), Device: st.Device, RequiredBytes: 32 * sdk.MiB, StageContext: st.Context})
			if nexp.CapacityBytes != 32*sdk.MiB {
				t.Fatalf("node expand %+v", nexp)
			}
			call[abi.Empty](t, m, abi.OpNodeUnstage, &abi.NodeUnstageRequest{Volume: ref(v), Device: st.Device, StageContext: st.Context})
			call[abi.Empty](t, m, abi.OpControllerUnpublish, &abi.ControllerUnpublishRequest{Volume: ref(v), NodeID: "moduletest", NodeContext: info.Context})
			call[abi.Empty](t, m, abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: ref(v)})
			if len(s.ctrls) != 0 || len(s.files) != 0 || len(s.subs) != 0 {
				t.Fatalf("left behind: controllers %v, files %v, subsystems %v", s.ctrls, s.files, s.subs)
			}
			err := m.Call(abi.OpControllerPublish, &abi.ControllerPublishRequest{Volume: ref(v), NodeID: "x"}, &abi.ControllerPublishResponse{})
			if abi.CodeOf(err) != abi.NotFound {
				t.Fatalf("publish of a deleted volume = %v, want NOT_FOUND", err)
			}
		})
	}
}
