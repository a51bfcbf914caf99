package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Usage is the usage of a mounted filesystem, as NodeGetVolumeStats reports
// it. Inode counts are zero on filesystems that allocate inodes dynamically
// (btrfs).
type Usage struct {
	TotalBytes     int64
	AvailableBytes int64 // available to unprivileged users
	UsedBytes      int64
	TotalInodes    int64
	FreeInodes     int64
	UsedInodes     int64
}

// UsageOf converts a statfs(2) result. It is shared with packages that call
// statfs on a descriptor of their own.
func UsageOf(st *unix.Statfs_t) Usage {
	unit := st.Frsize
	if unit == 0 {
		unit = st.Bsize
	}
	s := Usage{
		TotalBytes:     int64(st.Blocks) * unit,
		AvailableBytes: int64(st.Bavail) * unit,
		UsedBytes:      int64(st.Blocks-st.Bfree) * unit,
		TotalInodes:    int64(st.Files),
		FreeInodes:     int64(st.Ffree),
	}
	if st.Files >= st.Ffree {
		s.UsedInodes = int64(st.Files - st.Ffree)
	}
	return s
}

// Stats returns the usage of the filesystem that holds path.
func Stats(ctx context.Context, path string) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Usage{}, fmt.Errorf("statfs %s: %w", path, abi.Errorf(abi.NotFound, "%v", err))
		}
		return Usage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	return UsageOf(&st), nil
}

// DeviceSize returns the size in bytes of a block device (BLKGETSIZE64).
func DeviceSize(ctx context.Context, device string) (int64, error) {
	if err := checkDevice(device); err != nil {
		return 0, fmt.Errorf("size of %s: %w", device, err)
	}
	f, err := os.OpenFile(device, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", device, err)
	}
	defer f.Close()
	size, err := ioctlSize(f)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", device, err)
	}
	return size, nil
}

// ioctlSize returns the size of the open block device f.
func ioctlSize(f *os.File) (int64, error) {
	var size uint64
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size)))
	if e != 0 {
		return 0, fmt.Errorf("BLKGETSIZE64: %w", e)
	}
	return int64(size), nil
}
