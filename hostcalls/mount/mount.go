// Package mount mounts and unmounts filesystems and bind mounts by direct
// system calls (mount(2), umount2(2)), and answers what is mounted where
// by asking the kernel about one path (openat2, statx, statmount); it reads
// the whole /proc/self/mountinfo (github.com/moby/sys/mountinfo) only where
// the kernel cannot answer so. It is what every backend's node steps (stage,
// publish, unpublish, unstage) use.
//
// Every operation is idempotent in the CSI sense, because the CO repeats
// calls after timeouts and kubelet restarts: mounting what is already
// mounted there does nothing and says so, a target mounted from anything
// else is AlreadyExists, and unmounting what is not mounted succeeds.
// Callers serialize calls on one target (the host locks per volume).
//
// It must never run the mount or umount programs, follow a symlink in place
// of a target, or detach lazily unless asked to.
package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Bind bind-mounts src on target, read-only when readOnly. The target is
// created when missing, as a directory when src is one and as an empty file
// otherwise (a block device's publish path); its parents are created too.
// It reports whether it mounted: false when the same src is already bound
// there with the same read-only state. A target mounted from another source,
// or with the other read-only state, is AlreadyExists. The bind is not
// recursive: mounts below src are not carried along.
func Bind(ctx context.Context, src, target string, readOnly bool) (bool, error) {
	if err := checkPath("source", src); err != nil {
		return false, err
	}
	s, err := os.OpenFile(src, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fail("bind", src, err)
	}
	defer s.Close()
	return BindFrom(ctx, s, target, readOnly)
}

// BindFrom is Bind of a source already open (an O_PATH descriptor, such
// as OpenBeneath returns): the inode mounted is that one, whatever
// happened to its path since it was checked. s.Name() names it in errors.
func BindFrom(ctx context.Context, s *os.File, target string, readOnly bool) (bool, error) {
	return bindFrom(ctx, s, target, readOnly, func(dir bool) (*os.File, error) { return openTarget(target, dir) })
}

// BindBeneath is Bind of a source and on a target that must both lie
// inside roots, with no symlink on their way below the root (pass them
// resolved): the source is opened beneath its root (OpenBeneath) and the
// target created and opened beneath its own (openTargetBeneath), so
// neither can be swapped for a link out of the roots between a check of
// the paths and the mount.
func BindBeneath(ctx context.Context, roots []string, src, target string, readOnly bool) (bool, error) {
	s, err := OpenBeneath(roots, src)
	if err != nil {
		return false, err
	}
	defer s.Close()
	return bindFrom(ctx, s, target, readOnly, func(dir bool) (*os.File, error) { return openTargetBeneath(roots, target, dir) })
}

func bindFrom(ctx context.Context, s *os.File, target string, readOnly bool, open func(dir bool) (*os.File, error)) (bool, error) {
	src := s.Name()
	if err := checkPath("target", target); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, fail("bind", target, err)
	}
	var sst unix.Stat_t
	if err := unix.Fstat(int(s.Fd()), &sst); err != nil {
		return false, fail("bind", src, err)
	}
	isDir := sst.Mode&unix.S_IFMT == unix.S_IFDIR
	t, err := open(isDir)
	if err != nil {
		return false, err
	}
	defer t.Close()

	mounted, err := IsMountPoint(target)
	if err != nil {
		return false, fail("bind", target, err)
	}
	if mounted {
		return false, sameBind(target, &sst, readOnly)
	}
	// Mount through the descriptors: the inodes checked above are the ones
	// mounted, whatever a concurrent rename or symlink swap does to the paths.
	if err := unix.Mount(fdPath(s), fdPath(t), "", unix.MS_BIND, ""); err != nil {
		return false, fail("bind "+src+" on", target, err)
	}
	if readOnly {
		// The remount goes by a descriptor too: opened again the same way,
		// the target now leads into the new mount, which must show the
		// source; its /proc link names exactly that mount.
		if err := remountOpened(open, isDir, &sst); err != nil {
			_ = unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
			return false, fail("bind "+src+" read-only on", target, err)
		}
	}
	return true, nil
}

