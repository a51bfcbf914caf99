//go:build !wasip1

// Package lvmmodule gives tests the built lvm module and its grants on a
// real volume group (hostcalls/lvm/lvmtest). The module's own VM tests and
// the host's csi-sanity tests use it. It must never be imported by
// non-test code.
package lvmmodule

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmtest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Package is the module's import path, for moduletest.Build.
const Package = "github.com/wasmcsi/wasmcsi/examples/lvm"

// HostCalls are the families the module imports.
var HostCalls = []string{"lvm"}

// InVM reports whether the test runs inside the VM tier's guest.
func InVM() bool { return os.Getenv("WASMCSI_VM") == "1" }

// Module returns the built lvm module for tc: the one the VM tier copied
// in ($WASMCSI_MODULE_DIR; the guest has no toolchain), else a fresh
// build. It skips t when the tier holds none.
func Module(t testing.TB, tc moduletest.Toolchain) string {
	t.Helper()
	dir := os.Getenv("WASMCSI_MODULE_DIR")
	if dir == "" {
		if InVM() {
			t.Skip("the VM guest cannot build modules and WASMCSI_MODULE_DIR is not set")
		}
		return moduletest.Build(t, Package, tc)
	}
	name := "lvm.wasm"
	if tc == moduletest.TinyGo {
		name = "lvm.tinygo.wasm"
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		t.Skip("no " + name + " in WASMCSI_MODULE_DIR=" + dir + ": build it before the VM run (.ci/vm/test.sh does; TinyGo with WASMCSI_TINYGO set)")
	}
	return path
}

// Config is the module configuration for a fixture: class "thick" on its
// VG, class "thin" on its thin pool (when it has one, and then the
// default).
func Config(f *lvmtest.Fixture) map[string]string {
	c := map[string]string{"class.thick": f.VG, "default_class": "thick"}
	if f.Pool != "" {
		c["class.thin"] = f.VG + "/" + f.Pool
		c["default_class"] = "thin"
	}
	return c
}
