package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

const deletedSuffix = " (deleted)"

// fileID is what identifies a backing file across renames: st_dev + st_ino.
type fileID struct{ dev, ino uint64 }

func (id fileID) matches(d Device) bool { return d.Dev == id.dev && d.Inode == id.ino }

// matchesInfo is matches on the raw status, before the device is described.
func (id fileID) matchesInfo(info *unix.LoopInfo64) bool {
	return info.Device == id.dev && info.Inode == id.ino
}

// hints remembers, per backing file (fileID), the device this process last
// attached or found it on, so that Find and Attach of an attached file
// check that one device instead of walking every loop device. A hint is
// only a guess: it is checked against the kernel before it is used, and a
// wrong or missing one falls back to the walk, so devices attached or
// detached by others (or before a restart) are still found.
var hints sync.Map // fileID -> device path

// findFile returns the bound device backing the file id that match
// accepts, trying the hint first. The device is remembered in ctx's memo.
func findFile(ctx context.Context, id fileID, match func(Device) bool) (Device, bool, error) {
	if v, ok := hints.Load(id); ok {
		if err := ctx.Err(); err != nil {
			return Device{}, false, err
		}
		d, seq, bound, err := readDeviceIf(v.(string), nil)
		if err == nil && bound && id.matches(d) && match(d) {
			remember(ctx, d, seq)
			return d, true, nil
		}
		hints.CompareAndDelete(id, v)
	}
	d, seq, ok, err := walkFind(ctx, id.matchesInfo, func(d Device) bool { return id.matches(d) && match(d) })
	if ok {
		hints.Store(id, d.Path)
		remember(ctx, d, seq)
	}
	return d, ok, err
}

// List returns every bound loop device, ordered by device number, whoever
// attached it. The daemon uses it at start-up to reconcile devices with its
// volume records.
func List(ctx context.Context) ([]Device, error) {
	var devs []Device
	err := walk(ctx, nil, func(d Device, _ uint64) bool {
		devs = append(devs, d)
		return false
	})
	if err != nil {
		return nil, fmt.Errorf("list loop devices: %w", err)
	}
	return devs, nil
}

// Status describes one loop device; bound is false when no file backs it
// (or the node does not exist). It reads only that device, where List
// walks them all. Within an operation whose ctx carries a memo
// (hostcalls.WithMemo) that already described the device, it reads its
// status and size but reuses the backing file's path, once the kernel
// confirms that the device is still bound as it was then (recall).
func Status(ctx context.Context, dev string) (d Device, bound bool, err error) {
	return status(ctx, dev, true)
}

// status is Status; without size, a description the memo confirms keeps
// the size it had then.
func status(ctx context.Context, dev string, size bool) (d Device, bound bool, err error) {
	if err := ctx.Err(); err != nil {
		return Device{}, false, err
	}
	fd, err := openNode(dev, unix.O_RDONLY|unix.O_NONBLOCK)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
		return Device{}, false, nil
	}
	if err != nil {
		return Device{}, false, err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if errors.Is(err, unix.ENXIO) {
		return Device{}, false, nil
	}
	if err != nil {
		return Device{}, false, fmt.Errorf("%s: LOOP_GET_STATUS64: %w", dev, err)
	}
	d, err = recall(ctx, dev, fd, info, size, true)
	if errors.Is(err, unix.ENXIO) {
		return Device{}, false, nil
	}
	if err != nil {
		return Device{}, false, fmt.Errorf("%s: %w", dev, err)
	}
	return d, true, nil
}

// find returns the first bound device that match accepts.
func find(ctx context.Context, match func(Device) bool) (Device, bool, error) {
	d, _, ok, err := walkFind(ctx, nil, match)
	return d, ok, err
}

// walkFind returns the first bound device that match accepts among those
// whose raw status pre accepts (all when pre is nil), and its disk
// sequence number.
func walkFind(ctx context.Context, pre func(*unix.LoopInfo64) bool, match func(Device) bool) (Device, uint64, bool, error) {
	var found Device
	var seq uint64
	var ok bool
	err := walk(ctx, pre, func(d Device, s uint64) bool {
		if match(d) {
			found, seq, ok = d, s, true
		}
		return ok
	})
	return found, seq, ok, err
}

// walk calls fn for each bound loop device (and its disk sequence number)
// in device-number order until fn returns true. Bound devices are those
// with a loop/backing_file in sysfs; each is then opened for
// LOOP_GET_STATUS64, which is where the backing file's identity lives. A device unbound meanwhile is skipped, and so is
// one whose status pre (when not nil) refuses: a search for one file reads
// only the status of the others, not their size and sysfs path.
func walk(ctx context.Context, pre func(*unix.LoopInfo64) bool, fn func(Device, uint64) bool) error {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return err
	}
	var nums []int
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "loop")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 {
			continue
		}
		if _, err := os.Stat(sysBlock + "/" + e.Name() + "/loop/backing_file"); err != nil {
			continue // unbound
		}
		nums = append(nums, n)
	}
	slices.Sort(nums)
	for _, n := range nums {
		if err := ctx.Err(); err != nil {
			return err
		}
		check := pre
		if pre != nil {
			// A binding seen before is refused without opening its
			// device (see seen).
			seq, ok := sysfsDiskSeq(n)
			if ok {
				if v, hit := seen.Load(n); hit && v.(seenBinding).seq == seq {
					b := v.(seenBinding)
					if !pre(&unix.LoopInfo64{Device: b.dev, Inode: b.ino}) {
						continue
					}
				}
				check = func(info *unix.LoopInfo64) bool {
					seen.Store(n, seenBinding{seq: seq, dev: info.Device, ino: info.Inode})
					return pre(info)
				}
			}
		}
		d, seq, bound, err := readDeviceIf(devPrefix+strconv.Itoa(n), check)
		if err != nil {
			return err
		}
		if bound && fn(d, seq) {
			return nil
		}
	}
	return nil
}

