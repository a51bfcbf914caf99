package lio

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// callAt runs host call name of the bindings on root with req encoded, as
// the runtime does.
func callAt(t *testing.T, root string, roots []string, name string, req hostcalls.Message) error {
	t.Helper()
	for _, f := range bindingsAt(root) {
		if f.Name != name {
			continue
		}
		if f.Family != Family {
			t.Fatalf("%s: family %q, want %q", name, f.Family, Family)
		}
		out, err := f.Call(context.Background(), &hostcalls.Env{Module: "test", Roots: roots}, req.AppendWire(nil))
		if err == nil && len(out) != 0 {
			if err := (&abi.Empty{}).UnmarshalWire(out); err != nil {
				t.Fatalf("%s: answer does not decode: %v", name, err)
			}
		}
		return err
	}
	t.Fatalf("no host call %s", name)
	return nil
}

func TestBindingsNames(t *testing.T) {
	want := map[string]bool{abi.HostCallLioLunCreate: true, abi.HostCallLioLunDelete: true, abi.HostCallLioGrant: true, abi.HostCallLioRevoke: true}
	got := Bindings()
	if len(got) != len(want) {
		t.Fatalf("%d bindings, want %d", len(got), len(want))
	}
	for _, f := range got {
		if !want[f.Name] || f.Family != Family {
			t.Errorf("unexpected binding %s (family %s)", f.Name, f.Family)
		}
	}
}

func TestBackstoreName(t *testing.T) {
	a := backstoreName(testPrefix+"a", 3)
	if !regexp.MustCompile(`^wcsi-[0-9a-f]{16}-3$`).MatchString(a) {
		t.Fatalf("backstoreName = %q", a)
	}
	if a != backstoreName(testPrefix+"a", 3) || a == backstoreName(testPrefix+"b", 3) || a == backstoreName(testPrefix+"a", 4) {
		t.Fatal("backstore names must be stable per (target, LUN) and differ otherwise")
	}
}

// TestBindingConfinement checks that every request is held to the caller's
// roots before LIO is touched; the LIO root here is an empty folder, so a
// request that passes the checks ends in FAILED_PRECONDITION.
func TestBindingConfinement(t *testing.T) {
	lioRoot := t.TempDir()
	pool := t.TempDir()
	file := filepath.Join(pool, "vol.img")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "secret.img")
	if err := os.WriteFile(outside, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	escape := filepath.Join(pool, "escape.img")
	if err := os.Symlink(outside, escape); err != nil {
		t.Fatal(err)
	}
	roots := []string{testPrefix, pool, "127.0.0.1:3260", "[::]:3260"}
	good := abi.LioLunCreateRequest{Target: testPrefix + "v1", LUN: 1, Kind: "fileio", Path: file, Portals: []string{"127.0.0.1"}}
	with := func(f func(*abi.LioLunCreateRequest)) *abi.LioLunCreateRequest { r := good; f(&r); return &r }
	tests := []struct {
		name string
		call string
		req  hostcalls.Message
		code abi.Code
	}{
		{"granted create reaches LIO", abi.HostCallLioLunCreate, &good, abi.FailedPrecondition},
		{"IPv6 wildcard portal", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Portals = []string{"[::]:3260"} }), abi.FailedPrecondition},
		{"target outside prefixes", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Target = "iqn.2024-01.dev.other:v1" }), abi.PermissionDenied},
		{"target is the prefix", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Target = testPrefix }), abi.PermissionDenied},
		{"path outside roots", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Path = outside }), abi.PermissionDenied},
		{"symlink out of a root", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Path = escape }), abi.PermissionDenied},
		{"dot-dot out of a root", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Path = pool + "/../" + filepath.Base(outside) }), abi.PermissionDenied},
		{"portal not granted", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Portals = []string{"0.0.0.0:3260"} }), abi.PermissionDenied},
		{"no portals", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Portals = nil }), abi.InvalidArgument},
		{"unknown kind", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Kind = "ramdisk" }), abi.InvalidArgument},
		{"block outside /dev", abi.HostCallLioLunCreate, with(func(r *abi.LioLunCreateRequest) { r.Kind = "block" }), abi.PermissionDenied},
		{"granted delete reaches LIO", abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: testPrefix + "v1", LUN: 1}, abi.FailedPrecondition},
		{"delete outside prefixes", abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: "iqn.2024-01.dev.other:v1"}, abi.PermissionDenied},
		{"grant outside prefixes", abi.HostCallLioGrant, &abi.LioGrantRequest{Target: "iqn.2024-01.dev.other:v1", Initiator: "iqn.1993-08.org.debian:01:a"}, abi.PermissionDenied},
		{"grant with a bad initiator", abi.HostCallLioGrant, &abi.LioGrantRequest{Target: testPrefix + "v1", Initiator: "node1"}, abi.InvalidArgument},
		{"grant with half CHAP", abi.HostCallLioGrant, &abi.LioGrantRequest{Target: testPrefix + "v1", Initiator: "iqn.1993-08.org.debian:01:a", ChapUser: "u"}, abi.InvalidArgument},
		{"revoke outside prefixes", abi.HostCallLioRevoke, &abi.LioGrantRequest{Target: "iqn.2024-01.dev.other:v1", Initiator: "iqn.1993-08.org.debian:01:a"}, abi.PermissionDenied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := callAt(t, lioRoot, roots, tc.call, tc.req); abi.CodeOf(err) != tc.code {
				t.Fatalf("%s = %v, want %v", tc.call, err, tc.code)
			}
		})
	}
	if ents, _ := os.ReadDir(lioRoot); len(ents) != 0 {
		t.Fatalf("requests wrote %d entries under the LIO root", len(ents))
	}
}
