package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

const (
	controlPath = "/dev/loop-control"
	devPrefix   = "/dev/loop"
	sysBlock    = "/sys/block"

	// loopMajor is the block major of every loop device (LOOP_MAJOR).
	loopMajor = 7

	// maxBusyRetries bounds how often Attach asks for another free device
	// after losing a LOOP_CONFIGURE race. Each retry means another attacher
	// made progress, so hitting the bound needs heavy, sustained contention.
	maxBusyRetries = 256

	// detachSettle bounds how long Detach waits for the kernel to unbind a
	// device that another process still held open when it was detached.
	detachSettle = 2 * time.Second
)

// Options choose how Attach binds a file.
type Options struct {
	// ReadOnly attaches the device read-only (LO_FLAGS_READ_ONLY) and opens
	// the backing file read-only.
	ReadOnly bool
	// DirectIO asks the loop driver to bypass the page cache of the backing
	// file (LO_FLAGS_DIRECT_IO). It is a wish: when the backing filesystem
	// cannot do direct I/O for this device, the device is attached without
	// it and Device.DirectIO says so.
	DirectIO bool
}

// Device is a bound loop device.
type Device struct {
	// Path is the device node, "/dev/loopN".
	Path string
	// BackingFile is the backing file's path as the kernel shows it in
	// sysfs, without a " (deleted)" suffix. It is informational: the file
	// may have been renamed since it was attached.
	BackingFile string
	// BackingDeleted reports that the backing file has no name any more.
	BackingDeleted bool
	// Dev and Inode identify the backing file (st_dev and st_ino).
	Dev   uint64
	Inode uint64
	// SizeBytes is the device size (BLKGETSIZE64).
	SizeBytes int64
	// DirectIO and ReadOnly are the flags the kernel applied.
	DirectIO bool
	ReadOnly bool
	// AutoClear reports LO_FLAGS_AUTOCLEAR: the device unbinds itself on its
	// last close. This package never sets it on attach; a device of ours
	// carries it only while a Detach waits for another opener to close it.
	AutoClear bool
}

// Attach binds file to a free loop device and returns it. If file is already
// bound to a device (same device and inode numbers, not pending detach), that
// device is returned instead, so Attach is idempotent. A device bound with
// another read-only mode than asked is an abi.FailedPrecondition error.
func Attach(ctx context.Context, file string, opts Options) (Device, error) {
	mode := unix.O_RDWR
	if opts.ReadOnly {
		mode = unix.O_RDONLY
	}
	f, err := os.OpenFile(file, mode|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", file, codeErr(err, err.Error()))
	}
	defer f.Close()
	return AttachFile(ctx, f, opts)
}

// AttachFile is Attach for a file the caller opened, for callers that must
// open it in a confined way (openat2 beneath a granted root). A file opened
// read-only is attached read-only whatever opts says. The caller keeps f and
// may close it at once: the device holds its own reference to the file.
func AttachFile(ctx context.Context, f *os.File, opts Options) (Device, error) {
	return attachOpen(ctx, f, unix.S_IFREG, opts)
}

// AttachDevice binds a loop device over the block device dev, as Attach
// does over a file, and with the same idempotence: a device already bound
// over dev (matched by its node's device and inode numbers, so always name
// the same node, e.g. its real path) is returned. It is how the host
// publishes a block volume read-only: a read-only bind of a device node
// leaves the device writable, a read-only loop device over it is not
// (writes fail with EPERM). Modules cannot reach it.
func AttachDevice(ctx context.Context, dev string, opts Options) (Device, error) {
	mode := unix.O_RDWR
	if opts.ReadOnly {
		mode = unix.O_RDONLY
	}
	f, err := os.OpenFile(dev, mode|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", dev, codeErr(err, err.Error()))
	}
	defer f.Close()
	return attachOpen(ctx, f, unix.S_IFBLK, opts)
}

// attachOpen attaches the open file f, which must be of type kind (a
// regular file or a block device). The device is remembered in ctx's memo.
func attachOpen(ctx context.Context, f *os.File, kind uint32, opts Options) (Device, error) {
	name := f.Name()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Device{}, fmt.Errorf("attach %s: stat: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != kind {
		what := "not a regular file"
		if kind == unix.S_IFBLK {
			what = "not a block device"
		}
		return Device{}, fmt.Errorf("attach %s: %w", name, &abi.Error{Code: abi.InvalidArgument, Message: what})
	}
	accmode, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: fcntl: %w", name, err)
	}
	readOnly := opts.ReadOnly || accmode&unix.O_ACCMODE == unix.O_RDONLY

	unlock, err := lockFile(ctx, fd)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: lock: %w", name, err)
	}
	defer unlock()

	id := fileID{dev: st.Dev, ino: st.Ino}
	existing, found, err := findFile(ctx, id, func(d Device) bool { return !d.AutoClear })
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", name, err)
	}
	if found {
		if existing.ReadOnly != readOnly {
			return Device{}, fmt.Errorf("attach %s: %w", name, abi.Errorf(abi.FailedPrecondition, "already attached to %s with read-only=%s", existing.Path, strconv.FormatBool(existing.ReadOnly)))
		}
		return existing, nil
	}

	var flags uint32
	if readOnly {
		flags |= unix.LO_FLAGS_READ_ONLY
	}
	if opts.DirectIO {
		flags |= unix.LO_FLAGS_DIRECT_IO
	}
	dev, seq, err := bindFree(ctx, fd, name, flags)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", name, err)
	}
	hints.Store(id, dev.Path)
	remember(ctx, dev, seq)
	return dev, nil
}