// OpenBeneath opens path (O_PATH), which must lie inside one of roots, by
// resolving it from a descriptor of that root with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS): a symlink in it that
// leads out of the root (an absolute one, or ".." past it) fails, also
// one swapped in after any earlier check of the path. Roots are the
// operator's and trusted, so each is tried as written and with its own
// symlinks resolved. Outside every root, or out of it through a link, is
// PermissionDenied.
func OpenBeneath(roots []string, path string) (*os.File, error) {
	dir, rel, err := openRoot(roots, path)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	f, err := openat2(dir, rel, unix.O_PATH)
	if err != nil {
		return nil, fail("open", path, err)
	}
	return os.NewFile(uintptr(f), filepath.Clean(path)), nil
}

// openRoot opens the deepest of roots that holds path, each root tried as
// written and with its own symlinks resolved, and returns path relative
// to it.
func openRoot(roots []string, path string) (*os.File, string, error) {
	if err := checkPath("path", path); err != nil {
		return nil, "", err
	}
	clean := filepath.Clean(path)
	var root string
	for _, r := range roots {
		if !filepath.IsAbs(r) {
			continue // a name prefix or a portal, not a folder
		}
		for _, c := range []string{filepath.Clean(r), resolvedOrEmpty(r)} {
			if rel, err := filepath.Rel(c, clean); c != "" && err == nil && filepath.IsLocal(rel) && len(c) > len(root) {
				root = c
			}
		}
	}
	if root == "" {
		return nil, "", abi.Errorf(abi.PermissionDenied, "mount: path %q is outside the granted roots", path)
	}
	rel, _ := filepath.Rel(root, clean)
	dir, err := os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fail("open root", root, err)
	}
	return dir, rel, nil
}

// openat2 opens rel beneath dir, through no symlink and out of no
// mount's reach: a link in the way is PermissionDenied. Where openat2 is
// missing (a kernel before 5.6) or filtered (seccomp: ENOSYS or EPERM),
// rel is walked one component at a time instead (openWalk), with the
// same guarantee.
func openat2(dir *os.File, rel string, flags int) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := -1, error(unix.ENOSYS)
	for range 8 {
		if openat2Filtered {
			break
		}
		fd, err = unix.Openat2(int(dir.Fd()), rel, &how)
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		return openWalk(dir, rel, flags)
	}
	if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
		return -1, linkInTheWay(rel)
	}
	return fd, err
}

// openat2Filtered makes openat2 answer ENOSYS, as a kernel before 5.6 or
// a seccomp filter does; tests set it to run the walk.
var openat2Filtered bool

