//go:build !wasip1

// Package iscsitest gives tests of the iscsi module a real iSCSI SAN on one
// machine: the kernel's LIO target listening on loopback (127.0.0.1:3260),
// open-iscsi's initiator logging in to it, and a target name prefix of the
// test's own. When the test ends, also on failure, every mount of a disk of
// a session to a target under that prefix is detached, those sessions are
// logged out and their node records deleted, and the targets and the
// backstores the module made for them are removed from LIO. The module's
// own VM tests and the host's csi-sanity and shared-session tests use it.
//
// It must never be imported by non-test code. It skips (never passes) a
// test where the SAN is unavailable: outside the VM tier (make test-vm,
// WASMCSI_VM=1) it only runs where the kernel already has LIO and the iSCSI
// initiator and iscsid runs, and it loads kernel modules only inside the
// tier's guest.
package iscsitest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/lio"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

const (
	// envVM and envModuleDir are set by the VM tier (.ci/vm/test.sh).
	envVM        = "WASMCSI_VM"
	envModuleDir = "WASMCSI_MODULE_DIR"
	skipReason   = "needs LIO and the iSCSI initiator: run make test-vm"
	// Package is the module's import path, for moduletest.Build.
	Package = "github.com/wasmcsi/wasmcsi/examples/iscsi"
	// Portal is where the fixture's target listens and nodes log in.
	Portal = "127.0.0.1:3260"
	// prefixBase starts every fixture's IQN prefix.
	prefixBase = "iqn.2024-01.dev.wasmcsi.vmt:"
	// backstorePrefix starts the names the lio host calls give backstores.
	backstorePrefix = "wcsi-"
)

// HostCalls are the families the module imports.
var HostCalls = []string{"file", "lio", "iscsi"}

// InVM reports whether the test runs inside the VM tier's guest.
func InVM() bool { return os.Getenv(envVM) == "1" }

// kernelModules are what LIO on configfs and the iSCSI initiator need.
var kernelModules = []string{"configfs", "target_core_mod", "iscsi_target_mod", "target_core_file",
	"target_core_iblock", "scsi_transport_iscsi", "iscsi_tcp", "sd_mod"}

// Require skips t unless it runs as root with LIO, the iSCSI initiator, an
// initiator name and a running iscsid; inside the VM tier it loads the
// kernel modules, and one that does not load fails t, since the tier
// promises them.
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
	if _, err := os.Stat(filepath.Join(lio.DefaultRoot, "core")); err != nil {
		t.Skipf("needs configfs mounted with LIO at %s: %v", lio.DefaultRoot, err)
	}
	if _, err := os.Stat("/etc/iscsi/initiatorname.iscsi"); err != nil {
		t.Skipf("needs open-iscsi's initiator name: %v", err)
	}
	c, err := net.Dial("unix", "@ISCSIADM_ABSTRACT_NAMESPACE")
	if err != nil {
		if InVM() {
			t.Fatalf("VM tier: iscsid does not answer: %v", err)
		}
		t.Skipf("needs a running iscsid: %v", err)
	}
	c.Close()
}

// Module returns the built iscsi module for tc (see ModuleFile), building
// it where there is a toolchain, and skips t when there is none.
func Module(t testing.TB, tc moduletest.Toolchain) string {
	t.Helper()
	if path, why := ModuleFile(tc); path != "" {
		return path
	} else if why != "" {
		t.Skip(why)
	}
	return moduletest.Build(t, Package, tc)
}

// ModuleFile returns the iscsi module the VM tier copied in for tc
// ($WASMCSI_MODULE_DIR/iscsi.wasm or iscsi.tinygo.wasm): the guest has no
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
	name := "iscsi.wasm"
	if tc == moduletest.TinyGo {
		name = "iscsi.tinygo.wasm"
	}
	path = filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", "no " + name + " in " + envModuleDir + "=" + dir + ": build it before the VM run (.ci/vm/test.sh does; TinyGo with WASMCSI_TINYGO set)"
	}
	return path, ""
}

// Fixture is a SAN's worth of grants for the module: a target under an IQN
// prefix of the test's own, on the loopback portal.
type Fixture struct {
	Prefix string // IQN prefix of this test, e.g. "iqn.2024-01.dev.wasmcsi.vmt:sanity."
	Target string // the module's shared target: Prefix + "pool"
	// CHAP credentials the module grants and logs in with; empty for none.
	ChapUser, ChapSecret string
}

// New returns a fixture named name (lower case letters, digits and '-')
// and registers its cleanup. Register it before the daemon or module that
// uses it, so the cleanup runs after they stopped.
func New(t testing.TB, name string) *Fixture {
	t.Helper()
	Require(t)
	f := &Fixture{Prefix: prefixBase + name + "."}
	f.Target = f.Prefix + "pool"
	// Leftovers of an aborted run would make the first LUN "taken".
	f.cleanup(t)
	t.Cleanup(func() { f.cleanup(t) })
	return f
}

