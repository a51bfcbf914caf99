package mounttest

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The shutdown ioctl of ext4, xfs and btrfs (EXT4_IOC_SHUTDOWN,
// XFS_IOC_GOINGDOWN, FS_IOC_SHUTDOWN: _IOR('X', 125, __u32)) and its flag
// that drops the journal's uncommitted transactions instead of writing
// them (EXT4_GOING_FLAGS_NOLOGFLUSH, XFS_FSOP_GOING_FLAGS_NOLOGFLUSH).
const (
	iocShutdown = 0x8004587d
	noLogFlush  = 2
)

// PowerCut makes the filesystem mounted at dir (from dev, of type fstype,
// mounted with data) lose what its journal has not committed, as a power
// loss would: it shuts the filesystem down without flushing its log (what
// xfstests' godown does), unmounts it and mounts dev on dir again, which
// replays the committed journal. What a call made durable before it
// answered is there afterwards; what it left to the next commit is not.
// The test is skipped when the filesystem cannot be shut down.
func PowerCut(t testing.TB, dev, dir, fstype, data string) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("power cut: open %s: %v", dir, err)
	}
	flags := uint32(noLogFlush)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocShutdown, uintptr(unsafe.Pointer(&flags)))
	unix.Close(fd)
	if e == unix.ENOTTY || e == unix.EOPNOTSUPP || e == unix.EINVAL {
		t.Skipf("power cut: %s cannot be shut down: %v", fstype, e)
	}
	if e != 0 {
		t.Fatalf("power cut: shut down %s: %v", dir, e)
	}
	for {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EINVAL) {
			break // no mount left on dir
		}
		if err != nil {
			t.Fatalf("power cut: unmount %s: %v", dir, err)
		}
	}
	if err := unix.Mount(dev, dir, fstype, 0, data); err != nil {
		t.Fatalf("power cut: mount %s on %s again: %v", dev, dir, err)
	}
}
