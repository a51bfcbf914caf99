//go:build !wasip1

package moduletest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

// minimal is the module the authoring guide walks through.
const minimal = "github.com/wasmcsi/wasmcsi/sdk/moduletest/internal/minimal"

// TestMinimalWithFakeHost builds the minimal module with each toolchain,
// loads it into the daemon's runtime and drives it through every path an
// SDK module has: decoding, dispatch, host calls to a FakeHost (small and
// large answers, error codes both ways), unimplemented operations and bad
// requests.
func TestMinimalWithFakeHost(t *testing.T) {
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			wasm := moduletest.Build(t, minimal, tc)

			var created, removed []string
			var createErr error
			fake := &moduletest.FakeHost{}
			moduletest.HandleTyped(fake, "dir", abi.HostCallDirCreate, func(req *abi.DirCreateRequest) (*abi.Empty, error) {
				created = append(created, req.Path)
				return &abi.Empty{}, createErr
			})
			moduletest.HandleTyped(fake, "dir", abi.HostCallDirRemove, func(req *abi.DirRequest) (*abi.Empty, error) {
				removed = append(removed, req.Path)
				return &abi.Empty{}, nil
			})
			// Only the dir family is granted and only two of its calls are
			// offered: the linker must have dropped every other import.
			m := moduletest.Load(t, wasm, moduletest.Options{
				Name:  "minimal",
				Grant: moduletest.Grant{HostCalls: []string{"dir"}, Roots: []string{"/pool"}},
				Host:  fake.Host(),
			})

			wantOps := []string{"backend_info", "configure", "create_volume", "delete_volume", "node_stage", "node_unstage"}
			if m.Info.Name != "minimal" || !m.Info.Mount || !slices.Equal(m.Info.Ops, wantOps) {
				t.Errorf("backend_info %+v, want name minimal, mount access, ops %v", m.Info, wantOps)
			}
			for _, op := range abi.AllOps {
				if !m.Has(op) {
					t.Errorf("SDK module does not export %s", op)
				}
			}

			create := func(name string) (*abi.CreateVolumeResponse, error) {
				resp := &abi.CreateVolumeResponse{}
				return resp, m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: name, RequiredBytes: 1 << 20}, resp)
			}
			v1, err := create("pvc-1")
			if err != nil {
				t.Fatalf("create_volume: %v", err)
			}
			if !strings.HasPrefix(v1.LocalID, "v-") || v1.CapacityBytes != 1<<20 {
				t.Errorf("create_volume answered %+v", v1)
			}
			again, err := create("pvc-1")
			if err != nil || again.LocalID != v1.LocalID {
				t.Errorf("repeated create_volume: %+v, %v; want ID %s", again, err, v1.LocalID)
			}
			if want := []string{"/pool/" + v1.LocalID, "/pool/" + v1.LocalID}; !slices.Equal(created, want) {
				t.Errorf("dir_create got %v, want %v", created, want)
			}

			// A host call's error code reaches the module, which returns
			// it; the runtime hands it to the caller unchanged.
			createErr = abi.Errorf(abi.ResourceExhausted, "pool full")
			if _, err := create("pvc-2"); abi.CodeOf(err) != abi.ResourceExhausted || !strings.Contains(err.Error(), "pool full") {
				t.Errorf("create_volume with a full pool: %v, want RESOURCE_EXHAUSTED: pool full", err)
			}
			// An answer larger than the guest's buffer is fetched whole
			// with result_read, without running the call twice.
			long := strings.Repeat("x", 10000)
			createErr = &abi.Error{Code: abi.FailedPrecondition, Message: long}
			before := len(created)
			if _, err := create("pvc-3"); abi.CodeOf(err) != abi.FailedPrecondition || !strings.HasSuffix(err.Error(), long) {
				t.Errorf("create_volume with a 10000-byte host error: code %v, message length %d", abi.CodeOf(err), len(err.Error()))
			}
			if len(created) != before+1 {
				t.Errorf("dir_create ran %d times for one call", len(created)-before)
			}
			createErr = nil

			stage := &abi.NodeStageResponse{}
			if err := m.Call(abi.OpNodeStage, &abi.NodeStageRequest{Volume: abi.VolumeRef{LocalID: v1.LocalID}, StagingPath: "/staging/1"}, stage); err != nil {
				t.Fatalf("node_stage: %v", err)
			}
			if stage.Directory != "/pool/"+v1.LocalID || stage.Device != "" {
				t.Errorf("node_stage answered %+v", stage)
			}
			if err := m.Call(abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: v1.LocalID}}, &abi.Empty{}); err != nil {
				t.Fatalf("delete_volume: %v", err)
			}
			if want := []string{"/pool/" + v1.LocalID}; !slices.Equal(removed, want) {
				t.Errorf("dir_remove got %v, want %v", removed, want)
			}

			// What the module does not implement answers UNIMPLEMENTED.
			if err := m.Call(abi.OpExpandVolume, &abi.ExpandVolumeRequest{Volume: abi.VolumeRef{LocalID: v1.LocalID}}, &abi.ExpandVolumeResponse{}); abi.CodeOf(err) != abi.Unimplemented {
				t.Errorf("expand_volume: %v, want UNIMPLEMENTED", err)
			}
			// A request that does not decode is the caller's fault.
			if _, err := m.CallRaw(abi.OpCreateVolume, []byte{0x0a, 0x05, 'x'}); abi.CodeOf(err) != abi.InvalidArgument {
				t.Errorf("create_volume with a truncated request: %v, want INVALID_ARGUMENT", err)
			}

			want := []string{"dir_create", "dir_create", "dir_create", "dir_create", "dir_remove"}
			if got := fake.Calls(); !slices.Equal(got, want) {
				t.Errorf("host calls %v, want %v", got, want)
			}
		})
	}
}

