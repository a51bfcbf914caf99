// Package mounttest gives tests a real, throw-away filesystem: a sparse file
// on a loop device (hostcalls/loop/looptest), formatted by the
// distribution's mkfs and mounted by mount(2), or a tmpfs.
//
// Everything it sets up is torn down by t.Cleanup, also when the test fails.
// It is for tests only and must never be imported by the daemon: it skips
// tests instead of returning errors.
package mounttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// RequireRoot skips t unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, loop devices and quotas are privileged")
	}
}

// Loop attaches a sparse file of size bytes to a loop device (see
// looptest.Device) and returns the device path; it is detached at cleanup.
func Loop(t testing.TB, size int64) string {
	t.Helper()
	dev, _ := looptest.Device(t, size)
	return dev
}

// Mkfs formats dev with mkfs.<fstype> and the given arguments. The test is
// skipped when the tool is not installed.
func Mkfs(t testing.TB, fstype, dev string, args ...string) {
	t.Helper()
	tool := "mkfs." + fstype
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("needs %s: %v", tool, err)
	}
	argv := append(append([]string{}, args...), dev)
	out, err := exec.Command(tool, argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", tool, argv, err, out)
	}
}

// Mount mounts dev (formatted as fstype) on a new directory in t.TempDir()
// with the filesystem-specific options in data, and unmounts it at cleanup.
// It returns the mount error instead of failing, so that a test can tell a
// kernel without a feature (EINVAL, ENOTSUP...) from a broken setup.
func Mount(t testing.TB, dev, fstype, data string) (string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
	if err := unix.Mount(dev, dir, fstype, 0, data); err != nil {
		return "", fmt.Errorf("mount %s on %s (%s, %q): %w", dev, dir, fstype, data, err)
	}
	t.Cleanup(func() { Unmount(t, dir) })
	return dir, nil
}

// FS is Loop, Mkfs and Mount in one: a fresh fstype filesystem of size bytes
// mounted with data. The mount error is returned as by Mount.
func FS(t testing.TB, fstype string, size int64, mkfsArgs []string, data string) (string, error) {
	t.Helper()
	dev := Loop(t, size)
	Mkfs(t, fstype, dev, mkfsArgs...)
	return Mount(t, dev, fstype, data)
}

// Tmpfs mounts a tmpfs with the given options in a new directory and
// unmounts it at cleanup.
func Tmpfs(t testing.TB, data string) string {
	t.Helper()
	RequireRoot(t)
	dir, err := Mount(t, "tmpfs", "tmpfs", data)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Unmount removes every mount stacked on dir, retrying while the mount is
// busy for a short while; it reports failures to t. Not mounted is fine.
func Unmount(t testing.TB, dir string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // there may be another mount below
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return
		case errors.Is(err, unix.EBUSY):
			time.Sleep(20 * time.Millisecond)
		default:
			t.Errorf("cleanup: unmount %s: %v", dir, err)
			return
		}
	}
	t.Errorf("cleanup: unmount %s: still busy or mounted", dir)
}