// openWalk opens rel beneath dir without openat2: each component in turn
// with openat(O_PATH|O_NOFOLLOW|O_DIRECTORY) from the descriptor of the
// one before, the last with flags|O_NOFOLLOW. ".." is refused and every
// descriptor is checked not to be a symlink (O_PATH|O_NOFOLLOW opens the
// link itself), so the walk neither leaves dir nor follows a link, also
// one swapped in while it walks: PermissionDenied, as with openat2.
func openWalk(dir *os.File, rel string, flags int) (int, error) {
	if filepath.IsAbs(rel) {
		return -1, linkInTheWay(rel)
	}
	var parts []string
	for _, p := range strings.Split(rel, "/") {
		switch p {
		case "", ".":
		case "..":
			return -1, abi.Errorf(abi.PermissionDenied, "%q leaves its root", rel)
		default:
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return unix.Openat(int(dir.Fd()), ".", flags|unix.O_CLOEXEC, 0)
	}
	cur := int(dir.Fd())
	for i, p := range parts {
		last := i == len(parts)-1
		f := unix.O_PATH | unix.O_NOFOLLOW | unix.O_DIRECTORY | unix.O_CLOEXEC
		if last {
			f = flags | unix.O_NOFOLLOW | unix.O_CLOEXEC
		}
		fd, err := unix.Openat(cur, p, f, 0)
		if err != nil {
			var st unix.Stat_t
			if errors.Is(err, unix.ELOOP) || (errors.Is(err, unix.ENOTDIR) && unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK) {
				err = linkInTheWay(rel)
			}
			if cur != int(dir.Fd()) {
				unix.Close(cur)
			}
			return -1, err
		}
		if cur != int(dir.Fd()) {
			unix.Close(cur)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
			unix.Close(fd)
			if err == nil {
				err = linkInTheWay(rel)
			}
			return -1, err
		}
		cur = fd
	}
	return cur, nil
}

func linkInTheWay(rel string) error {
	return abi.Errorf(abi.PermissionDenied, "%q goes through a symlink", rel)
}

// openTargetBeneath is openTarget for a target inside roots: every folder
// on its way is created and opened beneath the root, through no symlink,
// so a link swapped in on the way can neither place the mount nor a new
// folder outside the roots.
func openTargetBeneath(roots []string, target string, dir bool) (*os.File, error) {
	root, rel, err := openRoot(roots, target)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	parts := strings.Split(rel, string(filepath.Separator))
	cur := root
	for _, p := range parts[:len(parts)-1] {
		if err := unix.Mkdirat(int(cur.Fd()), p, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fail("create parent of", target, err)
		}
		fd, err := openat2(cur, p, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return nil, fail("open parent of", target, err)
		}
		if cur != root {
			cur.Close()
		}
		cur = os.NewFile(uintptr(fd), p)
	}
	if cur != root {
		defer cur.Close()
	}
	last := parts[len(parts)-1]
	if dir {
		if err := unix.Mkdirat(int(cur.Fd()), last, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fail("create", target, err)
		}
	} else {
		fd, err := unix.Openat(int(cur.Fd()), last, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
		switch {
		case err == nil:
			unix.Close(fd)
		case errors.Is(err, unix.EEXIST):
		default:
			return nil, fail("create", target, err)
		}
	}
	fd, err := openat2(cur, last, unix.O_PATH)
	if err != nil {
		return nil, fail("open", target, err)
	}
	t := os.NewFile(uintptr(fd), target)
	if err := checkTargetKind(t, target, dir); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func resolvedOrEmpty(p string) string {
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	return r
}

// remountOpened opens the target of a new bind again with open and
// remounts it read-only by that descriptor, once it shows the source inode
// sst.
func remountOpened(open func(dir bool) (*os.File, error), dir bool, sst *unix.Stat_t) error {
	m, err := open(dir)
	if err != nil {
		return err
	}
	defer m.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(m.Fd()), &st); err != nil {
		return err
	}
	if st.Dev != sst.Dev || st.Ino != sst.Ino {
		return abi.Errorf(abi.Aborted, "mount: the target changed under the new bind")
	}
	return remountReadOnly(fdPath(m))
}

// remountReadOnly makes the bind mount at target read-only. A bind remount
// sets all per-mount flags at once, so the ones the new mount already has
// (nosuid, nodev, noexec, atime flags; locked in user namespaces) are kept.
func remountReadOnly(target string) error {
	var sfs unix.Statfs_t
	if err := unix.Statfs(target, &sfs); err != nil {
		return err
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY)
	for st, ms := range map[int64]uintptr{
		unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV, unix.ST_NOEXEC: unix.MS_NOEXEC,
		unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME, unix.ST_RELATIME: unix.MS_RELATIME,
	} {
		if sfs.Flags&st != 0 {
			flags |= ms
		}
	}
	return unix.Mount("", target, "", flags, "")
}

// sameBind decides an existing mount at target: nil when it shows the
// source inode sst with the wanted read-only state, AlreadyExists otherwise.
func sameBind(target string, sst *unix.Stat_t, readOnly bool) error {
	var tst unix.Stat_t
	if err := unix.Stat(target, &tst); err != nil {
		return fail("bind", target, err)
	}
	if tst.Dev != sst.Dev || tst.Ino != sst.Ino {
		return abi.Errorf(abi.AlreadyExists, "mount: bind on %q: already mounted from another source", target)
	}
	e, err := Info(target)
	if err != nil {
		return err
	}
	if e.ReadOnly != readOnly {
		return abi.Errorf(abi.AlreadyExists, "mount: bind on %q: already mounted %s", target, rwName(e.ReadOnly))
	}
	return nil
}

// Mount mounts the filesystem fstype from device on target, a directory
// created when missing. options are mount(8)-style: the generic ones (ro,
// nosuid, nodev, noexec, noatime, sync, ...) become mount flags, fstab-only
// ones (defaults, nofail, _netdev, ...) are dropped, and the rest (nouuid,
// discard, size=1g, ...) go to the filesystem as its data string. It reports
// whether it mounted: false when the same device and fstype are already
// mounted there with the same read-only state; anything else mounted there
// is AlreadyExists.
func Mount(ctx context.Context, device, target, fstype string, options []string) (bool, error) {
	if device == "" || strings.IndexByte(device, 0) >= 0 {
		return false, abi.Errorf(abi.InvalidArgument, "mount: invalid device %q", device)
	}
	if err := checkPath("target", target); err != nil {
		return false, err
	}
	if !validFSType(fstype) {
		return false, abi.Errorf(abi.InvalidArgument, "mount: invalid filesystem type %q", fstype)
	}
	flags, data, err := parseOptions(options)
	if err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, fail("mount", target, err)
	}
	t, err := openTarget(target, true)
	if err != nil {
		return false, err
	}
	defer t.Close()
	mounted, err := IsMountPoint(target)
	if err != nil {
		return false, fail("mount", target, err)
	}
	if mounted {
		return false, sameMount(device, target, fstype, flags&unix.MS_RDONLY != 0)
	}
	if err := unix.Mount(device, fdPath(t), fstype, flags, data); err != nil {
		return false, fail(fmt.Sprintf("mount %s (%s, %q) on", device, fstype, data), target, err)
	}
	return true, nil
}

// sameMount decides an existing mount at target: nil when it is the whole
// filesystem of device (by device number for block devices, by source
// name otherwise) of type fstype with the wanted read-only state.
func sameMount(device, target, fstype string, readOnly bool) error {
	e, err := Info(target)
	if err != nil {
		return err
	}
	same := e.FSType == fstype && e.Root == "/"
	var dst unix.Stat_t
	if unix.Stat(device, &dst) == nil && dst.Mode&unix.S_IFMT == unix.S_IFBLK {
		same = same && e.Major == int(unix.Major(dst.Rdev)) && e.Minor == int(unix.Minor(dst.Rdev))
	} else {
		same = same && e.Source == device
	}
	if !same {
		return abi.Errorf(abi.AlreadyExists, "mount: %q is already mounted from %s (%s%s)", target, e.Source, e.FSType, rootSuffix(e.Root))
	}
	if e.ReadOnly != readOnly {
		return abi.Errorf(abi.AlreadyExists, "mount: %q is already mounted %s", target, rwName(e.ReadOnly))
	}
	return nil
}

// Unmount unmounts target, including every mount stacked on it (leaks of
// earlier, non-idempotent publishes). It reports whether anything was
// unmounted; a target that does not exist or is not a mount point is fine.
// A busy mount is FailedPrecondition: Unmount never detaches lazily.
func Unmount(ctx context.Context, target string) (bool, error) {
	return unmount(ctx, target, 0)
}

// UnmountLazy is Unmount with MNT_DETACH: the mount disappears from the
// namespace at once and is cleaned up when it is no longer busy. Use it
// only on explicit request; a lazily detached filesystem may still be
// written to.
func UnmountLazy(ctx context.Context, target string) (bool, error) {
	return unmount(ctx, target, unix.MNT_DETACH)
}

// UnmountTop unmounts the topmost mount at target only, never one stacked
// under it. It reports whether anything was unmounted; a target that does
// not exist or is not a mount point is fine. Links in target are resolved
// first, as Info and IsMountPoint resolve them: the mount unmounted is
// the one they see at target.
func UnmountTop(ctx context.Context, target string) (bool, error) {
	if err := checkPath("target", target); err != nil {
		return false, err
	}
	real, err := filepath.EvalSymlinks(target)
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ENOTDIR):
		return false, nil
	case err != nil:
		return false, fail("unmount", target, err)
	}
	target = real
	for {
		if err := ctx.Err(); err != nil {
			return false, fail("unmount", target, err)
		}
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
			return false, nil
		default:
			return false, fail("unmount", target, err)
		}
	}
}

