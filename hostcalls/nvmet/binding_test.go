package nvmet

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestGrants(t *testing.T) {
	roots := []string{"nqn.2024-01.dev.wasmcsi:a.", "/pool", "0.0.0.0:4420", "192.0.2.5:4420"}
	for nqn, want := range map[string]abi.Code{
		"nqn.2024-01.dev.wasmcsi:a.v1": abi.OK,
		"nqn.2024-01.dev.wasmcsi:a.":   abi.PermissionDenied, // the prefix itself
		"nqn.2024-01.dev.wasmcsi:b.v1": abi.PermissionDenied,
		"nqn.2024-01.dev.wasmcsi:a.,x": abi.InvalidArgument,
	} {
		if got := abi.CodeOf(grantedSubsystem(roots, nqn)); got != want {
			t.Errorf("grantedSubsystem(%q) = %v, want %v", nqn, got, want)
		}
	}
	for port, want := range map[string]abi.Code{
		"0.0.0.0:4420":   abi.OK,
		"192.0.2.5":      abi.OK, // 4420 by default
		"192.0.2.5:4421": abi.PermissionDenied,
		"[::]:4420":      abi.PermissionDenied,
		"host:4420":      abi.InvalidArgument,
	} {
		_, err := grantedPorts(roots, []string{port})
		if got := abi.CodeOf(err); got != want {
			t.Errorf("grantedPorts(%q) = %v, want %v", port, got, want)
		}
	}
	pool := t.TempDir()
	outside := t.TempDir()
	in := filepath.Join(pool, "v.img")
	out := filepath.Join(outside, "x.img")
	for _, p := range []string{in, out} {
		if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	escape := filepath.Join(pool, "escape.img")
	if err := os.Symlink(out, escape); err != nil {
		t.Fatal(err)
	}
	fileRoots := []string{pool}
	for path, want := range map[string]abi.Code{
		in:                              abi.OK,
		out:                             abi.PermissionDenied,
		escape:                          abi.PermissionDenied, // a link out of the pool
		filepath.Join(pool, "none.img"): abi.NotFound,
		filepath.Join(pool, "a b.img"):  abi.InvalidArgument,
		pool:                            abi.InvalidArgument, // a folder
		"relative.img":                  abi.InvalidArgument,
	} {
		if got := abi.CodeOf(grantedBacking(fileRoots, path)); got != want {
			t.Errorf("grantedBacking(%q) = %v, want %v", path, got, want)
		}
	}
}
