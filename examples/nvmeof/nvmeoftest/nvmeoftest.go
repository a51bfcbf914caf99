//go:build !wasip1

// Package nvmeoftest gives tests of the nvmeof module a real NVMe/TCP
// fabric on one machine: the kernel's NVMe target listening on loopback
// (127.0.0.1:4420), the kernel's NVMe/TCP initiator connecting to it, and
// a subsystem NQN prefix of the test's own. When the test ends, also on
// failure, every mount of a namespace disk behind a subsystem under that
// prefix is detached, the controllers to those subsystems are deleted and
// the subsystems (with their namespaces and allowed hosts) are removed.
// The module's own VM tests and the host's csi-sanity and kill tests use
// it.
//
// It must never be imported by non-test code. It skips (never passes) a
// test where the fabric is unavailable: outside the VM tier (make test-vm,
// WASMCSI_VM=1) it only runs where the kernel already has nvmet and
// nvme_tcp, and it loads kernel modules only inside the tier's guest.
package nvmeoftest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/nvmet"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

const (
	envVM        = "WASMCSI_VM"
	envModuleDir = "WASMCSI_MODULE_DIR"
	skipReason   = "needs nvmet and the NVMe/TCP initiator: run make test-vm"
	// Package is the module's import path, for moduletest.Build.
	Package = "github.com/wasmcsi/wasmcsi/examples/nvmeof"
	// Address is where the fixture's subsystems listen and nodes connect.
	Address = "127.0.0.1:4420"
	// prefixBase starts every fixture's NQN prefix.
	prefixBase = "nqn.2024-01.dev.wasmcsi.vmt:"
)

// HostCalls are the families the module imports.
var HostCalls = []string{"file", "nvmet", "nvme"}

// InVM reports whether the test runs inside the VM tier's guest.
func InVM() bool { return os.Getenv(envVM) == "1" }

var headDisk = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

var kernelModules = []string{"configfs", "nvmet", "nvmet_tcp", "nvme_tcp"}

// Require skips t unless it runs as root with nvmet and the NVMe/TCP
// initiator; inside the VM tier it loads the kernel modules, and one that
// does not load fails t, since the tier promises them.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + skipReason)
	}
	for _, m := range kernelModules {
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
	if _, err := os.Stat(filepath.Join(nvmet.DefaultRoot, "subsystems")); err != nil {
		t.Skipf("needs configfs mounted with nvmet at %s: %v", nvmet.DefaultRoot, err)
	}
	if _, err := os.Stat("/dev/nvme-fabrics"); err != nil {
		t.Skipf("needs /dev/nvme-fabrics: %v", err)
	}
}

// Module returns the built nvmeof module for tc, building it where there
// is a toolchain, and skips t when there is none.
func Module(t testing.TB, tc moduletest.Toolchain) string {
	t.Helper()
	if path, why := ModuleFile(tc); path != "" {
		return path
	} else if why != "" {
		t.Skip(why)
	}
	return moduletest.Build(t, Package, tc)
}

// ModuleFile returns the nvmeof module the VM tier copied in for tc; with
// no such folder outside the VM it returns "" and no reason (build it).
func ModuleFile(tc moduletest.Toolchain) (path, why string) {
	dir := os.Getenv(envModuleDir)
	if dir == "" {
		if InVM() {
			return "", "the VM guest cannot build modules and " + envModuleDir + " is not set"
		}
		return "", ""
	}
	name := "nvmeof.wasm"
	if tc == moduletest.TinyGo {
		name = "nvmeof.tinygo.wasm"
	}
	path = filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", "no " + name + " in " + envModuleDir + "=" + dir + ": build it before the VM run"
	}
	return path, ""
}

// Fixture is a fabric's worth of grants for the module: subsystems under
// an NQN prefix of the test's own, on the loopback address.
type Fixture struct {
	Prefix string // NQN prefix of this test, e.g. "nqn.2024-01.dev.wasmcsi.vmt:sanity."
	// BufferedIO serves files through the page cache: the guest's
	// temporary folders are tmpfs, which has no O_DIRECT.
	BufferedIO bool
}

// New returns a fixture named name (lower case letters, digits and '-')
// and registers its cleanup. Register it before the daemon or module that
// uses it, so the cleanup runs after they stopped.
func New(t testing.TB, name string) *Fixture {
	t.Helper()
	Require(t)
	f := &Fixture{Prefix: prefixBase + name + ".", BufferedIO: true}
	f.cleanup(t)
	t.Cleanup(func() { f.cleanup(t) })
	return f
}

