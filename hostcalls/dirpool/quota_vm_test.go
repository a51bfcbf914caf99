package dirpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// The quota tests need a kernel with quota support (CONFIG_QUOTA,
// CONFIG_XFS_QUOTA, and the quota_v2 module for ext4's quota feature). They
// run as root wherever the kernel has it, and in the VM tier (make test-vm)
// on a stock Debian kernel; elsewhere the quota cases skip with the reason.

const (
	mib     = 1 << 20
	fsBytes = 320 * mib // mkfs.xfs refuses filesystems below 300 MB
)

// quotaFS mounts a fresh filesystem for the quota tests. When the test asks
// for quotas (quota in the mkfs features or the mount data) and the mount
// fails with EINVAL, the kernel lacks quota support (CONFIG_QUOTA,
// CONFIG_QFMT_V2, CONFIG_XFS_QUOTA; the kernel log says which): skip,
// saying so. ESRCH means the quota format ext4 needs (the quota_v2 module)
// is not loaded. Every other failure fails the test.
func quotaFS(t *testing.T, fstype string, mkfsArgs []string, data string, wantsQuota bool) string {
	t.Helper()
	dev := mounttest.Loop(t, fsBytes)
	mounttest.Mkfs(t, fstype, dev, mkfsArgs...)
	mnt, err := mounttest.Mount(t, dev, fstype, data)
	if wantsQuota && errors.Is(err, unix.EINVAL) {
		t.Skipf("needs a kernel with %s quota support: %v", fstype, err)
	}
	if wantsQuota && errors.Is(err, unix.ESRCH) {
		t.Skipf("needs the quota_v2 kernel module for ext4 quotas: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return mnt
}

func TestQuotaSupport(t *testing.T) {
	mounttest.RequireRoot(t)
	if vmtest.InVM() {
		vmtest.Require(t, "loop", "xfs", "ext4")
	}
	for _, tc := range []struct {
		name   string
		fstype string
		mkfs   []string
		data   string
		quota  bool // asks for quotas, so the kernel must have them
		want   bool
	}{
		{"xfs prjquota", "xfs", []string{"-q"}, "prjquota", true, true},
		{"xfs pquota", "xfs", []string{"-q"}, "pquota", true, true},
		{"xfs without quota", "xfs", []string{"-q"}, "", false, false},
		{"xfs uquota only", "xfs", []string{"-q"}, "uquota", true, false},
		{"ext4 prjquota", "ext4", []string{"-q", "-O", "quota,project"}, "prjquota", true, true},
		{"ext4 project feature, no prjquota", "ext4", []string{"-q", "-O", "quota,project"}, "noquota", true, false},
		{"ext4 without quota", "ext4", []string{"-q"}, "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			p := newPool(t, quotaFS(t, tc.fstype, tc.mkfs, tc.data, tc.quota))
			if got := p.QuotaSupported(); got != tc.want {
				t.Fatalf("QuotaSupported() = %v (%s), want %v", got, p.noQuota, tc.want)
			}
			if tc.want {
				quotaRoundTrip(t, p)
				return
			}
			_, err := p.Create(ctx, "vol", 8*mib)
			wantCode(t, "Create with a quota", err, abi.FailedPrecondition)
			if p.Exists(ctx, "vol") {
				t.Fatal("Create with an unsupported quota created the directory")
			}
			_, err = p.Create(ctx, "vol", 0)
			must(t, err)
			wantCode(t, "SetQuota", p.SetQuota(ctx, "vol", 8*mib), abi.FailedPrecondition)
		})
	}
}

func TestQuotaUnsupportedOnTmpfs(t *testing.T) {
	mounttest.RequireRoot(t)
	p := newPool(t, mounttest.Tmpfs(t, "size=16m"))
	if p.QuotaSupported() {
		t.Fatal("tmpfs reported project quota support")
	}
	err := p.SetQuota(context.Background(), "vol", mib)
	wantCode(t, "SetQuota on tmpfs", err, abi.FailedPrecondition)
}

// fill writes to path in 1 MiB chunks until n bytes are written or a write
// fails, and returns how much was written and the error. It writes as a
// workload would, without CAP_SYS_RESOURCE, which lets ext4 (any generic
// quota filesystem) ignore hard limits.
func fill(t *testing.T, path string, n int64) (written int64, err error) {
	t.Helper()
	withoutCap(t, unix.CAP_SYS_RESOURCE, func() { written, err = fillFile(path, n) })
	return written, err
}

// withoutCap runs fn on a goroutine locked to its OS thread, with capability
// c dropped from that thread's effective set (capabilities are per thread),
// and raises it again afterwards. If it cannot be raised again the thread
// is not unlocked, so the runtime retires it.
func withoutCap(t *testing.T, c int, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capget: %w", err)
			return
		}
		saved := data
		data[c/32].Effective &^= 1 << (c % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capset: %w", err)
			return
		}
		fn()
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			done <- fmt.Errorf("restore capabilities: %w", err)
			return
		}
		runtime.UnlockOSThread()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func fillFile(path string, n int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, mib)
	for i := range buf {
		buf[i] = byte(i)
	}
	var done int64
	for done < n {
		m, err := f.Write(buf[:min(n-done, mib)])
		done += int64(m)
		if err != nil {
			f.Close()
			return done, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return done, err
	}
	return done, f.Close()
}