// bindFree binds the backing fd to a free device, retrying when another
// attacher takes the device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
func bindFree(ctx context.Context, backing int, name string, flags uint32) (Device, uint64, error) {
	ctl, err := openNode(controlPath, unix.O_RDWR)
	if err != nil {
		return Device{}, 0, codeErr(err, err.Error())
	}
	defer unix.Close(ctl)

	for attempt := 0; attempt < maxBusyRetries; attempt++ {
		if err := ctx.Err(); err != nil {
			return Device{}, 0, err
		}
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENODEV) {
				return Device{}, 0, abi.Errorf(abi.ResourceExhausted, "no free loop device: %v", err)
			}
			return Device{}, 0, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev, seq, err := bindDevice(n, backing, name, flags)
		switch {
		case err == nil:
			return dev, seq, nil
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENXIO):
			// Another attacher won this device, or someone removed it
			// (LOOP_CTL_REMOVE) meanwhile: ask for another one.
			continue
		default:
			return Device{}, 0, err
		}
	}
	return Device{}, 0, abi.Errorf(abi.Aborted, "lost the race for a free loop device %d times", maxBusyRetries)
}

// bindDevice binds backing to /dev/loopN with LOOP_CONFIGURE. A kernel that
// refuses direct I/O for this file with EINVAL gets a second try without it.
// It returns the device and its disk sequence number.
func bindDevice(n int, backing int, name string, flags uint32) (Device, uint64, error) {
	path := devPrefix + strconv.Itoa(n)
	fd, err := openNode(path, unix.O_RDWR)
	if err != nil {
		return Device{}, 0, err
	}
	defer unix.Close(fd)

	cfg := unix.LoopConfig{Fd: uint32(backing)}
	cfg.Info.Flags = flags
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], name)
	err = unix.IoctlLoopConfigure(fd, &cfg)
	if errors.Is(err, unix.EINVAL) && flags&unix.LO_FLAGS_DIRECT_IO != 0 {
		cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(fd, &cfg)
	}
	if err != nil {
		return Device{}, 0, fmt.Errorf("LOOP_CONFIGURE %s: %w", path, err)
	}
	dev, seq, err := describe(path, fd)
	if err != nil {
		return Device{}, 0, fmt.Errorf("describe %s after attach: %w", path, err)
	}
	return dev, seq, nil
}

// Find returns the device file is bound to. It matches by the device and
// inode numbers of file; when file no longer exists, it matches a device
// whose backing file was deleted under that path. A device pending
// detach (AutoClear) is reported too.
func Find(ctx context.Context, file string) (Device, bool, error) {
	var st unix.Stat_t
	err := unix.Stat(file, &st)
	var match func(Device) bool
	switch {
	case err == nil:
		d, ok, err := findFile(ctx, fileID{dev: st.Dev, ino: st.Ino}, func(Device) bool { return true })
		if err != nil {
			return Device{}, false, fmt.Errorf("find %s: %w", file, err)
		}
		return d, ok, nil
	case errors.Is(err, unix.ENOENT):
		match = func(d Device) bool { return d.BackingDeleted && d.BackingFile == file }
	default:
		return Device{}, false, fmt.Errorf("find %s: %w", file, codeErr(err, "stat: "+err.Error()))
	}
	d, ok, err := find(ctx, match)
	if err != nil {
		return Device{}, false, fmt.Errorf("find %s: %w", file, err)
	}
	return d, ok, nil
}

// FindFile is Find for a file the caller opened (an O_PATH descriptor is
// enough), for callers that must open it in a confined way.
func FindFile(ctx context.Context, f *os.File) (Device, bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Device{}, false, fmt.Errorf("find %s: stat: %w", f.Name(), err)
	}
	d, ok, err := findFile(ctx, fileID{dev: st.Dev, ino: st.Ino}, func(Device) bool { return true })
	if err != nil {
		return Device{}, false, fmt.Errorf("find %s: %w", f.Name(), err)
	}
	return d, ok, nil
}

