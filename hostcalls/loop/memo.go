package loop

import (
	"context"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// blkGetDiskSeq is BLKGETDISKSEQ, _IOR(0x12, 128, __u64), Linux 5.15.
const blkGetDiskSeq = 0x80081280

// memoKey keys a loop device's description in a memo by its path.
type memoKey string

// memoized is a description and the disk sequence number read before it.
type memoized struct {
	d   Device
	seq uint64
}

// diskSeq returns the disk sequence number of the open device fd, or 0
// where the kernel has none (before Linux 5.15): then only the status tells
// bindings apart.
func diskSeq(fd int) uint64 {
	var seq uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), blkGetDiskSeq, uintptr(unsafe.Pointer(&seq))); e != 0 {
		return 0
	}
	return seq
}

// remember puts d, described at disk sequence number seq, into ctx's memo.
func remember(ctx context.Context, d Device, seq uint64) {
	hostcalls.MemoOf(ctx).Store(memoKey(d.Path), memoized{d, seq})
}

// forget drops dev from ctx's memo.
func forget(ctx context.Context, dev string) {
	hostcalls.MemoOf(ctx).Delete(memoKey(dev))
}

// recall describes the loop device open at fd, whose status is info: from
// ctx's memo when it holds a description of the same binding (same disk
// sequence number and backing file identity), with the flags of info and,
// when size is set, the size read now; afresh otherwise, and remembered.
// An unbound device is unix.ENXIO.
//
// reread makes a hit read the backing file's path again. Every caller sets
// it but detach's exclusive check, whose grant check read the path a
// moment before in the same call.
func recall(ctx context.Context, path string, fd int, info *unix.LoopInfo64, size, reread bool) (d Device, err error) {
	seq := diskSeq(fd)
	if v, ok := hostcalls.MemoOf(ctx).Load(memoKey(path)); ok {
		m := v.(memoized)
		if m.seq == seq && m.d.Dev == info.Device && m.d.Inode == info.Inode {
			d = m.d
			d.setFlags(info)
			// The same file, but its path may have changed (a rename, even
			// out of the caller's roots): the grant checks the path, so it
			// is read again, as the kernel shows it now.
			if reread {
				if d.BackingFile, d.BackingDeleted, err = backingFile(path, fileID{d.Dev, d.Inode}); err != nil {
					return Device{}, err
				}
				remember(ctx, d, seq)
			}
			if size {
				n, err := deviceSize(fd)
				if err != nil {
					return Device{}, fmt.Errorf("BLKGETSIZE64: %w", err)
				}
				d.SizeBytes = n
			}
			return d, nil
		}
	}
	if d, err = describeStatus(path, fd, info); err != nil {
		return Device{}, err
	}
	remember(ctx, d, seq)
	return d, nil
}
