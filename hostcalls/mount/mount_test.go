package mount

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

func wantCode(t *testing.T, what string, err error, want abi.Code) {
	t.Helper()
	if got := abi.CodeOf(err); got != want {
		t.Fatalf("%s: code %v (err %v), want %v", what, got, err, want)
	}
}

// mounts counts the mountinfo entries at target: a leaked second mount on
// the same target shows up here.
func mounts(t *testing.T, target string) int {
	t.Helper()
	real, err := filepath.EvalSymlinks(target)
	if err != nil {
		t.Fatal(err)
	}
	all, err := mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return m.Mountpoint != real, false })
	if err != nil {
		t.Fatal(err)
	}
	return len(all)
}

// cleanupUnmount unmounts everything on target when the test ends.
func cleanupUnmount(t *testing.T, target string) {
	t.Cleanup(func() { mounttest.Unmount(t, target) })
}

// fixture makes a source directory with a file, a source file, and a fresh
// place for targets.
func fixture(t *testing.T) (srcDir, srcFile, targets string) {
	t.Helper()
	base := t.TempDir()
	srcDir = filepath.Join(base, "src")
	if err := os.Mkdir(srcDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(srcDir, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	srcFile = filepath.Join(base, "file")
	if err := os.WriteFile(srcFile, []byte("file"), 0o644); err != nil {
		t.Fatal(err)
	}
	return srcDir, srcFile, filepath.Join(base, "targets")
}

func TestBind(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	srcDir, srcFile, targets := fixture(t)
	for _, tc := range []struct {
		name     string
		src      string
		readOnly bool
		probe    string // a file to write through the target
	}{
		{"dir", srcDir, false, "new"},
		{"dir read-only", srcDir, true, "new"},
		{"file", srcFile, false, ""},
		{"file read-only", srcFile, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := filepath.Join(targets, tc.name, "deep", "target")
			cleanupUnmount(t, target)
			did, err := Bind(ctx, tc.src, target, tc.readOnly)
			if err != nil || !did {
				t.Fatalf("Bind = %v, %v", did, err)
			}
			e, err := Info(target)
			if err != nil {
				t.Fatal(err)
			}
			if e.ReadOnly != tc.readOnly {
				t.Fatalf("Info.ReadOnly = %v, want %v (%+v)", e.ReadOnly, tc.readOnly, e)
			}
			if want := rootInFS(t, tc.src); e.Root != want {
				t.Errorf("Info.Root = %q, want %q (the source inside its filesystem)", e.Root, want)
			}
			write := target
			if tc.probe != "" {
				write = filepath.Join(target, tc.probe)
			}
			err = os.WriteFile(write, []byte("x"), 0o644)
			if tc.readOnly && !errors.Is(err, unix.EROFS) {
				t.Fatalf("write through a read-only bind: %v, want EROFS", err)
			}
			if !tc.readOnly && err != nil {
				t.Fatalf("write through a read-write bind: %v", err)
			}

			// Idempotent: the same bind again adds no second mount.
			did, err = Bind(ctx, tc.src, target, tc.readOnly)
			if err != nil || did {
				t.Fatalf("second Bind = %v, %v; want false, nil", did, err)
			}
			if n := mounts(t, target); n != 1 {
				t.Fatalf("%d mounts at the target after two Binds, want 1", n)
			}
			// The other read-only state is a conflict, not a silent remount.
			_, err = Bind(ctx, tc.src, target, !tc.readOnly)
			wantCode(t, "Bind with the other read-only state", err, abi.AlreadyExists)

			did, err = Unmount(ctx, target)
			if err != nil || !did {
				t.Fatalf("Unmount = %v, %v", did, err)
			}
			if mp, err := IsMountPoint(target); err != nil || mp {
				t.Fatalf("IsMountPoint after Unmount = %v, %v", mp, err)
			}
		})
	}
	if b, err := os.ReadFile(srcFile); err != nil || string(b) != "x" {
		t.Fatalf("source file after the read-write file bind: %q, %v", b, err)
	}
}

// rootInFS is path as seen from the root of the filesystem that holds it:
// what mountinfo shows as the root of a bind mount of path.
func rootInFS(t *testing.T, path string) string {
	t.Helper()
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := mountinfo.GetMounts(mountinfo.ParentsFilter(real))
	if err != nil || len(ms) == 0 {
		t.Fatalf("mounts holding %s: %v", real, err)
	}
	var best *mountinfo.Info
	for _, m := range ms {
		if best == nil || len(m.Mountpoint) >= len(best.Mountpoint) {
			best = m
		}
	}
	rel, err := filepath.Rel(best.Mountpoint, real)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(best.Root, rel)
}

func TestBindConflictsAndErrors(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	srcDir, srcFile, targets := fixture(t)
	other := t.TempDir()

	target := filepath.Join(targets, "t")
	cleanupUnmount(t, target)
	if _, err := Bind(ctx, srcDir, target, false); err != nil {
		t.Fatal(err)
	}
	_, err := Bind(ctx, other, target, false)
	wantCode(t, "Bind of another source on a mounted target", err, abi.AlreadyExists)
	if n := mounts(t, target); n != 1 {
		t.Fatalf("%d mounts after a refused Bind, want 1", n)
	}

	link := filepath.Join(targets, "link")
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	fileTarget := filepath.Join(targets, "plainfile")
	if err := os.WriteFile(fileTarget, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		src, target string
		want        abi.Code
	}{
		{"relative source", "rel/src", filepath.Join(targets, "a"), abi.InvalidArgument},
		{"relative target", srcDir, "rel/target", abi.InvalidArgument},
		{"missing source", filepath.Join(other, "missing"), filepath.Join(targets, "b"), abi.NotFound},
		{"symlink as target", srcDir, link, abi.FailedPrecondition},
		{"directory onto a file", srcDir, fileTarget, abi.FailedPrecondition},
		{"file onto a directory", srcFile, other, abi.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Bind(ctx, tc.src, tc.target, false)
			wantCode(t, "Bind", err, tc.want)
		})
	}
	if mp, _ := IsMountPoint(other); mp {
		t.Fatal("Bind through a symlink target mounted on the symlink's target")
	}
}

