//go:build !wasip1

package main

import (
	"strconv"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/iscsi/iscsitest"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Tests of the built module (.wasm, both toolchains) in the daemon's
// runtime against fakeSAN: the imports, grants and codec of the artifact
// an operator ships. The VM tier runs the same module against LIO and
// open-iscsi for real (host/iscsi_vm_test.go, host/sanity_test.go).

// call runs op on the built module and fails the test on an error.
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
	if iscsitest.InVM() {
		// Compiling a standard-Go module takes ~45 s under TCG, and the
		// fake SAN needs no kernel: the VM tests load the module instead.
		t.Skip("runs outside the VM tier (iscsi_vm_test.go covers the built module there)")
	}
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			wasm := iscsitest.Module(t, tc)
			s := newSAN()
			m := moduletest.Load(t, wasm, moduletest.Options{
				Name:      "iscsi",
				HostCalls: s.host.Funcs(),
				Grant: modules.Grant{HostCalls: []string{"file", "lio", "iscsi"}, Roots: testRoots, Config: map[string]string{
					configPortal: testPortal, configTargetIQN: testTarget, configChapUser: "user1", configChapSecret: "secret123456",
				}},
			})
			if m.Info.Name != "iscsi" || !m.Info.Block || m.Info.Granularity != granularity {
				t.Fatalf("backend info %+v", m.Info)
			}
			info := call[abi.NodeInfoResponse](t, m, abi.OpNodeInfo, &abi.Empty{})
			if info.Context[NodeContextInitiator] != testInitiator {
				t.Fatalf("node info %+v", info)
			}
			v := call[abi.CreateVolumeResponse](t, m, abi.OpCreateVolume, &abi.CreateVolumeRequest{
				Name: "pvc-1", RequiredBytes: 16 * sdk.MiB, Capabilities: []abi.Capability{{AccessMode: abi.AccessSingleNodeWriter}}})
			lun := mustLUN(t, v.LocalID)
			pub := call[abi.ControllerPublishResponse](t, m, abi.OpControllerPublish, &abi.ControllerPublishRequest{
				Volume: ref(v), NodeID: "moduletest", NodeContext: info.Context})
			if pub.PublishContext[pubLUN] != strconv.Itoa(lun) || s.chap[testTarget][testInitiator] != "user1:secret123456" {
				t.Fatalf("publish context %v, CHAP %q", pub.PublishContext, s.chap[testTarget][testInitiator])
			}
			st := call[abi.NodeStageResponse](t, m, abi.OpNodeStage, &abi.NodeStageRequest{
				Volume: ref(v), PublishContext: pub.PublishContext, StagingPath: "/staging/v"})
			if st.Device == "" || len(s.sessions) != 1 {
				t.Fatalf("stage %+v, sessions %v", st, s.sessions)
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
			if len(s.sessions) != 0 || len(s.files) != 0 || len(s.luns[testTarget]) != 0 || len(s.acls[testTarget]) != 0 {
				t.Fatalf("left behind: sessions %v, files %v, LUNs %v, ACLs %v", s.sessions, s.files, s.luns, s.acls)
			}
			// A module error keeps its code across the boundary.
			err := m.Call(abi.OpControllerPublish, &abi.ControllerPublishRequest{Volume: ref(v), NodeID: "x"}, &abi.ControllerPublishResponse{})
			if abi.CodeOf(err) != abi.FailedPrecondition {
				t.Fatalf("publish to a node without an initiator = %v, want FAILED_PRECONDITION", err)
			}
		})
	}
}