// WithCHAP makes the module grant and log in with one-way CHAP.
func (f *Fixture) WithCHAP() *Fixture {
	f.ChapUser, f.ChapSecret = "wasmcsi-vmt", "vmt-secret-0123"
	return f
}

// Roots are the grants the module needs beside its pool folder (which must
// come first): the IQN prefix and the portal.
func (f *Fixture) Roots() []string { return []string{f.Prefix, Portal} }

// Config is the module configuration for the fixture's target.
func (f *Fixture) Config() map[string]string {
	c := map[string]string{"portal": Portal, "target_iqn": f.Target}
	if f.ChapUser != "" {
		c["chap_user"], c["chap_secret"] = f.ChapUser, f.ChapSecret
	}
	return c
}

// Session is one iSCSI session to a target of the fixture, from sysfs.
type Session struct {
	ID     int
	Target string
	State  string
	// Disks maps each LUN with a block device to its kernel name (sdX).
	Disks map[int]string
}

// Sessions lists the node's sessions to targets under the fixture's prefix,
// from /sys/class/iscsi_session.
func (f *Fixture) Sessions(t testing.TB) []Session {
	t.Helper()
	ss, err := sessions(f.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

func sessions(prefix string) ([]Session, error) {
	ents, err := os.ReadDir("/sys/class/iscsi_session")
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Session
	for _, e := range ents {
		id, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "session"))
		if err != nil {
			continue
		}
		dir := filepath.Join("/sys/class/iscsi_session", e.Name())
		target, err := readAttr(filepath.Join(dir, "targetname"))
		if err != nil || !strings.HasPrefix(target, prefix) {
			continue
		}
		state, _ := readAttr(filepath.Join(dir, "state"))
		s := Session{ID: id, Target: target, State: state, Disks: map[int]string{}}
		// .../sessionN/device/targetH:C:T/H:C:T:L/block/sdX
		blocks, _ := filepath.Glob(filepath.Join(dir, "device", "target*", "*:*:*:*", "block", "*"))
		for _, b := range blocks {
			hctl := filepath.Base(filepath.Dir(filepath.Dir(b)))
			lun, err := strconv.Atoi(hctl[strings.LastIndexByte(hctl, ':')+1:])
			if err == nil {
				s.Disks[lun] = filepath.Base(b)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// cleanup releases everything under the fixture's prefix: mounts of its
// sessions' disks, the sessions and their node records, the targets and
// their backstores. Errors are reported, not fatal: cleanup goes on.
func (f *Fixture) cleanup(t testing.TB) {
	ctx := context.Background()
	ss, err := sessions(f.Prefix)
	if err != nil {
		t.Errorf("cleanup: sessions: %v", err)
	}
	for _, s := range ss {
		for _, disk := range s.Disks {
			unmountDevice(t, "/dev/"+disk)
		}
		if out, err := exec.Command("iscsiadm", "-m", "session", "-r", strconv.Itoa(s.ID), "-u").CombinedOutput(); err != nil {
			t.Errorf("cleanup: log out session %d (%s): %v: %s", s.ID, s.Target, err, out)
		}
		exec.Command("iscsiadm", "-m", "node", "-T", s.Target, "-o", "delete").Run()
	}
	c, err := lio.New(lio.Config{IQNPrefix: f.Prefix, NamePrefix: backstorePrefix})
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	targets, _ := os.ReadDir(filepath.Join(lio.DefaultRoot, "iscsi"))
	var ours []string
	for _, e := range targets {
		if strings.HasPrefix(e.Name(), f.Prefix) {
			ours = append(ours, e.Name())
			if err := c.DeleteTarget(ctx, e.Name()); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
	if !slices.Contains(ours, f.Target) {
		ours = append(ours, f.Target)
	}
	// The lio host calls name a target's backstores
	// "wcsi-<16 hex digits of the target's SHA-256>-<LUN>".
	for _, target := range ours {
		sum := sha256.Sum256([]byte(target))
		mine := backstorePrefix + hex.EncodeToString(sum[:8]) + "-"
		for _, k := range []lio.Kind{lio.FileIO, lio.Block} {
			hba := map[lio.Kind]string{lio.FileIO: "fileio_0", lio.Block: "iblock_0"}[k]
			ents, _ := os.ReadDir(filepath.Join(lio.DefaultRoot, "core", hba))
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), mine) {
					if err := c.DeleteBackstore(ctx, k, e.Name()); err != nil {
						t.Errorf("cleanup: %v", err)
					}
				}
			}
		}
	}
}

// unmountDevice detaches every mount of dev (lazily: a test that failed
// may still hold files open), deepest first.
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

func readAttr(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

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
