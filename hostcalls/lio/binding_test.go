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
	want := map[string]bool{abi.HostCallLioLunCreate: true, abi.HostCallLioLunDelete: true, abi.HostCallLioGrant: true,
		abi.HostCallLioRevoke: true, abi.HostCallLioLunResize: true}
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
		{"resize outside prefixes", abi.HostCallLioLunResize, &abi.LioLunResizeRequest{Target: "iqn.2024-01.dev.other:v1", SizeBytes: 1 << 20}, abi.PermissionDenied},
		{"resize to an odd size", abi.HostCallLioLunResize, &abi.LioLunResizeRequest{Target: testPrefix + "v1", SizeBytes: 1000}, abi.InvalidArgument},
		{"resize LUN 256", abi.HostCallLioLunResize, &abi.LioLunResizeRequest{Target: testPrefix + "v1", LUN: 256, SizeBytes: 1 << 20}, abi.InvalidArgument},
		{"granted resize reaches LIO", abi.HostCallLioLunResize, &abi.LioLunResizeRequest{Target: testPrefix + "v1", SizeBytes: 1 << 20}, abi.FailedPrecondition},
		{"guarded delete reaches LIO", abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: testPrefix + "v1", LUN: 1, Path: file}, abi.FailedPrecondition},
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

// fakeLUN lays out, in a plain folder, the part of LIO's configfs tree that
// describes LUN lun of target served by a backstore of kind made from path:
// enough for the calls that read it before they change anything.
func fakeLUN(t *testing.T, root, target string, lun int, kind Kind, path string) (backstore string) {
	t.Helper()
	hba, _ := kind.hba()
	name := backstoreName(target, lun)
	bs := filepath.Join(root, "core", hba, name)
	lunDir := filepath.Join(root, "iscsi", target, tpg, "lun", lunName(lun))
	for _, d := range []string{bs, lunDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for attr, v := range map[string]string{"udev_path": path, "control": "", "enable": "1"} {
		if err := os.WriteFile(filepath.Join(bs, attr), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(bs, filepath.Join(lunDir, name)); err != nil {
		t.Fatal(err)
	}
	return bs
}

func TestBindingLunResize(t *testing.T) {
	pool := t.TempDir()
	file := filepath.Join(pool, "vol.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 32<<20); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	target := testPrefix + "grow"
	fileio := fakeLUN(t, root, target, 3, FileIO, file)
	fakeLUN(t, root, target, 4, Block, "/dev/vdb")
	roots := []string{testPrefix, pool}
	resize := func(lun int32, size int64) error {
		return callAt(t, root, roots, abi.HostCallLioLunResize, &abi.LioLunResizeRequest{Target: target, LUN: lun, SizeBytes: size})
	}
	control := func() string {
		b, err := os.ReadFile(filepath.Join(fileio, "control"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if err := resize(3, 64<<20); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("resize past the file's end = %v, want FAILED_PRECONDITION", err)
	}
	if got := control(); got != "" {
		t.Fatalf("a refused resize wrote %q to control", got)
	}
	if err := resize(3, 32<<20); err != nil {
		t.Fatal(err)
	}
	if got, want := control(), "fd_dev_size=33554432"; got != want {
		t.Fatalf("control = %q, want %q", got, want)
	}
	if err := resize(4, 64<<20); err != nil {
		t.Fatalf("resize of a block LUN = %v, want success (it follows its device)", err)
	}
	if err := resize(5, 32<<20); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("resize of a missing LUN = %v, want NOT_FOUND", err)
	}
}

// TestBindingLunDeleteGuard checks that lio_lun_delete with a Path leaves
// a LUN that serves another backing store alone.
func TestBindingLunDeleteGuard(t *testing.T) {
	pool := t.TempDir()
	root := t.TempDir()
	target := testPrefix + "guard"
	mine, theirs := filepath.Join(pool, "mine.img"), filepath.Join(pool, "theirs.img")
	bs := fakeLUN(t, root, target, 7, FileIO, theirs)
	if err := callAt(t, root, []string{testPrefix, pool}, abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: target, LUN: 7, Path: mine}); err != nil {
		t.Fatalf("guarded delete of another volume's LUN = %v, want success", err)
	}
	if _, err := os.Stat(filepath.Join(root, "iscsi", target, tpg, "lun", lunName(7), filepath.Base(bs))); err != nil {
		t.Fatalf("the other volume's LUN was touched: %v", err)
	}
	// The LUN that does serve the path goes on to the real delete. A plain
	// folder lets it unmap the LUN but not remove the backstore folder
	// (configfs drops attribute files by itself), so it ends in an error.
	err := callAt(t, root, []string{testPrefix, pool}, abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: target, LUN: 7, Path: theirs})
	if _, serr := os.Stat(filepath.Join(root, "iscsi", target, tpg, "lun", lunName(7))); !os.IsNotExist(serr) {
		t.Fatalf("guarded delete of the matching LUN did not unmap it (%v): %v", err, serr)
	}
}
