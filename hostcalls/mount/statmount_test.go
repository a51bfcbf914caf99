package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// infoPath is one of the two ways Info answers.
type infoPath struct {
	name string
	info func(string) (Entry, error)
}

// infoPaths are the ways Info answers on this kernel; a test runs each
// case through all, so the mountinfo fallback stays tested on kernels
// that never use it.
func infoPaths(tb testing.TB) []infoPath {
	tb.Helper()
	paths := []infoPath{{"mountinfo", infoMountinfo}}
	if err := statmountErr(); err != nil {
		tb.Logf("only the mountinfo path: %v", err)
		return paths
	}
	return append(paths, infoPath{"statmount", infoStatmount})
}

// TestStatmountHeaderLayout pins statmountHeader to the offsets of struct
// statmount in uapi linux/mount.h; TestInfoMatchesMountinfo proves them
// against the running kernel.
func TestStatmountHeaderLayout(t *testing.T) {
	var h statmountHeader
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"size", unsafe.Offsetof(h.size), 0},
		{"mnt_opts", unsafe.Offsetof(h.mntOpts), 4},
		{"mask", unsafe.Offsetof(h.mask), 8},
		{"sb_dev_major", unsafe.Offsetof(h.sbDevMajor), 16},
		{"sb_dev_minor", unsafe.Offsetof(h.sbDevMinor), 20},
		{"sb_flags", unsafe.Offsetof(h.sbFlags), 32},
		{"fs_type", unsafe.Offsetof(h.fsType), 36},
		{"mnt_id", unsafe.Offsetof(h.mntID), 40},
		{"mnt_attr", unsafe.Offsetof(h.mntAttr), 64},
		{"mnt_root", unsafe.Offsetof(h.mntRoot), 104},
		{"mnt_point", unsafe.Offsetof(h.mntPoint), 108},
		{"fs_subtype", unsafe.Offsetof(h.fsSubtype), 120},
		{"sb_source", unsafe.Offsetof(h.sbSource), 124},
		{"supported_mask", unsafe.Offsetof(h.supported), 144},
		{"sizeof", unsafe.Sizeof(h), 512},
	} {
		if f.got != f.want {
			t.Errorf("statmount %s at %d, want %d", f.name, f.got, f.want)
		}
	}
	if n := unsafe.Sizeof(mntIDReq{}); n != 24 {
		t.Errorf("sizeof mnt_id_req = %d, want 24 (MNT_ID_REQ_SIZE_VER0)", n)
	}
}

