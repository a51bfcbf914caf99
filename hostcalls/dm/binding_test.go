package dm

import (
	"context"
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// callFunc runs host call name of Bindings with req encoded, the way the
// host does, and decodes a successful answer into resp.
func callFunc(t *testing.T, env *hostcalls.Env, name string, req hostcalls.Message, resp hostcalls.Message) error {
	t.Helper()
	for _, f := range Bindings() {
		if f.Name != name {
			continue
		}
		out, err := f.Call(context.Background(), env, req.AppendWire(nil))
		if err == nil && resp != nil {
			if derr := resp.UnmarshalWire(out); derr != nil {
				t.Fatalf("%s answer: %v", name, derr)
			}
		}
		return err
	}
	t.Fatalf("no binding %s", name)
	return nil
}

func TestBindingsNames(t *testing.T) {
	var names []string
	for _, f := range Bindings() {
		if f.Family != Family || f.Call == nil {
			t.Errorf("%s: family %q", f.Name, f.Family)
		}
		names = append(names, f.Name)
	}
	slices.Sort(names)
	want := []string{abi.HostCallDmPoolOpen, abi.HostCallDmPoolStatus, abi.HostCallDmThinActivate, abi.HostCallDmThinCreate,
		abi.HostCallDmThinDeactivate, abi.HostCallDmThinDelete, abi.HostCallDmThinResize, abi.HostCallDmThinSnapshot, abi.HostCallDmThinStatus}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("bindings %v\nwant     %v", names, want)
	}
}

// Grants are checked before any device is touched, so these run anywhere.
func TestBindingsRefuse(t *testing.T) {
	env := &hostcalls.Env{Module: "m", Roots: []string{"wasmcsi-m-", "/dev/disk/wasmcsi"}}
	for _, c := range []struct {
		what string
		env  *hostcalls.Env
		name string
		req  hostcalls.Message
		code abi.Code
	}{
		{"no prefix granted", &hostcalls.Env{Roots: []string{"/dev/vdb"}}, abi.HostCallDmPoolStatus, &abi.DmPoolRequest{Pool: "wasmcsi-m-p"}, abi.PermissionDenied},
		{"pool outside the prefixes", env, abi.HostCallDmPoolStatus, &abi.DmPoolRequest{Pool: "vg0-pool"}, abi.PermissionDenied},
		{"open outside the prefixes", env, abi.HostCallDmPoolOpen, &abi.DmPoolOpenRequest{Pool: "lvm-x", MetaDev: "/dev/disk/wasmcsi/a", DataDev: "/dev/disk/wasmcsi/b"}, abi.PermissionDenied},
		{"metadata device outside the roots", env, abi.HostCallDmPoolOpen, &abi.DmPoolOpenRequest{Pool: "wasmcsi-m-p", MetaDev: "/dev/sda", DataDev: "/dev/disk/wasmcsi/b"}, abi.PermissionDenied},
		{"data device escaping the roots", env, abi.HostCallDmPoolOpen, &abi.DmPoolOpenRequest{Pool: "wasmcsi-m-p", MetaDev: "/dev/disk/wasmcsi/a", DataDev: "/dev/disk/wasmcsi/../sda"}, abi.PermissionDenied},
		{"relative device", env, abi.HostCallDmPoolOpen, &abi.DmPoolOpenRequest{Pool: "wasmcsi-m-p", MetaDev: "a", DataDev: "/dev/disk/wasmcsi/b"}, abi.InvalidArgument},
		{"thin in a foreign pool", env, abi.HostCallDmThinDelete, &abi.DmThinRequest{Pool: "other", ID: 1}, abi.PermissionDenied},
		{"snapshot in a foreign pool", env, abi.HostCallDmThinSnapshot, &abi.DmThinSnapshotRequest{Pool: "other", OriginID: 1, SnapshotID: 2}, abi.PermissionDenied},
		{"size not in sectors", env, abi.HostCallDmThinCreate, &abi.DmThinRequest{Pool: "wasmcsi-m-p", ID: 1, SizeBytes: 1000}, abi.InvalidArgument},
		{"no size", env, abi.HostCallDmThinActivate, &abi.DmThinRequest{Pool: "wasmcsi-m-p", ID: 1}, abi.InvalidArgument},
		{"negative size", env, abi.HostCallDmThinResize, &abi.DmThinRequest{Pool: "wasmcsi-m-p", ID: 1, SizeBytes: -512}, abi.InvalidArgument},
	} {
		if err := callFunc(t, c.env, c.name, c.req, nil); abi.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want %v", c.what, err, c.code)
		}
	}
	for _, f := range Bindings() {
		if _, err := f.Call(context.Background(), env, []byte{0xff, 0xff, 0xff}); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("%s with a garbage request: %v", f.Name, err)
		}
	}
}