// maxStacked bounds the loop over stacked mounts.
const maxStacked = 64

func unmount(ctx context.Context, target string, flags int) (bool, error) {
	if err := checkPath("target", target); err != nil {
		return false, err
	}
	did := false
	for i := 0; i < maxStacked; i++ {
		if err := ctx.Err(); err != nil {
			return did, fail("unmount", target, err)
		}
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW|flags)
		switch {
		case err == nil:
			did = true
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
			// Not (or no longer) a mount point, or not there at all.
			return did, nil
		default:
			return did, fail("unmount", target, err)
		}
	}
	return did, abi.Errorf(abi.Internal, "mount: unmount %q: still mounted after %d unmounts", target, maxStacked)
}

// openTarget makes sure target exists with the kind the source needs and
// opens it without following a symlink in its place.
func openTarget(target string, dir bool) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return nil, fail("create parent of", target, err)
	}
	if dir {
		if err := os.Mkdir(target, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fail("create", target, err)
		}
	} else {
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o640)
		switch {
		case err == nil:
			f.Close()
		case errors.Is(err, os.ErrExist):
		default:
			return nil, fail("create", target, err)
		}
	}
	t, err := os.OpenFile(target, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fail("open", target, err)
	}
	if err := checkTargetKind(t, target, dir); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// checkTargetKind checks that the open target t is no symlink and a
