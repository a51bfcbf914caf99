package fs

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// A mounted filesystem grows by the ioctl its own tool calls, so that an
// expansion spawns no process and needs no e2fsprogs, xfsprogs or
// btrfs-progs on the node: resize2fs (online), xfs_growfs -d and btrfs
// filesystem resize max each come down to one ioctl on the mount point.
// golang.org/x/sys does not define them.
const (
	// EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): the new block count.
	ext4ResizeFS = 0x40086610
	// XFS_IOC_FSGEOMETRY_V1, _IOR('X', 100, struct xfs_fsop_geom_v1).
	xfsGeometryV1 = 0x80705864
	// XFS_IOC_FSGROWFSDATA, _IOW('X', 110, struct xfs_growfs_data).
	xfsGrowData = 0x4010586e
	// BTRFS_IOC_RESIZE, _IOW(0x94, 3, struct btrfs_ioctl_vol_args).
	btrfsResize = 0x50009403
)

// xfsGeometry is struct xfs_fsop_geom_v1 (112 bytes), the fields this
// package reads named.
type xfsGeometry struct {
	BlockSize  uint32
	RtExtSize  uint32
	AgBlocks   uint32
	AgCount    uint32
	LogBlocks  uint32
	SectSize   uint32
	InodeSize  uint32
	ImaxPct    uint32
	DataBlocks uint64
	_          [112 - 40]byte
}

// xfsGrowfsData is struct xfs_growfs_data.
type xfsGrowfsData struct {
	NewBlocks uint64
	ImaxPct   uint32
	_         uint32
}

// btrfsVolArgs is struct btrfs_ioctl_vol_args.
type btrfsVolArgs struct {
	FD   int64
	Name [4088]byte
}

// growOnline grows the filesystem of type fstype mounted at mountPath from
// device to the device's size.
func growOnline(ctx context.Context, device, mountPath, fstype string) error {
	fd, err := unix.Open(mountPath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", mountPath, err)
	}
	defer unix.Close(fd)
	if fstype == Btrfs {
		// "max" grows device 1, the only one of a volume's filesystem,
		// to its size; btrfs finds the device itself.
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", mountPath, err)
		}
		if st.Type != unix.BTRFS_SUPER_MAGIC {
			return abi.Errorf(abi.FailedPrecondition, "%s is not a btrfs filesystem", mountPath)
		}
		var args btrfsVolArgs
		copy(args.Name[:], "max")
		r, err := ioctlRet(fd, btrfsResize, unsafe.Pointer(&args))
		if err == nil && r > 0 {
			// A positive answer is btrfs's own error: another
			// exclusive operation (balance, device add or remove,
			// another resize) runs.
			return abi.Errorf(abi.Aborted, "BTRFS_IOC_RESIZE max: another exclusive operation runs on the filesystem (btrfs error %d); try again", r)
		}
		return ioctlErr("BTRFS_IOC_RESIZE max", err)
	}
	// The filesystem at mountPath must be the one on device: its size
	// is what the filesystem grows to.
	var mst, dst unix.Stat_t
	if err := unix.Fstat(fd, &mst); err != nil {
		return fmt.Errorf("stat %s: %w", mountPath, err)
	}
	if err := unix.Stat(device, &dst); err != nil {
		return fmt.Errorf("stat %s: %w", device, err)
	}
	if mst.Dev != dst.Rdev {
		return abi.Errorf(abi.FailedPrecondition, "%s is not the filesystem of %s", mountPath, device)
	}
	switch fstype {
	case Ext4:
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", mountPath, err)
		}
		if st.Bsize <= 0 {
			return abi.Errorf(abi.Internal, "statfs %s: block size %d", mountPath, st.Bsize)
		}
		// resize2fs's count (ReadSize follows its rules; ext4 keeps its
		// superblock in the device's page cache, so the read sees the
		// mounted filesystem's). Nothing to add calls nothing, as
		// resize2fs does: the kernel would want CAP_SYS_RESOURCE even
		// for that.
		sz, ok, err := ReadSize(ctx, device)
		if err != nil {
			return err
		}
		if !ok || sz.Type != Ext4 {
			return abi.Errorf(abi.FailedPrecondition, "no ext4 superblock on %s", device)
		}
		if !sz.Growable() {
			return nil
		}
		blocks := uint64(sz.GrowBytes) / uint64(st.Bsize)
		return ioctlErr("EXT4_IOC_RESIZE_FS", ioctlPtr(fd, ext4ResizeFS, unsafe.Pointer(&blocks)))
	case XFS:
		var geo xfsGeometry
		if err := ioctlPtr(fd, xfsGeometryV1, unsafe.Pointer(&geo)); err != nil {
			return ioctlErr("XFS_IOC_FSGEOMETRY_V1", err)
		}
		if geo.BlockSize == 0 {
			return abi.Errorf(abi.Internal, "xfs geometry of %s: block size 0", mountPath)
		}
		size, err := DeviceSize(ctx, device)
		if err != nil {
			return err
		}
		// xfs_growfs's count: the device's, less a last allocation
		// group under 64 blocks, which the kernel would not add.
		blocks := uint64(size) / uint64(geo.BlockSize)
		if rem := blocks % uint64(max(geo.AgBlocks, 1)); rem != 0 && rem < 64 {
			blocks -= rem
		}
		if blocks <= geo.DataBlocks {
			return nil
		}
		in := xfsGrowfsData{NewBlocks: blocks, ImaxPct: geo.ImaxPct}
		return ioctlErr("XFS_IOC_FSGROWFSDATA", ioctlPtr(fd, xfsGrowData, unsafe.Pointer(&in)))
	}
	return abi.Errorf(abi.InvalidArgument, "cannot grow %s online", fstype)
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	_, err := ioctlRet(fd, req, arg)
	return err
}

// ioctlRet is ioctlPtr with the ioctl's return value.
func ioctlRet(fd int, req uint, arg unsafe.Pointer) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// ioctlErr gives a failed resize ioctl the code its cause names.
func ioctlErr(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return abi.Errorf(abi.PermissionDenied, "%s: %v (the kernel wants CAP_SYS_RESOURCE or CAP_SYS_ADMIN)", what, err)
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EOPNOTSUPP):
		return abi.Errorf(abi.FailedPrecondition, "%s: the filesystem cannot grow online: %v", what, err)
	case errors.Is(err, unix.ENOSPC):
		return abi.Errorf(abi.ResourceExhausted, "%s: %v", what, err)
	case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EAGAIN):
		return abi.Errorf(abi.Aborted, "%s: another resize runs: %v", what, err)
	}
	return abi.Errorf(abi.Internal, "%s: %v", what, err)
}