func TestBindBlockDevice(t *testing.T) {
	ctx := context.Background()
	dev := mounttest.Loop(t, 8<<20)
	target := filepath.Join(t.TempDir(), "publish", "block")
	cleanupUnmount(t, target)
	if blk, err := IsBlockBindMount(target); err != nil || blk {
		t.Fatalf("IsBlockBindMount before = %v, %v", blk, err)
	}
	if did, err := Bind(ctx, dev, target, false); err != nil || !did {
		t.Fatalf("Bind(%s) = %v, %v", dev, did, err)
	}
	if blk, err := IsBlockBindMount(target); err != nil || !blk {
		t.Fatalf("IsBlockBindMount = %v, %v; want true", blk, err)
	}
	if did, err := Bind(ctx, dev, target, false); err != nil || did {
		t.Fatalf("second Bind = %v, %v", did, err)
	}
	dir := t.TempDir()
	dirTarget := filepath.Join(dir, "t")
	cleanupUnmount(t, dirTarget)
	if _, err := Bind(ctx, dir, dirTarget, false); err != nil {
		t.Fatal(err)
	}
	if blk, err := IsBlockBindMount(dirTarget); err != nil || blk {
		t.Fatalf("IsBlockBindMount of a directory bind = %v, %v", blk, err)
	}
	if _, err := Unmount(ctx, target); err != nil {
		t.Fatal(err)
	}
}

