// Package lvmtest gives tests a real LVM volume group on loop devices, with
// a thin pool and an operator's own (untagged) LV in it, removed again when
// the test ends, also on failure. The family's VM tests, the lvm module's
// and the host's use it.
//
// It must never be imported by non-test code. It skips (never passes) a
// test where LVM cannot run: outside the VM tier (make test-vm,
// WASMCSI_VM=1) it runs only as root on a kernel with device-mapper thin
// provisioning and the lvm2 tools installed, and it loads kernel modules
// only inside the tier's guest.
package lvmtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm"
)

const skipReason = "needs LVM2 and device-mapper thin provisioning: run make test-vm"

// Require skips t unless it runs as root with the lvm tool, loop devices
// and dm_thin_pool; inside the VM tier it loads the kernel modules, and a
// module that does not load fails t, since the tier promises them.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + skipReason)
	}
	inVM := os.Getenv("WASMCSI_VM") == "1"
	if _, err := exec.LookPath("lvm"); err != nil {
		if inVM {
			t.Fatal("VM tier: no lvm tool in the guest")
		}
		t.Skip("no lvm tool: " + skipReason)
	}
	for _, m := range []string{"loop", "dm_mod", "dm_thin_pool"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			continue
		}
		if !inVM {
			t.Skipf("kernel module %s is not loaded: %s", m, skipReason)
		}
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			t.Fatalf("VM tier: modprobe %s: %v: %s", m, err, strings.TrimSpace(string(out)))
		}
	}
}

// Fixture is a volume group made for one test.
type Fixture struct {
	VG   string // the volume group
	Pool string // its thin pool
	// OperatorLV is an LV of the VG without the owner tag, holding
	// OperatorData at its start: nothing the daemon does may touch it.
	OperatorLV   string
	OperatorData []byte
	t            testing.TB
}

// Run runs an lvm command for the test (lvm <args>), failing t on error.
func Run(t testing.TB, args ...string) []byte {
	t.Helper()
	out, err := lvm.Tool{}.Run(context.Background(), args...)
	if err != nil {
		t.Fatalf("lvm %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// New makes VG "wcsi<name>" on one loop device of size bytes, with thin
// pool "pool0" of poolSize bytes (none when 0) and the operator's LV
// "operator" of 8 MiB with a pattern written to it. Everything is removed
// when t ends.
func New(t testing.TB, name string, size, poolSize int64) *Fixture {
	t.Helper()
	Require(t)
	dev, _ := looptest.Device(t, size)
	f := &Fixture{VG: "wcsi" + name, Pool: "pool0", OperatorLV: "operator", t: t}
	Run(t, "pvcreate", "--yes", "--", dev)
	t.Cleanup(func() { _, _ = lvm.Tool{}.Run(context.Background(), "pvremove", "--yes", "--force", "--", dev) })
	Run(t, "vgcreate", "--yes", "-s", "1m", "--", f.VG, dev)
	t.Cleanup(func() {
		if _, err := (lvm.Tool{}).Run(context.Background(), "vgremove", "--yes", "--force", "--", f.VG); err != nil {
			t.Errorf("remove volume group %s: %v", f.VG, err)
		}
	})
	if poolSize > 0 {
		Run(t, "lvcreate", "--yes", "-L", lvmBytes(poolSize), "-T", "--", f.VG+"/"+f.Pool)
	} else {
		f.Pool = ""
	}
	Run(t, "lvcreate", "--yes", "-L", "8m", "-n", f.OperatorLV, "--addtag", "operator", "-a", "y", "--", f.VG)
	f.OperatorData = bytes.Repeat([]byte("operator data "), 4096)
	if err := os.WriteFile(f.OperatorPath(), f.OperatorData, 0); err != nil {
		t.Fatalf("write the operator's LV: %v", err)
	}
	return f
}

// OperatorPath is the operator LV's device.
func (f *Fixture) OperatorPath() string { return "/dev/mapper/" + lvm.DMName(f.VG, f.OperatorLV) }

// CheckOperator fails t unless the operator's LV is there, active, of
// 8 MiB, with its data and its tag.
func (f *Fixture) CheckOperator(t testing.TB) {
	t.Helper()
	out := Run(t, "lvs", "--noheadings", "--units", "b", "--nosuffix", "-o", "lv_size,lv_tags,lv_active", "--", f.VG+"/"+f.OperatorLV)
	if got := strings.Join(strings.Fields(string(out)), " "); got != "8388608 operator active" {
		t.Errorf("operator's LV: %q, want 8388608 operator active", got)
	}
	fd, err := os.Open(f.OperatorPath())
	if err != nil {
		t.Fatalf("operator's LV: %v", err)
	}
	defer fd.Close()
	got := make([]byte, len(f.OperatorData))
	if _, err := fd.ReadAt(got, 0); err != nil || !bytes.Equal(got, f.OperatorData) {
		t.Errorf("the operator's LV lost its data (%v)", err)
	}
}

// Roots are the grants of the fixture: its VG (thick LVs) and its pool.
func (f *Fixture) Roots() []string {
	r := []string{lvm.RootPrefix + f.VG}
	if f.Pool != "" {
		r = append(r, lvm.RootPrefix+f.VG+":"+f.Pool)
	}
	return r
}

func lvmBytes(n int64) string { return strconv.FormatInt(n, 10) + "b" }