// TestInfoMatchesMountinfo compares, for every mount in the table that is
// reachable and on top at its mount point, Info by statmount with Info by
// mountinfo, field by field. Mounts made first add the cases the table may
// lack: escaped paths and sources, a filesystem without a source, every
// per-mount flag, superblock flags and filesystem options.
func TestInfoMatchesMountinfo(t *testing.T) {
	mounttest.RequireRoot(t)
	if err := statmountErr(); err != nil {
		t.Skipf("needs statx and statmount of Linux 6.15: %v", err)
	}
	base := t.TempDir()
	dir := func(name string) string {
		d := filepath.Join(base, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mounttest.Unmount(t, d) })
		return d
	}
	made := map[string]bool{} // mount points made here, till compared
	mnt := func(src, target, fstype string, flags uintptr, data string) {
		t.Helper()
		if err := unix.Mount(src, target, fstype, flags, data); err != nil {
			t.Fatalf("mount %s on %s (%s, %#x, %q): %v", src, target, fstype, flags, data, err)
		}
		made[target] = true
	}
	mnt("source with space\\and#more", dir("a b\tc\\d#e"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_NOATIME, "size=1m,mode=0710")
	mnt("tmpfs", dir("strict"), "tmpfs", unix.MS_STRICTATIME|unix.MS_NODIRATIME|unix.MS_NOSYMFOLLOW, "")
	mnt("tmpfs", dir("ro"), "tmpfs", unix.MS_RDONLY, "nr_inodes=100")
	sub := filepath.Join(base, "strict", "sub dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	mnt(sub, dir("bind of sub"), "", unix.MS_BIND, "")
	mnt("", dir("bind of sub"), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
	made[fsMountNoSource(t, dir("nosource"))] = true
	if fuse, ok := fuseWithoutServer(t, dir("fuse")); ok {
		made[fuse] = true
	}
	if idmapped, ok := idmappedBind(t, filepath.Join(base, "strict"), dir("idmapped")); ok {
		made[idmapped] = true
	}

	dev := mounttest.Loop(t, 64<<20)
	mounttest.Mkfs(t, "ext4", dev, "-q")
	mnt(dev, dir("ext4"), "ext4", unix.MS_SYNCHRONOUS|unix.MS_DIRSYNC|unix.MS_LAZYTIME, "commit=7,errors=remount-ro")

	all, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for i, m := range all {
		// The mountinfo path takes the last mount listed at a mount point;
		// statx names the one on top. Compare where both mean the same one.
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, m.Mountpoint, statxFlags, unix.STATX_MNT_ID, &stx); err != nil {
			t.Logf("skip %s: %v", m.Mountpoint, err)
			continue
		}
		if stx.Mnt_id != uint64(m.ID) || slices.ContainsFunc(all[i+1:], func(o *mountinfo.Info) bool { return o.Mountpoint == m.Mountpoint }) {
			t.Logf("skip %s (mount %d): not on top there, or not last in the table", m.Mountpoint, m.ID)
			continue
		}
		// entryOf(m) is infoMountinfo without resolving symlinks, which
		// would ask the FUSE filesystem and wait for its absent server.
		want := entryOf(m)
		got, err := infoStatmount(m.Mountpoint)
		if err != nil {
			t.Errorf("statmount of %s: %v", m.Mountpoint, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\nstatmount %+v\nmountinfo %+v", m.Mountpoint, got, want)
		}
		compared++
		delete(made, m.Mountpoint)
	}
	t.Logf("compared %d of %d mounts", compared, len(all))
	for m := range made {
		t.Errorf("%s, mounted here, was not compared", m)
	}
}

// fsMountNoSource mounts a tmpfs on target by the new mount API without
// naming a source, which mountinfo shows as "none". It returns target.
func fsMountNoSource(t *testing.T, target string) string {
	t.Helper()
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		t.Fatalf("fsopen tmpfs: %v", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		t.Fatalf("fsconfig create: %v", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("fsmount: %v", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatalf("move_mount on %s: %v", target, err)
	}
	return target
}

// fuseWithoutServer mounts a FUSE filesystem with a subtype on target,
// which mountinfo shows as type "fuse.wasmcsi-test". No server answers it:
// only what does not ask the filesystem (statx with AT_STATX_DONT_SYNC,
// statmount, unmount) may touch it. Closing the device at cleanup, before
// the unmount, fails anything that asked meanwhile instead of leaving it
// waiting. It returns target and whether it mounted: not without
// /dev/fuse.
func fuseWithoutServer(t *testing.T, target string) (string, bool) {
	t.Helper()
	dev, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Logf("no FUSE mount with a subtype: %v", err)
		return target, false
	}
	t.Cleanup(func() { dev.Close() })
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", dev.Fd())
	if err := unix.Mount("wasmcsi", target, "fuse.wasmcsi-test", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		t.Fatalf("mount fuse on %s: %v", target, err)
	}
	return target, true
}

// idmappedBind bind-mounts src on target with its IDs shifted by a user
// namespace, which mountinfo shows as the option "idmapped". It returns
// target and whether it mounted: not without sleep(1) or user namespaces.
func idmappedBind(t *testing.T, src, target string) (string, bool) {
	t.Helper()
	// A process in a new user namespace holds the ID mapping.
	holder := exec.Command("sleep", "60")
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: ids, GidMappings: ids}
	if err := holder.Start(); err != nil {
		t.Logf("no idmapped mount: a process in a user namespace: %v", err)
		return target, false
	}
	defer func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	}()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", holder.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatalf("open_tree %s: %v", src, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		t.Fatalf("mount_setattr idmap: %v", err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatalf("move_mount on %s: %v", target, err)
	}
	return target, true
}