func TestUnmount(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	srcDir, _, targets := fixture(t)

	plain := t.TempDir()
	for _, tc := range []struct {
		name, target string
	}{
		{"missing target", filepath.Join(targets, "missing", "x")},
		{"not a mount point", plain},
	} {
		did, err := Unmount(ctx, tc.target)
		if err != nil || did {
			t.Fatalf("%s: Unmount = %v, %v; want false, nil", tc.name, did, err)
		}
	}
	_, err := Unmount(ctx, "relative")
	wantCode(t, "Unmount(relative)", err, abi.InvalidArgument)

	// Stacked mounts, as non-idempotent publishes leave them, all go.
	target := filepath.Join(targets, "stacked")
	cleanupUnmount(t, target)
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := unix.Mount(srcDir, target, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := mounts(t, target); n != 3 {
		t.Fatalf("%d stacked mounts, want 3", n)
	}
	did, err := Unmount(ctx, target)
	if err != nil || !did {
		t.Fatalf("Unmount of stacked mounts = %v, %v", did, err)
	}
	if n := mounts(t, target); n != 0 {
		t.Fatalf("%d mounts left after Unmount", n)
	}
	did, err = Unmount(ctx, target)
	if err != nil || did {
		t.Fatalf("second Unmount = %v, %v; want false, nil", did, err)
	}

	// Busy: never detached behind the caller's back; lazily only on request.
	busy := filepath.Join(targets, "busy")
	cleanupUnmount(t, busy)
	if _, err := Bind(ctx, srcDir, busy, false); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(busy, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = Unmount(ctx, busy)
	wantCode(t, "Unmount of a busy mount", err, abi.FailedPrecondition)
	if mp, _ := IsMountPoint(busy); !mp {
		t.Fatal("busy mount gone after a refused Unmount")
	}
	did, err = UnmountLazy(ctx, busy)
	if err != nil || !did {
		t.Fatalf("UnmountLazy = %v, %v", did, err)
	}
	if mp, _ := IsMountPoint(busy); mp {
		t.Fatal("still a mount point after UnmountLazy")
	}
}

func TestMountTmpfs(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	target := filepath.Join(t.TempDir(), "a", "mnt")
	cleanupUnmount(t, target)
	opts := []string{"nosuid", "nodev", "noexec", "noatime", "size=2m", "mode=0710", "defaults"}
	did, err := Mount(ctx, "wasmcsi-test", target, "tmpfs", opts)
	if err != nil || !did {
		t.Fatalf("Mount = %v, %v", did, err)
	}
	e, err := Info(target)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"nosuid", "nodev", "noexec", "noatime", "rw"} {
		if !slices.Contains(e.Options, o) {
			t.Errorf("mount options %v lack %s", e.Options, o)
		}
	}
	if e.FSType != "tmpfs" || e.Source != "wasmcsi-test" || e.Root != "/" || e.ReadOnly ||
		!slices.Contains(e.SuperOptions, "size=2048k") || !slices.Contains(e.SuperOptions, "mode=710") {
		t.Fatalf("Info = %+v", e)
	}

	did, err = Mount(ctx, "wasmcsi-test", target, "tmpfs", opts)
	if err != nil || did {
		t.Fatalf("second Mount = %v, %v; want false, nil", did, err)
	}
	if n := mounts(t, target); n != 1 {
		t.Fatalf("%d mounts after two Mounts, want 1", n)
	}
	for _, tc := range []struct {
		name           string
		source, fstype string
		opts           []string
	}{
		{"another source", "other", "tmpfs", nil},
		{"another type", "wasmcsi-test", "ramfs", nil},
		{"read-only", "wasmcsi-test", "tmpfs", []string{"ro"}},
	} {
		_, err := Mount(ctx, tc.source, target, tc.fstype, tc.opts)
		wantCode(t, "Mount of "+tc.name, err, abi.AlreadyExists)
	}

	// A bind of a subtree is not the filesystem itself.
	sub := filepath.Join(target, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	bound := filepath.Join(t.TempDir(), "bound")
	cleanupUnmount(t, bound)
	if _, err := Bind(ctx, sub, bound, false); err != nil {
		t.Fatal(err)
	}
	_, err = Mount(ctx, "wasmcsi-test", bound, "tmpfs", nil)
	wantCode(t, "Mount over a bind of a subtree", err, abi.AlreadyExists)
}

func TestMountErrors(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, device, target, fstype string
		opts                         []string
		want                         abi.Code
	}{
		{"empty device", "", filepath.Join(dir, "a"), "tmpfs", nil, abi.InvalidArgument},
		{"relative target", "tmpfs", "rel", "tmpfs", nil, abi.InvalidArgument},
		{"bad fstype", "tmpfs", filepath.Join(dir, "b"), "tmp fs", nil, abi.InvalidArgument},
		{"unknown fstype", "tmpfs", filepath.Join(dir, "c"), "nosuchfs", nil, abi.InvalidArgument},
		{"bad option", "tmpfs", filepath.Join(dir, "d"), "tmpfs", []string{"a,b"}, abi.InvalidArgument},
		{"option the filesystem rejects", "tmpfs", filepath.Join(dir, "e"), "tmpfs", []string{"nosuchoption"}, abi.InvalidArgument},
		{"missing device", filepath.Join(dir, "nodev"), filepath.Join(dir, "f"), "ext4", nil, abi.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			did, err := Mount(ctx, tc.device, tc.target, tc.fstype, tc.opts)
			if did {
				mounttest.Unmount(t, tc.target)
			}
			wantCode(t, "Mount", err, tc.want)
		})
	}
}

