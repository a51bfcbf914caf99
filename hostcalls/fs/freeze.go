package fs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Freezing pauses every write to a mounted filesystem: FIFREEZE writes out
// all it holds (dirty pages, journal, superblock) to its device and blocks
// every later writer until FITHAW. The host freezes the members of a group
// snapshot while they are cut, so that each member's device holds the same
// point of the write stream. A filesystem stays frozen when whoever froze
// it dies: callers must guarantee the thaw (hostcalls/node/quiesce does).

// The ioctls, _IOWR('X', 119, int) and _IOWR('X', 120, int); golang.org/x/sys
// does not define them.
const (
	fifreeze = 0xc0045877
	fithaw   = 0xc0045878
)

// Freeze freezes the filesystem that holds path (normally its mount point).
// dev, when not zero, is the filesystem's device number (st_dev) the caller
// expects there: another filesystem at path is FailedPrecondition, so a
// stale path never freezes whatever holds it now (the root filesystem once
// the volume is unmounted). A filesystem someone else has already frozen is
// FailedPrecondition too, because the caller's thaw would end their freeze,
// and so is one that cannot be frozen.
func Freeze(path string, dev uint64) error {
	fd, err := openFS(path, dev)
	if err != nil {
		return fmt.Errorf("freeze %s: %w", path, err)
	}
	defer unix.Close(fd)
	err = ioctlInt(fd, fifreeze)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EBUSY):
		return &FrozenElsewhere{abi.Errorf(abi.FailedPrecondition, "freeze %s: the filesystem is already frozen by someone else", path)}
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL):
		return abi.Errorf(abi.FailedPrecondition, "freeze %s: the filesystem cannot be frozen (%v)", path, err)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return abi.Errorf(abi.PermissionDenied, "freeze %s: %v", path, err)
	}
	return abi.Errorf(abi.Internal, "freeze %s: %v", path, err)
}

// FrozenElsewhere is Freeze's error (FailedPrecondition) for a filesystem
// someone else has frozen.
type FrozenElsewhere struct{ err *abi.Error }

func (e *FrozenElsewhere) Error() string { return e.err.Error() }
func (e *FrozenElsewhere) Unwrap() error { return e.err }

// Thaw thaws the filesystem that holds path when it is the one of device
// number dev (any, when dev is 0) and reports whether it was frozen. A
// filesystem that is not frozen, or not there any more, is no error: Thaw is
// what cleanup calls after a crash, when it cannot know how far the freeze
// got.
func Thaw(path string, dev uint64) (bool, error) {
	fd, err := openFS(path, dev)
	if abi.CodeOf(err) == abi.NotFound || abi.CodeOf(err) == abi.FailedPrecondition {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("thaw %s: %w", path, err)
	}
	defer unix.Close(fd)
	err = ioctlInt(fd, fithaw)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EINVAL):
		return false, nil // not frozen
	}
	return false, abi.Errorf(abi.Internal, "thaw %s: %v", path, err)
}

// DeviceOf returns the device number (st_dev) of the filesystem that holds
// path, the identity Freeze and Thaw check.
func DeviceOf(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, abi.Errorf(abi.NotFound, "stat %s: %v", path, err)
		}
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Dev, nil
}

// openFS opens path, a directory, and checks that the filesystem holding it
// has device number dev (when dev is not 0).
func openFS(path string, dev uint64) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return -1, abi.Errorf(abi.NotFound, "%v", err)
	}
	if err != nil {
		return -1, err
	}
	if dev != 0 {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if st.Dev != dev {
			unix.Close(fd)
			return -1, abi.Errorf(abi.FailedPrecondition, "the filesystem there is device %d:%d, not %d:%d", unix.Major(st.Dev), unix.Minor(st.Dev), unix.Major(dev), unix.Minor(dev))
		}
	}
	return fd, nil
}

func ioctlInt(fd int, req uint) error {
	// FIFREEZE and FITHAW take an int argument the kernel ignores.
	for {
		err := unix.IoctlSetInt(fd, req, 0)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