// Resize makes dev pick up the current size of its backing file
// (LOOP_SET_CAPACITY), typically after the file grew, and returns the new
// device size in bytes.
func Resize(ctx context.Context, dev string) (int64, error) {
	if err := checkDevicePath(dev); err != nil {
		return 0, fmt.Errorf("resize %s: %w", dev, err)
	}
	f, err := os.OpenFile(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("resize %s: %w", dev, codeErr(err, err.Error()))
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := isLoop(fd); err != nil {
		return 0, fmt.Errorf("resize %s: %w", dev, err)
	}
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0); err != nil {
		if errors.Is(err, unix.ENXIO) {
			return 0, fmt.Errorf("resize %s: %w", dev, abi.Errorf(abi.NotFound, "not attached"))
		}
		return 0, fmt.Errorf("resize %s: LOOP_SET_CAPACITY: %w", dev, err)
	}
	size, err := deviceSize(fd)
	if err != nil {
		return 0, fmt.Errorf("resize %s: BLKGETSIZE64: %w", dev, err)
	}
	return size, nil
}

// Detach unbinds dev from its backing file (LOOP_CLR_FD). A device that is
// already free, or whose node does not exist, is not an error. A device that
// is mounted or otherwise held exclusively (still after busyWait) is
// refused with abi.FailedPrecondition, so a volume in use is never pulled
// away. When a
// process holds the device open without a claim (a probe, a reader), the
// kernel unbinds it on that last close; Detach waits for that a short while
// (at most 2 s, less if ctx ends first) and then succeeds either way.
// It unbinds whatever file backs dev now: a caller that learned of the
// device earlier detaches it with DetachBound.
func Detach(ctx context.Context, dev string) error {
	return detach(ctx, dev, nil)
}

// DetachBound is Detach of the device d that Attach, Find, Status or List
// described: it unbinds d.Path only while the file d names (Dev, Inode)
// still backs it, as the descriptor that unbinds it shows. A device number
// is only a name: once its file is detached, any process may bind another
// file to it, and a detach by path from someone who saw the old binding (a
// cleanup, a sweep after a listing) would unbind that process's device. A
// device that is free or backs another file is left alone (nil).
func DetachBound(ctx context.Context, d Device) error {
	return detach(ctx, d.Path, func(now Device) error {
		if now.Dev != d.Dev || now.Inode != d.Inode {
			return errUnbound // not d's binding any more: nothing of ours
		}
		return nil
	})
}

// busyWait bounds how long Detach waits for an exclusive claim on the
// device to end before it answers that the device is in use.
const (
	busyWait = time.Second
	busyPoll = 50 * time.Millisecond
)

// errUnbound is what a grant answers for a device it finds unbound.
var errUnbound = errors.New("not bound")

// detach is Detach that first asks grant (when not nil) about the bound
// device, through a plain open, and confirms the binding grant saw through
// the claimed descriptor that then unbinds it: an error of grant refuses
// the detach, errUnbound ends it as done. Since grant is asked before the
// device is claimed, a device the caller may not touch is refused as such,
// busy or not.
func detach(ctx context.Context, dev string, grant func(Device) error) error {
	if err := checkDevicePath(dev); err != nil {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	if grant != nil {
		// The grant first, through a plain open: the exclusive open below
		// claims the device while it lasts, which a caller the device is
		// not granted to must never do (another module's mkfs or mount
		// would fail with EBUSY meanwhile).
		d, bound, err := status(ctx, dev, false)
		if err == nil && bound {
			err = grant(d)
		}
		switch {
		case (err == nil && !bound) || errors.Is(err, errUnbound):
			return nil
		case err != nil:
			return fmt.Errorf("detach %s: %w", dev, err)
		}
	}
	// O_EXCL on a block device claims it: this fails with EBUSY while a
	// filesystem is mounted on it or device-mapper holds it. A claim that
	// ends within a moment is waited for (busyWait): a filesystem the
	// caller just unmounted may let go of its device a little after the
	// unmount returned, when a concurrent lookup held the last reference
	// to the mount, and a probe (mkfs, fsck) may hold it briefly.
	fd, err := openNode(dev, unix.O_RDONLY|unix.O_EXCL)
	for wait := time.Duration(0); errors.Is(err, unix.EBUSY) && wait < busyWait && ctx.Err() == nil; wait += busyPoll {
		select {
		case <-ctx.Done():
		case <-time.After(busyPoll):
		}
		fd, err = openNode(dev, unix.O_RDONLY|unix.O_EXCL)
	}
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENXIO):
		return nil
	case errors.Is(err, unix.EBUSY) && ctx.Err() != nil:
		return fmt.Errorf("detach %s: device still in use when the call ended: %w", dev, ctx.Err())
	case errors.Is(err, unix.EBUSY):
		// Granted above (a device held exclusively stays bound as it was).
		return fmt.Errorf("detach %s: %w", dev, abi.Errorf(abi.FailedPrecondition, "device is in use (mounted or held)"))
	case err != nil:
		return fmt.Errorf("detach %s: %w", dev, codeErr(err, err.Error()))
	}
	if err := isLoop(fd); err != nil {
		unix.Close(fd)
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	// What it was bound to, to drop the hint afterwards, so hints do not
	// pile up for files long detached: the status alone says it.
	bound, berr := unix.IoctlLoopGetStatus64(fd)
	if grant != nil {
		if err := grantBound(ctx, dev, fd, bound, berr, grant); err != nil {
			unix.Close(fd)
			if errors.Is(err, errUnbound) {
				return nil
			}
			return fmt.Errorf("detach %s: %w", dev, err)
		}
	}
	err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	// The kernel finishes the unbind when the last opener closes: us,
	// unless someone else has the device open too.
	unix.Close(fd)
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: LOOP_CLR_FD: %w", dev, err)
	}
	forget(ctx, dev)
	if berr == nil {
		hints.CompareAndDelete(fileID{dev: bound.Device, ino: bound.Inode}, dev)
	}
	waitUnbound(ctx, dev)
	return nil
}

