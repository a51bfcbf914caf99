// Package vmtest decides whether a test that needs the privileged VM tier
// may run, and prepares the kernel for it. Tests that need kernel features
// an ordinary CI machine lacks (device-mapper targets, the iSCSI initiator,
// LIO) live in files named *_vm_test.go and start with Require; the tier
// (.ci/vm/test.sh, make test-vm) runs them as root in a guest with a stock
// Debian kernel and sets WASMCSI_VM=1.
//
// Outside the tier a test runs only where the kernel already has what it
// needs, and skips with the reason otherwise: never a silent pass. vmtest
// must never be imported by non-test code and never loads modules outside
// the VM: a developer's machine is not ours to change.
package vmtest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	// EnvVM is set to "1" by the VM tier inside its guest.
	EnvVM = "WASMCSI_VM"
	// EnvModuleDir names the folder of built .wasm modules the tier copied
	// into the guest.
	EnvModuleDir = "WASMCSI_MODULE_DIR"
	// SkipReason is how a test that needs the tier says so.
	SkipReason = "needs the VM tier: run make test-vm"
)

// InVM reports whether the test runs inside the VM tier's guest.
func InVM() bool { return os.Getenv(EnvVM) == "1" }

// Require skips t unless it runs as root and has the kernel modules named
// (e.g. "dm_thin_pool", "iscsi_tcp"). A module counts when it is loaded or
// built in; inside the VM tier a missing one is loaded with modprobe, and a
// module that does not load fails t, since the tier promises it. With no
// modules named, Require skips everywhere but in the tier.
func Require(t testing.TB, modules ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + SkipReason)
	}
	if len(modules) == 0 && !InVM() {
		t.Skip(SkipReason)
	}
	release := kernelRelease()
	builtin := filepath.Join("/lib/modules", release, "modules.builtin")
	for _, m := range modules {
		if modulePresent("/sys/module", builtin, m) {
			continue
		}
		if !InVM() {
			t.Skipf("needs kernel module %s, absent here (kernel %s): %s", m, release, SkipReason)
		}
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			t.Fatalf("VM tier: modprobe %s: %v: %s", m, err, strings.TrimSpace(string(out)))
		}
	}
}

// ModuleDir returns the folder of built .wasm modules the tier copied in,
// and skips t when there is none.
func ModuleDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(EnvModuleDir)
	if dir == "" {
		t.Skip("needs built modules (" + EnvModuleDir + "): " + SkipReason + " with VM_FILES=<folder of .wasm files>")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("%s=%s: %v", EnvModuleDir, dir, err)
	}
	return dir
}

// modulePresent reports whether kernel module name is loaded (a folder in
// sysDir) or listed as built in by the builtin file.
func modulePresent(sysDir, builtinFile, name string) bool {
	name = strings.ReplaceAll(name, "-", "_")
	// A loaded module always has a folder in /sys/module, a built-in one
	// only when it has parameters; modules.builtin lists the rest.
	if st, err := os.Stat(filepath.Join(sysDir, name)); err == nil && st.IsDir() {
		return true
	}
	f, err := os.Open(builtinFile)
	if err != nil {
		return false
	}
	defer f.Close()
	return listsBuiltin(f, name)
}

// listsBuiltin reads modules.builtin: one path per line, like
// kernel/drivers/md/dm-mod.ko, where - and _ are the same in a name.
func listsBuiltin(r io.Reader, name string) bool {
	s := bufio.NewScanner(r)
	for s.Scan() {
		base := strings.TrimSuffix(filepath.Base(strings.TrimSpace(s.Text())), ".ko")
		if strings.ReplaceAll(base, "-", "_") == name {
			return true
		}
	}
	return false
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}
