//go:build !wasip1

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Quotas need a kernel with quota support; this machine's may have none, so
// the test runs wherever the kernel has it — the VM tier (make test-vm)
// runs it on a stock Debian kernel — and skips with the reason elsewhere.

// quotaPool mounts a fresh filesystem with project quotas and returns a
// pool folder on it.
func quotaPool(t *testing.T, fstype string, mkfs []string, data string) string {
	t.Helper()
	mounttest.RequireRoot(t)
	if os.Getenv("WASMCSI_VM") == "1" {
		_ = exec.Command("modprobe", "-a", "loop", "xfs", "ext4", "quota_v2").Run()
	}
	dev := mounttest.Loop(t, 320<<20) // mkfs.xfs wants 300 MB
	mounttest.Mkfs(t, fstype, dev, mkfs...)
	mnt, err := mounttest.Mount(t, dev, fstype, data)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ESRCH) {
		t.Skipf("needs a kernel with %s project quota support (make test-vm): %v", fstype, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(mnt, "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	return pool
}

// write fills path with n bytes, as a workload would, without the
// privilege that lets root ignore ext4 hard limits.
func write(path string, n int) error {
	return os.WriteFile(path, make([]byte, n), 0o644)
}

func TestQuotaEnforcedAndExpanded(t *testing.T) {
	for _, tc := range []struct {
		name, fstype, data string
		mkfs               []string
	}{
		{"xfs", "xfs", "prjquota", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := quotaPool(t, tc.fstype, tc.mkfs, tc.data)
			b, err := realBackend(t, pool, map[string]string{"quota": "required"})
			if err != nil {
				t.Fatal(err)
			}
			if !offers(t, b, abi.OpExpandVolume) {
				t.Fatal("expansion not offered on a quota pool")
			}
			const mib = 1 << 20
			vol, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "q", RequiredBytes: 8 * mib})
			if err != nil {
				t.Fatal(err)
			}
			dir := vol.Context["path"]
			if err := write(filepath.Join(dir, "big"), 12*mib); err == nil {
				t.Fatal("wrote 12 MiB into an 8 MiB volume")
			}
			os.Remove(filepath.Join(dir, "big"))
			var st unix.Statfs_t
			if err := unix.Statfs(dir, &st); err != nil {
				t.Fatal(err)
			}
			if size := int64(st.Blocks) * st.Bsize; size != 8*mib {
				t.Errorf("statfs inside the volume reports %d bytes, want the quota %d", size, 8*mib)
			}
			if _, err := b.ExpandVolume(&abi.ExpandVolumeRequest{Volume: abi.VolumeRef{LocalID: "v-" + sdk.NameID("q", "vol")}, RequiredBytes: 16 * mib}); err != nil {
				t.Fatal(err)
			}
			if err := write(filepath.Join(dir, "big"), 12*mib); err != nil {
				t.Fatalf("12 MiB after expanding to 16 MiB: %v", err)
			}
			// A clone inherits the quota of its own size.
			clone, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "c", RequiredBytes: 16 * mib, Source: &abi.VolumeSource{Volume: &abi.VolumeRef{LocalID: "v-" + sdk.NameID("q", "vol")}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := write(filepath.Join(clone.Context["path"], "more"), 8*mib); err == nil {
				t.Error("a 16 MiB clone holding 12 MiB took 8 MiB more")
			}
		})
	}
}

func TestQuotaRequiredRefusedWithout(t *testing.T) {
	mounttest.RequireRoot(t)
	pool := filepath.Join(mounttest.Tmpfs(t, ""), "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := realBackend(t, pool, map[string]string{"quota": "required"}); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("quota=required on a pool without quotas: %v", err)
	}
}
