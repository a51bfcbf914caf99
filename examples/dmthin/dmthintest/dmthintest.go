//go:build !wasip1

// Package dmthintest gives tests of the dmthin module a real thin pool to
// grant it: backing files in a folder, attached as loop devices, under a
// device-mapper name prefix of the test's own, and everything under that
// prefix removed again when the test ends, also on failure. The module's
// own VM tests and the host's csi-sanity and capacity tests use it.
//
// It must never be imported by non-test code. It skips (never passes) a test
// where device-mapper thin provisioning is unavailable: outside the VM tier
// (make test-vm, WASMCSI_VM=1) it only runs on a kernel that already has
// dm_thin_pool, and it loads kernel modules only inside the tier's guest.
package dmthintest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

const (
	// envVM and envModuleDir are set by the VM tier (.ci/vm/test.sh).
	envVM        = "WASMCSI_VM"
	envModuleDir = "WASMCSI_MODULE_DIR"
	skipReason   = "needs device-mapper thin provisioning: run make test-vm"
	// Package is the module's import path, for moduletest.Build.
	Package = "github.com/wasmcsi/wasmcsi/examples/dmthin"
)

// InVM reports whether the test runs inside the VM tier's guest.
func InVM() bool { return os.Getenv(envVM) == "1" }

// Require skips t unless it runs as root on a kernel with loop devices and
// dm_thin_pool; inside the VM tier it loads the modules, and a module that
// does not load fails t, since the tier promises them.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + skipReason)
	}
	for _, m := range []string{"loop", "dm_mod", "dm_thin_pool"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			continue
		}
		if !InVM() {
			t.Skipf("kernel module %s is not loaded: %s", m, skipReason)
		}
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			t.Fatalf("VM tier: modprobe %s: %v: %s", m, err, strings.TrimSpace(string(out)))
		}
	}
}

// Module returns the built dmthin module for tc (see ModuleFile), and
// skips t when there is none.
func Module(t testing.TB, tc moduletest.Toolchain) string {
	t.Helper()
	if path, why := ModuleFile(tc); path != "" {
		return path
	} else if why != "" {
		t.Skip(why)
	}
	return moduletest.Build(t, Package, tc)
}

// ModuleFile returns the dmthin module the VM tier copied in for tc
// ($WASMCSI_MODULE_DIR/dmthin.wasm or dmthin.tinygo.wasm): the guest has no
// toolchain. With no such folder outside the VM it returns "" and no
// reason (build the module); otherwise a missing file is "" and the reason.
func ModuleFile(tc moduletest.Toolchain) (path, why string) {
	dir := os.Getenv(envModuleDir)
	if dir == "" {
		if InVM() {
			return "", "the VM guest cannot build modules and " + envModuleDir + " is not set"
		}
		return "", ""
	}
	name := "dmthin.wasm"
	if tc == moduletest.TinyGo {
		name = "dmthin.tinygo.wasm"
	}
	path = filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", "no " + name + " in " + envModuleDir + "=" + dir + ": build it before the VM run (.ci/vm/test.sh does; TinyGo with WASMCSI_TINYGO set)"
	}
	return path, ""
}

// Fixture is a thin pool's worth of grants for the module.
type Fixture struct {
	Prefix  string // device-mapper name prefix of this test, e.g. "wasmcsi-vmt-sanity-"
	Pool    string // Prefix + "pool"
	Files   string // folder of the backing files
	Data    string // data backing file
	Meta    string // metadata backing file
	DataDev string // its loop device
	MetaDev string
}

// New creates sparse backing files of dataSize and metaSize bytes and
// attaches them as loop devices. The module attaches the same files again
// with loop_attach and finds these devices; the dm host calls take only
// granted devices, so Roots grants these two by path. When t ends every
// device-mapper device under the fixture's prefix is removed (thin devices,
// then the pool) and the loop devices are detached.
func New(t testing.TB, name string, dataSize, metaSize int64) *Fixture {
	t.Helper()
	Require(t)
	f := &Fixture{Prefix: "wasmcsi-vmt-" + name + "-"}
	f.Pool = f.Prefix + "pool"
	dir, err := os.MkdirTemp("", "dmthin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f.Files = dir
	ctx := context.Background()
	m, err := dm.New(f.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	// A prefix left over from an aborted run would make the pool's
	// metadata "in use"; start clean.
	removeAll(t, m, f.Pool)
	for _, d := range []struct {
		file *string
		dev  *string
		size int64
		name string
	}{{&f.Data, &f.DataDev, dataSize, "data"}, {&f.Meta, &f.MetaDev, metaSize, "meta"}} {
		*d.file = filepath.Join(dir, d.name)
		fh, err := os.Create(*d.file)
		if err == nil {
			err = errors.Join(fh.Truncate(d.size), fh.Close())
		}
		if err != nil {
			t.Fatal(err)
		}
		dev, err := loop.Attach(ctx, *d.file, loop.Options{})
		if err != nil {
			t.Fatalf("attach %s: %v", *d.file, err)
		}
		*d.dev = dev.Path
		t.Cleanup(func() {
			if err := loop.Detach(context.Background(), dev.Path); err != nil {
				t.Errorf("cleanup: detach %s: %v", dev.Path, err)
			}
		})
	}
	t.Cleanup(func() { removeAll(t, m, f.Pool) })
	return f
}

// RemoveAll removes every device-mapper device under prefix, thin devices
// first and the pool last, and reports failures on t: the cleanup of a
// test that made a pool of its own.
func RemoveAll(t testing.TB, prefix, pool string) {
	m, err := dm.New(prefix)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	removeAll(t, m, pool)
}

// removeAll removes every device under m's prefix: thin devices first, the
// pool last.
func removeAll(t testing.TB, m *dm.Mapper, pool string) {
	ctx := context.Background()
	devs, err := m.List(ctx)
	if err != nil {
		t.Errorf("cleanup: list dm devices: %v", err)
		return
	}
	for _, last := range []bool{false, true} {
		for _, d := range devs {
			if (d.Name == pool) == last {
				if err := m.Remove(ctx, d.Name); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
	}
}

// Roots are the grants the module needs beside its state folder (which
// must come first): the name prefix, the device nodes under it (for the
// host's node steps), the folder of the backing files and their loop
// devices.
func (f *Fixture) Roots() []string {
	return []string{f.Prefix, "/dev/mapper/" + f.Prefix, f.Files, f.DataDev, f.MetaDev}
}

// Config is the module configuration for the fixture's pool.
func (f *Fixture) Config() map[string]string {
	return map[string]string{"pool": f.Pool, "data_device": f.Data, "metadata_device": f.Meta}
}

// HostCalls are the families the module imports.
var HostCalls = []string{"dm", "file", "loop"}

// Timed runs fn and logs its wall time under what, in a form the tier's
// output can be searched for ("timing <what> <ms> ms").
func Timed(t testing.TB, what string, fn func()) time.Duration {
	t.Helper()
	start := time.Now()
	fn()
	d := time.Since(start)
	t.Logf("timing %-36s %9.2f ms", what, float64(d.Microseconds())/1000)
	return d
}