// TestMountXFS mounts a real xfs from a loop device with a
// filesystem-specific option and checks idempotency by device number.
func TestMountXFS(t *testing.T) {
	ctx := context.Background()
	dev := mounttest.Loop(t, 320<<20)
	mounttest.Mkfs(t, "xfs", dev, "-q")
	target := filepath.Join(t.TempDir(), "stage")
	cleanupUnmount(t, target)
	opts := []string{"nouuid", "noatime", "ro"}
	if did, err := Mount(ctx, dev, target, "xfs", opts); err != nil || !did {
		t.Fatalf("Mount = %v, %v", did, err)
	}
	e, err := Info(target)
	if err != nil {
		t.Fatal(err)
	}
	if !e.ReadOnly || !slices.Contains(e.Options, "noatime") || !slices.Contains(e.SuperOptions, "nouuid") || e.FSType != "xfs" {
		t.Fatalf("Info = %+v", e)
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	if e.Major != int(unix.Major(st.Rdev)) || e.Minor != int(unix.Minor(st.Rdev)) {
		t.Fatalf("Info device %d:%d, want %s's %d:%d", e.Major, e.Minor, dev, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	// The same device through another name (a udev-style symlink) is the
	// same mount.
	alias := filepath.Join(t.TempDir(), "by-id")
	if err := os.Symlink(dev, alias); err != nil {
		t.Fatal(err)
	}
	if did, err := Mount(ctx, alias, target, "xfs", opts); err != nil || did {
		t.Fatalf("Mount through an alias = %v, %v; want false, nil", did, err)
	}
	if n := mounts(t, target); n != 1 {
		t.Fatalf("%d mounts, want 1", n)
	}
	if did, err := Unmount(ctx, target); err != nil || !did {
		t.Fatalf("Unmount = %v, %v", did, err)
	}
}

// TestUnmountTopThroughLink: UnmountTop of a path whose last component is
// a link to a mount point unmounts the top mount there, the one Info sees
// through the link, and only that one.
func TestUnmountTopThroughLink(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	dir := filepath.Join(base, "dir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cleanupUnmount(t, dir)
	for _, src := range []string{"wasmcsi-under", "wasmcsi-over"} {
		if err := unix.Mount(src, dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	did, err := UnmountTop(ctx, link)
	if err != nil || !did {
		t.Fatalf("UnmountTop through a link: %v, %v, want true, nil", did, err)
	}
	if n := mounts(t, dir); n != 1 {
		t.Fatalf("after UnmountTop through a link: %d mounts at %s, want 1", n, dir)
	}
	if e, err := Info(link); err != nil || e.Source != "wasmcsi-under" {
		t.Errorf("after UnmountTop through a link: top mount %+v, %v, want the one under", e, err)
	}
	if did, err := UnmountTop(ctx, link); err != nil || !did {
		t.Errorf("second UnmountTop through a link: %v, %v, want true, nil", did, err)
	}
	if did, err := UnmountTop(ctx, link); err != nil || did {
		t.Errorf("UnmountTop through a link to no mount point: %v, %v, want false, nil", did, err)
	}
	if did, err := UnmountTop(ctx, filepath.Join(base, "gone")); err != nil || did {
		t.Errorf("UnmountTop of a missing path: %v, %v, want false, nil", did, err)
	}
}