// seen remembers, per loop device number, the backing file (st_dev and
// st_ino) of the binding a search last read through LOOP_GET_STATUS64,
// with the device's disk sequence number read from sysfs before that
// ioctl. The kernel gives every bind and unbind a new sequence number and
// never reuses one, and a binding's backing file never changes, so while
// sysfs shows the same number the device is bound to the same file: a
// search for another file skips it without opening the device (the open,
// status and close a walk otherwise pays per bound device: an attach of a
// new file walks all of them). Should the device be bound anew between the
// sysfs read and the ioctl, the entry pairs the new binding's file with the
// old number, which sysfs never shows again: a wasted entry, never a wrong
// answer. A device whose sysfs has no diskseq (before Linux 5.15) is read
// as before. One entry per device number: its size is bounded by the
// number of loop devices.
var seen sync.Map // int -> seenBinding

type seenBinding struct{ seq, dev, ino uint64 }

// sysfsDiskSeq reads /sys/block/loopN/diskseq.
func sysfsDiskSeq(n int) (uint64, bool) {
	raw, err := readSysfs(sysBlock + "/loop" + strconv.Itoa(n) + "/diskseq")
	if err != nil {
		return 0, false
	}
	seq, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	return seq, err == nil && seq != 0
}

// readDeviceIf describes the device at path, reporting bound=false when it
// is not (or no longer) bound or its node is gone, or when pre (if not nil)
// refuses its status; it then stops after LOOP_GET_STATUS64.
func readDeviceIf(path string, pre func(*unix.LoopInfo64) bool) (d Device, seq uint64, bound bool, err error) {
	fd, err := openNode(path, unix.O_RDONLY|unix.O_NONBLOCK)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
		return Device{}, 0, false, nil
	}
	if err != nil {
		return Device{}, 0, false, err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if errors.Is(err, unix.ENXIO) {
		return Device{}, 0, false, nil
	}
	if err != nil {
		return Device{}, 0, false, fmt.Errorf("%s: LOOP_GET_STATUS64: %w", path, err)
	}
	if pre != nil && !pre(info) {
		return Device{}, 0, false, nil
	}
	seq = diskSeq(fd)
	d, err = describeStatus(path, fd, info)
	if errors.Is(err, unix.ENXIO) {
		return Device{}, 0, false, nil
	}
	if err != nil {
		return Device{}, 0, false, fmt.Errorf("%s: %w", path, err)
	}
	return d, seq, true, nil
}

// describe builds the Device for the open loop device fd, and reads its
// disk sequence number before the backing file's path (see recall).
func describe(path string, fd int) (Device, uint64, error) {
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return Device{}, 0, fmt.Errorf("LOOP_GET_STATUS64: %w", err)
	}
	seq := diskSeq(fd)
	d, err := describeStatus(path, fd, info)
	return d, seq, err
}

// describeStatus is describe with the device's status already read.
func describeStatus(path string, fd int, info *unix.LoopInfo64) (Device, error) {
	size, err := deviceSize(fd)
	if err != nil {
		return Device{}, fmt.Errorf("BLKGETSIZE64: %w", err)
	}
	d := Device{Path: path, Dev: info.Device, Inode: info.Inode, SizeBytes: size}
	d.setFlags(info)
	if d.BackingFile, d.BackingDeleted, err = backingFile(path, fileID{d.Dev, d.Inode}); err != nil {
		return Device{}, err
	}
	return d, nil
}

// readSysfs reads a sysfs file (a variable: tests count the reads).
var readSysfs = readAttribute

// readAttribute reads a sysfs attribute. The kernel renders one whole
// into a page and a read returns as much of it as fits, so one read of a
// page and a byte more gets it all: os.ReadFile's fstat, poller
// registration and read of the end are system calls for nothing.
func readAttribute(path string) ([]byte, error) {
	fd, err := openNode(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, os.Getpagesize()+1)
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		case n == len(buf):
			return os.ReadFile(path) // not an attribute after all
		}
		return buf[:n], nil
	}
}

// setFlags sets the flags of d that the status info shows.
func (d *Device) setFlags(info *unix.LoopInfo64) {
	d.DirectIO = info.Flags&unix.LO_FLAGS_DIRECT_IO != 0
	d.ReadOnly = info.Flags&unix.LO_FLAGS_READ_ONLY != 0
	d.AutoClear = info.Flags&unix.LO_FLAGS_AUTOCLEAR != 0
}

// backingFile reads the path of the file backing the loop device at path
// (see backingPath); an unbound device is unix.ENXIO.
func backingFile(path string, id fileID) (file string, deleted bool, err error) {
	raw, err := readSysfs(sysBlock + "/" + strings.TrimPrefix(path, "/dev/") + "/loop/backing_file")
	if errors.Is(err, os.ErrNotExist) {
		return "", false, unix.ENXIO // unbound between the ioctl and now
	}
	if err != nil {
		return "", false, err
	}
	file, deleted = backingPath(strings.TrimSuffix(string(raw), "\n"), id)
	return file, deleted, nil
}

// backingPath splits the " (deleted)" suffix the kernel appends to an
// unlinked backing file's path. A file whose real name ends in that suffix is
// told apart by stat-ing the full string and comparing identities.
func backingPath(shown string, id fileID) (path string, deleted bool) {
	trimmed, ok := strings.CutSuffix(shown, deletedSuffix)
	if !ok {
		return shown, false
	}
	var st unix.Stat_t
	if unix.Stat(shown, &st) == nil && st.Dev == id.dev && st.Ino == id.ino {
		return shown, false
	}
	return trimmed, true
}
