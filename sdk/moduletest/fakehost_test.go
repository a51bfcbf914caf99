//go:build !wasip1

package moduletest_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

func TestFakeHostNative(t *testing.T) {
	fake := &moduletest.FakeHost{}
	moduletest.HandleTyped(fake, "dir", abi.HostCallDirExists, func(req *abi.DirRequest) (*abi.DirExists, error) {
		switch req.Path {
		case "/pool/yes":
			return &abi.DirExists{Exists: true}, nil
		case "/pool/broken":
			return nil, errors.New("EIO")
		}
		return &abi.DirExists{}, nil
	})
	host := fake.Native()
	for _, tc := range []struct {
		name string
		req  []byte
		want []byte
		code abi.Code // OK: no error
	}{
		{abi.HostCallDirExists, (&abi.DirRequest{Path: "/pool/yes"}).AppendWire(nil), (&abi.DirExists{Exists: true}).AppendWire(nil), abi.OK},
		{abi.HostCallDirExists, (&abi.DirRequest{Path: "/pool/no"}).AppendWire(nil), nil, abi.OK},
		{abi.HostCallDirExists, (&abi.DirRequest{Path: "/pool/broken"}).AppendWire(nil), nil, abi.Unknown},
		{abi.HostCallDirExists, []byte{0x0a, 0x05, 'x'}, nil, abi.InvalidArgument},
		{abi.HostCallDirCreate, (&abi.DirCreateRequest{Path: "/pool/x"}).AppendWire(nil), nil, abi.Unimplemented},
	} {
		out, err := host(tc.name, tc.req)
		if got := abi.CodeOf(err); got != tc.code {
			t.Errorf("%s %x: code %v (%v), want %v", tc.name, tc.req, got, err, tc.code)
		}
		if string(out) != string(tc.want) {
			t.Errorf("%s %x: answer %x, want %x", tc.name, tc.req, out, tc.want)
		}
	}
	want := []string{"dir_exists", "dir_exists", "dir_exists", "dir_exists", "dir_create"}
	if got := fake.Calls(); !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v (unhandled calls are recorded too)", got, want)
	}
}

func TestFakeHostHost(t *testing.T) {
	fake := &moduletest.FakeHost{}
	fake.Handle("loop", abi.HostCallLoopDetach, func([]byte) ([]byte, error) { return nil, abi.Errorf(abi.NotFound, "no such device") })
	if got := fake.Host().Names(); !slices.Equal(got, []string{abi.HostCallLoopDetach}) {
		t.Fatalf("host calls %v, want only loop_detach", got)
	}
	mixed := moduletest.RealCalls().With(fake.Host())
	if n := len(mixed.Names()); n != len(moduletest.RealCalls().Names()) {
		t.Errorf("real calls with a fake loop_detach: %d calls, want as many as the real ones", n)
	}
}

// TestRealHost checks the native seam to the daemon's host calls: unknown
// names and paths outside the roots are refused before anything runs.
func TestRealHost(t *testing.T) {
	pool := t.TempDir()
	hostcall.SetHost(moduletest.RealHost([]string{pool}))
	t.Cleanup(func() { hostcall.SetHost(nil) })

	if ok, err := hostcall.DirExists(pool + "/v-missing"); err != nil || ok {
		t.Errorf("dir_exists of a missing volume: %v, %v; want false, nil", ok, err)
	}
	if _, err := hostcall.DirExists("/elsewhere/v"); abi.CodeOf(err) != abi.PermissionDenied {
		t.Errorf("dir_exists outside the roots: %v, want PERMISSION_DENIED", err)
	}
	host := moduletest.RealHost([]string{pool})
	if _, err := host("frob_nicate", nil); abi.CodeOf(err) != abi.Unimplemented || !strings.Contains(err.Error(), "frob_nicate") {
		t.Errorf("unknown host call: %v, want UNIMPLEMENTED naming it", err)
	}
}