// directory exactly when the source is one.
func checkTargetKind(t *os.File, target string, dir bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(t.Fd()), &st); err != nil {
		return fail("open", target, err)
	}
	switch kind := st.Mode & unix.S_IFMT; {
	case kind == unix.S_IFLNK:
		return abi.Errorf(abi.FailedPrecondition, "mount: target %q is a symlink", target)
	case dir && kind != unix.S_IFDIR:
		return abi.Errorf(abi.FailedPrecondition, "mount: target %q is not a directory, the source is", target)
	case !dir && kind == unix.S_IFDIR:
		return abi.Errorf(abi.FailedPrecondition, "mount: target %q is a directory, the source is not", target)
	}
	return nil
}

// fdPath names an open file by its /proc magic link, so that mount(2)
// acts on exactly that inode.
func fdPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

func checkPath(what, p string) error {
	if p == "" || !filepath.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return abi.Errorf(abi.InvalidArgument, "mount: %s %q is not an absolute path", what, p)
	}
	return nil
}

func validFSType(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func rwName(ro bool) string {
	if ro {
		return "read-only"
	}
	return "read-write"
}

func rootSuffix(root string) string {
	if root == "/" || root == "" {
		return ""
	}
	return ", subtree " + root
}

// fail turns a system error into an *abi.Error with the category a caller
// can act on; op and path say what failed.
func fail(op, path string, err error) error {
	var ae *abi.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("mount: %s %q: %w", op, path, err)
	}
	code := abi.Internal
	var errno unix.Errno
	switch {
	case errors.Is(err, context.Canceled):
		code = abi.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = abi.DeadlineExceeded
	case errors.As(err, &errno):
		switch errno {
		case unix.ENOENT, unix.ENXIO, unix.ENOMEDIUM:
			code = abi.NotFound
		case unix.EACCES, unix.EPERM:
			code = abi.PermissionDenied
		case unix.EINVAL, unix.ENODEV, unix.ENOTBLK, unix.ENAMETOOLONG:
			code = abi.InvalidArgument
		case unix.EBUSY, unix.EROFS, unix.ENOTDIR, unix.ELOOP, unix.EEXIST:
			code = abi.FailedPrecondition
		case unix.ENOSPC, unix.ENOMEM, unix.EMFILE, unix.ENFILE:
			code = abi.ResourceExhausted
		}
	}
	return abi.Errorf(code, "mount: %s %q: %v", op, path, err)
}