// TestMinimalWithRealHost runs the built module against the daemon's real
// dir host calls in a temporary pool (plain directories need no root).
func TestMinimalWithRealHost(t *testing.T) {
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			pool := t.TempDir()
			m := moduletest.Load(t, moduletest.Build(t, minimal, tc), moduletest.Options{
				Name:  "minimal",
				Grant: moduletest.Grant{HostCalls: []string{"dir"}, Roots: []string{pool}},
				Host:  moduletest.RealCalls(),
			})
			resp := &abi.CreateVolumeResponse{}
			if err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "pvc-real"}, resp); err != nil {
				t.Fatalf("create_volume: %v", err)
			}
			dir := filepath.Join(pool, resp.LocalID)
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				t.Fatalf("volume directory %s: %v", dir, err)
			}
			for i := 0; i < 2; i++ {
				if err := m.Call(abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: resp.LocalID}}, &abi.Empty{}); err != nil {
					t.Fatalf("delete_volume %d: %v", i, err)
				}
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("volume directory after delete_volume: %v", err)
			}
		})
	}
}

// TestMissingGrantRefusesLoad shows what an operator sees when a module
// imports a host call whose family is not granted: the load fails, naming
// the import and the grant.
func TestMissingGrantRefusesLoad(t *testing.T) {
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			m, err := moduletest.TryLoad(t, moduletest.Build(t, minimal, tc), moduletest.Options{
				Name:  "minimal",
				Grant: moduletest.Grant{HostCalls: []string{"mount"}, Roots: []string{"/pool"}},
				Host:  moduletest.RealCalls(),
			})
			for _, want := range []string{`module "minimal"`, `import wasmcsi.dir_create needs grant "dir"`, `import wasmcsi.dir_remove needs grant "dir"`} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("load error %v, want it to contain %s", err, want)
				}
			}
			if m != nil {
				t.Error("a module with an ungranted import was loaded")
			}
		})
	}
}

// TestPanic shows what a backend's panic does: INTERNAL for that call, and
// the module keeps serving. Standard Go recovers the panic inside the
// guest and answers with its message; TinyGo cannot (recover does not work
// on wasm32), so the guest traps, the error carries the wasm stack trace
// (the panic message goes to the daemon's log as guest stdout) and the
// host replaces the instance. The fixture has no Configurer, so this also
// checks that replacement instances need none.
func TestPanic(t *testing.T) {
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			m := moduletest.Load(t, moduletest.Build(t, "./internal/minimal/testdata/panicky", tc), moduletest.Options{Name: "panicky"})
			want := "backend panic: asked to panic"
			if tc == moduletest.TinyGo {
				want = "CreateVolume" // in the trap's wasm stack trace
			}
			for i := 0; i < 3; i++ {
				err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "panic"}, &abi.CreateVolumeResponse{})
				if abi.CodeOf(err) != abi.Internal || !strings.Contains(fmt.Sprint(err), want) {
					t.Errorf("panicking create_volume: %v, want INTERNAL containing %q", err, want)
				}
				resp := &abi.CreateVolumeResponse{}
				if err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "ok"}, resp); err != nil || resp.LocalID != "v-ok" {
					t.Errorf("create_volume after a panic: %+v, %v", resp, err)
				}
			}
		})
	}
}
