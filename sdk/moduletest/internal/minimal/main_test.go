//go:build !wasip1

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/guest"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

// fakePool installs a FakeHost that records the directories the module
// asks for, answering dir_create with createErr.
func fakePool(t *testing.T, createErr error) (*moduletest.FakeHost, *[]string) {
	t.Helper()
	var paths []string
	fake := &moduletest.FakeHost{}
	moduletest.HandleTyped(fake, "dir", abi.HostCallDirCreate, func(req *abi.DirCreateRequest) (*abi.Empty, error) {
		paths = append(paths, req.Path)
		return &abi.Empty{}, createErr
	})
	moduletest.HandleTyped(fake, "dir", abi.HostCallDirRemove, func(req *abi.DirRequest) (*abi.Empty, error) {
		paths = append(paths, req.Path)
		return &abi.Empty{}, nil
	})
	hostcall.SetHost(fake.Native())
	t.Cleanup(func() { hostcall.SetHost(nil) })
	return fake, &paths
}

func TestRegistered(t *testing.T) {
	if _, ok := guest.Backend().(*backend); !ok {
		t.Fatalf("init registered %T, want *backend", guest.Backend())
	}
}

func TestConfigure(t *testing.T) {
	for _, tc := range []struct {
		roots []string
		code  abi.Code
		pool  string
	}{
		{roots: nil, code: abi.InvalidArgument},
		{roots: []string{"/pools/a"}, code: abi.OK, pool: "/pools/a"},
		{roots: []string{"/pools/a", "/pools/b"}, code: abi.OK, pool: "/pools/a"},
	} {
		b := &backend{}
		err := b.Configure(&abi.ConfigureRequest{Roots: tc.roots})
		if got := abi.CodeOf(err); got != tc.code {
			t.Errorf("roots %v: code %v (%v), want %v", tc.roots, got, err, tc.code)
		}
		if b.pool != tc.pool {
			t.Errorf("roots %v: pool %q, want %q", tc.roots, b.pool, tc.pool)
		}
	}
}

func TestCreateVolumeIsIdempotentOnName(t *testing.T) {
	fake, paths := fakePool(t, nil)
	b := &backend{pool: "/pool"}
	create := func(name string) *abi.CreateVolumeResponse {
		t.Helper()
		resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: name, RequiredBytes: 1 << 20})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return resp
	}
	a1, a2, other := create("pvc-a"), create("pvc-a"), create("pvc-b")
	if a1.LocalID != a2.LocalID {
		t.Errorf("same name gave IDs %q and %q", a1.LocalID, a2.LocalID)
	}
	if a1.LocalID == other.LocalID {
		t.Errorf("names pvc-a and pvc-b share ID %q", a1.LocalID)
	}
	if a1.CapacityBytes != 1<<20 {
		t.Errorf("capacity %d, want %d", a1.CapacityBytes, 1<<20)
	}
	want := []string{"/pool/" + a1.LocalID, "/pool/" + a1.LocalID, "/pool/" + other.LocalID}
	if len(*paths) != len(want) {
		t.Fatalf("dir_create paths %v, want %v", *paths, want)
	}
	for i := range want {
		if (*paths)[i] != want[i] {
			t.Errorf("dir_create %d: %q, want %q", i, (*paths)[i], want[i])
		}
	}
	if got := fake.Calls(); len(got) != 3 {
		t.Errorf("host calls %v, want three dir_create", got)
	}
}

func TestCreateVolumeKeepsHostCode(t *testing.T) {
	fakePool(t, abi.Errorf(abi.ResourceExhausted, "pool full"))
	b := &backend{pool: "/pool"}
	_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-a"})
	if abi.CodeOf(err) != abi.ResourceExhausted {
		t.Fatalf("err %v, want RESOURCE_EXHAUSTED from the host", err)
	}
}

func TestDeleteAndStageUseTheLocalID(t *testing.T) {
	_, paths := fakePool(t, nil)
	b := &backend{pool: "/pool"}
	vol := abi.VolumeRef{LocalID: "v-1"}
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: vol}); err != nil {
		t.Fatal(err)
	}
	if len(*paths) != 1 || (*paths)[0] != "/pool/v-1" {
		t.Errorf("dir_remove paths %v, want [/pool/v-1]", *paths)
	}
	st, err := b.NodeStage(&abi.NodeStageRequest{Volume: vol, StagingPath: "/staging"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Directory != "/pool/v-1" || st.Device != "" {
		t.Errorf("stage %+v, want directory /pool/v-1", st)
	}
	if err := b.NodeUnstage(&abi.NodeUnstageRequest{Volume: vol}); err != nil {
		t.Errorf("unstage: %v", err)
	}
}

// TestRealHost runs the module's logic against the daemon's real dir host
// calls, confined to a temporary pool as a granted module would be. Plain
// directories need no privileges; a module using loop or mount calls would
// skip such a test unless root.
func TestRealHost(t *testing.T) {
	pool := t.TempDir()
	hostcall.SetHost(moduletest.RealHost([]string{pool}))
	t.Cleanup(func() { hostcall.SetHost(nil) })
	b := &backend{}
	if err := b.Configure(&abi.ConfigureRequest{Roots: []string{pool}}); err != nil {
		t.Fatal(err)
	}
	resp, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-real"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(pool, resp.LocalID)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("volume directory %s: %v", dir, err)
	}
	if _, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-real"}); err != nil {
		t.Fatalf("repeated create: %v", err)
	}
	for i := 0; i < 2; i++ { // the second delete finds nothing and succeeds
		if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: resp.LocalID}}); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("volume directory after delete: %v", err)
	}
	// A pool outside the grant is refused by the host, not by the module.
	outside := &backend{pool: t.TempDir()}
	if _, err := outside.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-x"}); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("create outside the granted pool: %v, want PERMISSION_DENIED", err)
	}
}