// TestInfoCases checks what Info says about the mounts a CSI node makes,
// by both paths.
func TestInfoCases(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	srcDir, srcFile, targets := fixture(t)

	tmpfs := filepath.Join(targets, "tmpfs")
	cleanupUnmount(t, tmpfs)
	if _, err := Mount(ctx, "wasmcsi-tmpfs", tmpfs, "tmpfs", []string{"nosuid", "nodev", "size=1m"}); err != nil {
		t.Fatal(err)
	}
	roBind := filepath.Join(targets, "ro-bind")
	cleanupUnmount(t, roBind)
	if _, err := Bind(ctx, srcDir, roBind, true); err != nil {
		t.Fatal(err)
	}
	fileBind := filepath.Join(targets, "file-bind")
	cleanupUnmount(t, fileBind)
	if _, err := Bind(ctx, srcFile, fileBind, false); err != nil {
		t.Fatal(err)
	}
	dev := mounttest.Loop(t, 64<<20)
	mounttest.Mkfs(t, "ext4", dev, "-q")
	ext4 := filepath.Join(targets, "ext4")
	cleanupUnmount(t, ext4)
	if _, err := Mount(ctx, dev, ext4, "ext4", []string{"noatime", "errors=remount-ro"}); err != nil {
		t.Fatal(err)
	}
	var devSt unix.Stat_t
	if err := unix.Stat(dev, &devSt); err != nil {
		t.Fatal(err)
	}
	stacked := filepath.Join(targets, "stacked")
	if err := os.Mkdir(stacked, 0o755); err != nil {
		t.Fatal(err)
	}
	cleanupUnmount(t, stacked)
	for _, src := range []string{"below", "middle", "top"} {
		if err := unix.Mount(src, stacked, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(targets, "link-to-tmpfs")
	if err := os.Symlink(tmpfs, link); err != nil {
		t.Fatal(err)
	}

	for _, p := range infoPaths(t) {
		t.Run(p.name, func(t *testing.T) {
			for _, tc := range []struct {
				name, target string
				check        func(t *testing.T, e Entry)
			}{
				{"tmpfs", tmpfs, func(t *testing.T, e Entry) {
					if e.Target != tmpfs || e.Source != "wasmcsi-tmpfs" || e.FSType != "tmpfs" || e.Root != "/" || e.ReadOnly ||
						!slices.Equal(e.Options[:3], []string{"rw", "nosuid", "nodev"}) ||
						e.SuperOptions[0] != "rw" || !slices.Contains(e.SuperOptions, "size=1024k") {
						t.Errorf("Info = %+v", e)
					}
				}},
				{"read-only bind of a directory", roBind, func(t *testing.T, e Entry) {
					if e.Target != roBind || !e.ReadOnly || e.Options[0] != "ro" || e.SuperOptions[0] != "rw" || e.Root != rootInFS(t, srcDir) {
						t.Errorf("Info = %+v, want a read-only bind of %s", e, rootInFS(t, srcDir))
					}
				}},
				{"bind of a file", fileBind, func(t *testing.T, e Entry) {
					if e.Target != fileBind || e.ReadOnly || e.Root != rootInFS(t, srcFile) {
						t.Errorf("Info = %+v, want a bind of %s", e, rootInFS(t, srcFile))
					}
				}},
				{"ext4 on a loop device", ext4, func(t *testing.T, e Entry) {
					if e.Target != ext4 || e.Source != dev || e.FSType != "ext4" || e.Root != "/" ||
						e.Major != int(unix.Major(devSt.Rdev)) || e.Minor != int(unix.Minor(devSt.Rdev)) ||
						!slices.Contains(e.Options, "noatime") || !slices.Contains(e.SuperOptions, "errors=remount-ro") {
						t.Errorf("Info = %+v, want ext4 of %s (%d:%d)", e, dev, unix.Major(devSt.Rdev), unix.Minor(devSt.Rdev))
					}
				}},
				{"stacked mounts", stacked, func(t *testing.T, e Entry) {
					if e.Target != stacked || e.Source != "top" {
						t.Errorf("Info = %+v, want the top mount", e)
					}
				}},
				{"symlink to a mount point", link, func(t *testing.T, e Entry) {
					if e.Target != tmpfs || e.Source != "wasmcsi-tmpfs" {
						t.Errorf("Info = %+v, want the mount at %s", e, tmpfs)
					}
				}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					e, err := p.info(tc.target)
					if err != nil {
						t.Fatal(err)
					}
					tc.check(t, e)
				})
			}

			for _, tc := range []struct{ name, target string }{
				{"directory inside a mount", srcDir},
				{"file inside a mount", srcFile},
				{"missing", filepath.Join(targets, "missing")},
				{"below a missing directory", filepath.Join(targets, "missing", "x")},
			} {
				t.Run(tc.name, func(t *testing.T) {
					e, err := p.info(tc.target)
					if abi.CodeOf(err) != abi.NotFound {
						t.Fatalf("Info = %+v, %v; want NotFound", e, err)
					}
				})
			}
		})
	}
}

// TestInfoUnmounted checks that Info follows a mount going away: what is
// below shows again, and a bare directory is NotFound.
func TestInfoUnmounted(t *testing.T) {
	mounttest.RequireRoot(t)
	target := filepath.Join(t.TempDir(), "t")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	cleanupUnmount(t, target)
	for _, src := range []string{"first", "second"} {
		if err := unix.Mount(src, target, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	paths := infoPaths(t)
	// Each step unmounts the top mount, then expects what is left.
	for _, want := range []string{"second", "first", ""} {
		for _, p := range paths {
			e, err := p.info(target)
			switch {
			case want == "" && abi.CodeOf(err) != abi.NotFound:
				t.Fatalf("%s: Info after unmounting all = %+v, %v; want NotFound", p.name, e, err)
			case want != "" && (err != nil || e.Source != want):
				t.Fatalf("%s: Info = %+v, %v; want the %s mount", p.name, e, err, want)
			}
		}
		if want != "" {
			if err := unix.Unmount(target, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestStatmountOverflow gives statmount a buffer too small for its
// answer: the lookup grows it and retries.
func TestStatmountOverflow(t *testing.T) {
	mounttest.RequireRoot(t)
	if err := statmountErr(); err != nil {
		t.Skipf("needs statx and statmount of Linux 6.15: %v", err)
	}
	target := mounttest.Tmpfs(t, "size=1m")
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, target, 0, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		t.Fatal(err)
	}
	buf := make([]uint64, statmountHeaderSize/8) // room for no strings
	e, err := statmountEntry(stx.Mnt_id, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if e.Target != target || e.FSType != "tmpfs" || len(buf)*8 <= statmountHeaderSize {
		t.Fatalf("Info = %+v with a %d-byte buffer, want the tmpfs at %s", e, len(buf)*8, target)
	}
	if _, err := statmountEntry(^uint64(0), &buf); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("statmount of a mount that does not exist: %v, want ENOENT", err)
	}
}