func projOf(t *testing.T, path string) uint32 {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	var fa fsxattr
	must(t, getFsxattr(int(f.Fd()), &fa))
	return fa.Projid
}

func inodeOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Stat(path, &st))
	return st.Ino
}

// quotaRoundTrip runs the life of a quota'd volume on a pool that supports
// project quotas.
func quotaRoundTrip(t *testing.T, p *Pool) {
	ctx := context.Background()
	vol, err := p.Create(ctx, "vol", 8*mib)
	must(t, err)

	// The project ID is the directory's inode number, inherited below it.
	proj := projOf(t, vol)
	if uint64(proj) != inodeOf(t, vol) {
		t.Fatalf("project ID %d, want the inode number %d", proj, inodeOf(t, vol))
	}
	st, err := p.VolumeStatfs(ctx, "vol")
	must(t, err)
	if st.TotalBytes != 8*mib {
		t.Fatalf("statfs in the volume: %d bytes total, want the quota %d", st.TotalBytes, 8*mib)
	}

	// Writing past the quota fails: EDQUOT on ext4, ENOSPC on xfs, which
	// treats a project quota as the size of a directory tree.
	data := filepath.Join(vol, "data")
	written, err := fill(t, data, 16*mib)
	overrun := unix.EDQUOT
	if p.quota == quotaXFS {
		overrun = unix.ENOSPC
	}
	if !errors.Is(err, overrun) {
		t.Fatalf("writing 16 MiB under an 8 MiB quota: wrote %d, err %v; want %v", written, err, overrun)
	}
	if written > 8*mib {
		t.Fatalf("wrote %d bytes under an 8 MiB quota", written)
	}
	if got := projOf(t, data); got != proj {
		t.Fatalf("file project %d, want inherited %d", got, proj)
	}
	used, inodes, err := p.Usage(ctx, "vol")
	must(t, err)
	if used < written-mib || used > 8*mib || inodes != 2 {
		t.Fatalf("Usage = %d bytes, %d inodes; want about %d bytes and 2 inodes", used, inodes, written)
	}

	// Raising the quota keeps the project and lets the write through.
	must(t, p.SetQuota(ctx, "vol", 32*mib))
	if got := projOf(t, vol); got != proj {
		t.Fatalf("SetQuota changed the project from %d to %d", proj, got)
	}
	if n, err := fill(t, data, 12*mib); err != nil {
		t.Fatalf("write after raising the quota: wrote %d: %v", n, err)
	}
	st, err = p.VolumeStatfs(ctx, "vol")
	must(t, err)
	if st.TotalBytes != 32*mib || st.AvailBytes > 32*mib-written-12*mib+mib {
		t.Fatalf("statfs after raising: %+v", st)
	}
	// Create on the existing volume is idempotent and applies its quota.
	if _, err := p.Create(ctx, "vol", 40*mib); err != nil {
		t.Fatal(err)
	}
	if st, _ := p.VolumeStatfs(ctx, "vol"); st.TotalBytes != 40*mib {
		t.Fatalf("Create on an existing volume did not apply its quota: %+v", st)
	}

	// A copy is charged to the pool root until it gets a quota; then all of
	// its existing content is relabeled and counted.
	must(t, p.Copy(ctx, "vol", "clone"))
	clone := filepath.Join(p.Root(), "clone")
	if got := projOf(t, filepath.Join(clone, "data")); got != p.rootProj {
		t.Fatalf("copied file carries project %d, want the root's %d", got, p.rootProj)
	}
	must(t, p.SetQuota(ctx, "clone", 64*mib))
	cproj := projOf(t, clone)
	if cproj == proj || projOf(t, filepath.Join(clone, "data")) != cproj {
		t.Fatalf("clone project %d (file %d), volume project %d", cproj, projOf(t, filepath.Join(clone, "data")), proj)
	}
	vused, _, err := p.Usage(ctx, "vol")
	must(t, err)
	cused, cinodes, err := p.Usage(ctx, "clone")
	must(t, err)
	if cused < vused-mib || cinodes != 2 {
		t.Fatalf("clone Usage = %d bytes, %d inodes; want about %d bytes, 2 inodes", cused, cinodes, vused)
	}

	// A candidate ID already charged elsewhere is skipped.
	third, err := p.Create(ctx, "third", 0)
	must(t, err)
	taken := uint32(inodeOf(t, third))
	must(t, p.setLimit(taken, mib)) // someone else's limit on that ID
	t.Cleanup(func() { _ = p.setLimit(taken, 0) })
	must(t, p.SetQuota(ctx, "third", 4*mib))
	if got := projOf(t, third); got == taken || got == 0 {
		t.Fatalf("third volume got project %d; %d was taken", got, taken)
	}

	// Remove frees the ID: no limit left for the inode number's next owner.
	must(t, p.Remove(ctx, "vol"))
	u, err := p.getQuota(proj)
	must(t, err)
	if u.hardBytes != 0 || u.softBytes != 0 {
		t.Fatalf("project %d after Remove: %+v, want no limits", proj, u)
	}
	must(t, p.Remove(ctx, "clone"))
	must(t, p.Remove(ctx, "third"))
}