// grantBound runs grant on the device open at fd, whose LOOP_GET_STATUS64
// gave info or err.
func grantBound(ctx context.Context, dev string, fd int, info *unix.LoopInfo64, err error, grant func(Device) error) error {
	if errors.Is(err, unix.ENXIO) {
		return errUnbound
	}
	if err != nil {
		return fmt.Errorf("LOOP_GET_STATUS64: %w", err)
	}
	d, err := recall(ctx, dev, fd, info, false, false)
	if errors.Is(err, unix.ENXIO) {
		return errUnbound
	}
	if err != nil {
		return err
	}
	return grant(d)
}

// waitUnbound polls sysfs until dev has no backing file, for at most
// detachSettle or until ctx is done. The wait is a courtesy to callers that
// look the device up next: the detach itself is already committed, and a
// device still bound after the wait is unbound by the kernel on its last
// close (it carries AutoClear until then).
func waitUnbound(ctx context.Context, dev string) {
	backing := sysBlock + "/" + strings.TrimPrefix(dev, "/dev/") + "/loop/backing_file"
	deadline := time.Now().Add(detachSettle)
	delay := 50 * time.Microsecond
	for {
		if _, err := os.Stat(backing); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) || sleep(ctx, delay) != nil {
			return
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// checkDevicePath accepts only "/dev/loopN".
func checkDevicePath(dev string) error {
	n, ok := strings.CutPrefix(dev, devPrefix)
	if !ok || n == "" || len(n) > 7 || strings.TrimLeft(n, "0123456789") != "" {
		return abi.Errorf(abi.InvalidArgument, "not a loop device path: %q", dev)
	}
	return nil
}

// isLoop checks that fd is a loop block device, whatever its node is named.
func isLoop(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != loopMajor {
		return abi.Errorf(abi.InvalidArgument, "not a loop device")
	}
	return nil
}

// deviceSize is BLKGETSIZE64.
func deviceSize(fd int) (int64, error) {
	var size uint64
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size)))
	if e != 0 {
		return 0, e
	}
	return int64(size), nil
}

// lockFile takes an exclusive flock on the file behind fd through a second
// open file description, so that the lock ends with unlock (or the process)
// and never lives on inside a loop device that holds the first one.
func lockFile(ctx context.Context, fd int) (unlock func(), err error) {
	lfd, err := openNode("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("reopen: %w", err)
	}
	delay := 100 * time.Microsecond
	for {
		err := unix.Flock(lfd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(lfd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			unix.Close(lfd)
			return nil, fmt.Errorf("flock: %w", err)
		}
		if err := sleep(ctx, delay); err != nil {
			unix.Close(lfd)
			return nil, err
		}
		delay = min(2*delay, 10*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// openNode opens path with open(2) itself: an os.File registers its
// descriptor with the runtime's poller and switches it to blocking mode
// again when asked for it (Fd), up to five more system calls per open that
// a device node, a sysfs file or a lock's descriptor does not need. The
// error is an *os.PathError, as os.OpenFile's.
func openNode(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.EINTR) {
			return -1, &os.PathError{Op: "open", Path: path, Err: err}
		}
	}
}

// codeErr gives an errno the abi code a caller can act on.
func codeErr(err error, msg string) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return &abi.Error{Code: abi.NotFound, Message: msg}
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return &abi.Error{Code: abi.PermissionDenied, Message: msg}
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return &abi.Error{Code: abi.InvalidArgument, Message: msg}
	}
	return err
}