// Roots are the grants the module needs beside its pool folder (which must
// come first): the NQN prefix and the address.
func (f *Fixture) Roots() []string { return []string{f.Prefix, Address} }

// Config is the module configuration for the fixture.
func (f *Fixture) Config() map[string]string {
	return map[string]string{"address": Address, "subsystem_prefix": f.Prefix + "v.", "buffered_io": strconv.FormatBool(f.BufferedIO)}
}

// Controller is one controller of this machine to a subsystem of the
// fixture, from sysfs.
type Controller struct {
	Name, Subsystem, Host, State string
	// Disks are the namespace disks it shows ("nvme1n1").
	Disks []string
}

// Controllers lists this machine's controllers to subsystems under the
// fixture's prefix.
func (f *Fixture) Controllers(t testing.TB) []Controller {
	t.Helper()
	return controllers(f.Prefix)
}

func controllers(prefix string) []Controller {
	ents, _ := os.ReadDir("/sys/class/nvme")
	var out []Controller
	for _, e := range ents {
		dir := filepath.Join("/sys/class/nvme", e.Name())
		sub := readAttr(filepath.Join(dir, "subsysnqn"))
		if !strings.HasPrefix(sub, prefix) {
			continue
		}
		c := Controller{Name: e.Name(), Subsystem: sub, Host: readAttr(filepath.Join(dir, "hostnqn")), State: readAttr(filepath.Join(dir, "state"))}
		// The namespace disks of the controller's subsystem.
		blocks, _ := os.ReadDir("/sys/block")
		for _, b := range blocks {
			// nvme<X>n<Y>, not a hidden path of it (nvme<X>c<C>n<Y>).
			if !headDisk.MatchString(b.Name()) {
				continue
			}
			if readAttr(filepath.Join("/sys/block", b.Name(), "device", "subsysnqn")) == sub {
				c.Disks = append(c.Disks, b.Name())
			}
		}
		out = append(out, c)
	}
	return out
}

// Subsystems lists the subsystems under the fixture's prefix, each with
// its allowed hosts.
func (f *Fixture) Subsystems(t testing.TB) map[string][]string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(nvmet.DefaultRoot, "subsystems"))
	out := map[string][]string{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), f.Prefix) {
			continue
		}
		hosts, _ := os.ReadDir(filepath.Join(nvmet.DefaultRoot, "subsystems", e.Name(), "allowed_hosts"))
		list := []string{}
		for _, h := range hosts {
			list = append(list, h.Name())
		}
		out[e.Name()] = list
	}
	return out
}

// cleanup releases everything under the fixture's prefix: mounts of its
// namespace disks, the controllers, the subsystems. Errors are reported,
// not fatal: cleanup goes on.
func (f *Fixture) cleanup(t testing.TB) {
	for _, c := range controllers(f.Prefix) {
		for _, d := range c.Disks {
			unmountDevice(t, "/dev/"+d)
		}
		_ = os.WriteFile(filepath.Join("/sys/class/nvme", c.Name, "delete_controller"), []byte("1"), 0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(controllers(f.Prefix)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	tg := nvmet.New("")
	ents, _ := os.ReadDir(filepath.Join(nvmet.DefaultRoot, "subsystems"))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), f.Prefix) {
			continue
		}
		nss, _ := os.ReadDir(filepath.Join(nvmet.DefaultRoot, "subsystems", e.Name(), "namespaces"))
		for _, ns := range nss {
			id, _ := strconv.Atoi(ns.Name())
			if err := tg.DeleteNamespace(context.Background(), e.Name(), id, ""); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if len(nss) == 0 {
			// A subsystem without namespaces: deleting NSID 1 removes it.
			if err := tg.DeleteNamespace(context.Background(), e.Name(), 1, ""); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
}

// unmountDevice detaches every mount of dev, deepest first.
func unmountDevice(t testing.TB, dev string) {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return
	}
	var st unix.Stat_t
	if unix.Stat(dev, &st) != nil {
		return
	}
	var points []string
	for _, m := range mounts {
		if m.Major == int(unix.Major(st.Rdev)) && m.Minor == int(unix.Minor(st.Rdev)) {
			points = append(points, m.Mountpoint)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s (%s): %v", p, dev, err)
		}
	}
}

func readAttr(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// Timed runs fn and logs its wall time under what ("timing <what> <ms> ms").
func Timed(t testing.TB, what string, fn func()) time.Duration {
	t.Helper()
	start := time.Now()
	fn()
	d := time.Since(start)
	t.Logf("timing %-36s %9.2f ms", what, float64(d.Microseconds())/1000)
	return d
}
