package mount

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Looking up one mount by statx(2) and statmount(2) costs two system calls
// whatever the size of the mount table; /proc/self/mountinfo costs the
// whole table on every call, and a Kubernetes node has hundreds or
// thousands of mounts. statmount says which fields it knows since Linux
// 6.15; older kernels use mountinfo (Info decides once, by statmountWorks).

// statmount(2) request and answer mask bits (uapi linux/mount.h).
const (
	statmountSBBasic       = 0x1    // sb_dev_*, sb_magic, sb_flags
	statmountMntBasic      = 0x2    // mnt_id*, mnt_parent_id*, mnt_attr, propagation
	statmountMntRoot       = 0x8    // mnt_root
	statmountMntPoint      = 0x10   // mnt_point
	statmountFSType        = 0x20   // fs_type
	statmountMntOpts       = 0x80   // mnt_opts
	statmountFSSubtype     = 0x100  // fs_subtype
	statmountSBSource      = 0x200  // sb_source
	statmountSupportedMask = 0x1000 // supported_mask

	// statmountWant is everything Entry is made of.
	statmountWant = statmountSBBasic | statmountMntBasic | statmountMntRoot | statmountMntPoint |
		statmountFSType | statmountMntOpts | statmountFSSubtype | statmountSBSource
	// statmountNumbers are the fields always in an answer. The kernel
	// leaves a string field out of the answer's mask when it is empty
	// (no subtype, no source, no options).
	statmountNumbers = statmountSBBasic | statmountMntBasic
)

// mntIDReq is struct mnt_id_req as first published (MNT_ID_REQ_SIZE_VER0):
// the mount to describe, in the caller's mount namespace.
type mntIDReq struct {
	size  uint32
	_     uint32
	mntID uint64
	param uint64 // the request mask
}

// statmountHeader is the fixed part of struct statmount (uapi
// linux/mount.h), 512 bytes. The strings follow it; a [str] field is an
// offset into them, valid when its bit is in mask. Fields Entry does not
// need are blank but keep their place.
type statmountHeader struct {
	size       uint32 // bytes written, header and strings
	mntOpts    uint32 // [str] filesystem options, as mountinfo's super options
	mask       uint64 // which fields were filled
	sbDevMajor uint32
	sbDevMinor uint32
	_          uint64    // sb_magic
	sbFlags    uint32    // SB_RDONLY, SB_SYNCHRONOUS, SB_DIRSYNC, SB_LAZYTIME
	fsType     uint32    // [str]
	mntID      uint64    // unique (64-bit) ID, as statx STATX_MNT_ID_UNIQUE
	_          uint64    // mnt_parent_id
	_          [2]uint32 // mnt_id_old, mnt_parent_id_old
	mntAttr    uint64    // MOUNT_ATTR_*
	_          [4]uint64 // mnt_propagation, mnt_peer_group, mnt_master, propagate_from
	mntRoot    uint32    // [str] the mounted path inside the filesystem
	mntPoint   uint32    // [str] relative to the caller's root
	_          uint64    // mnt_ns_id
	fsSubtype  uint32    // [str] e.g. a FUSE filesystem's
	sbSource   uint32    // [str]
	_          [4]uint32 // opt_num, opt_array, opt_sec_num, opt_sec_array
	supported  uint64    // supported_mask: the fields this kernel knows
	_          [45]uint64
}

// statmountHeaderSize is sizeof(struct statmount), without strings.
const statmountHeaderSize = int(unsafe.Sizeof(statmountHeader{}))

// Buffer sizes for statmount: most mounts fit the first, and an answer
// that does not (overlayfs with many layers) doubles it up to the last.
const (
	statmountBufSize    = 4 << 10
	statmountBufSizeMax = 1 << 20
)

// statmountBufs recycles answer buffers, as []uint64 so that the header
// is aligned for statmountHeader.
var statmountBufs = sync.Pool{New: func() any {
	b := make([]uint64, statmountBufSize/8)
	return &b
}}

// statxFlags make statx as light as lstat: it asks no network or FUSE
// filesystem for attributes (a mount ID and the mount root attribute are
// the VFS's own), and it triggers no automount.
const statxFlags = unix.AT_STATX_DONT_SYNC | unix.AT_NO_AUTOMOUNT

// statmountErr says, once per process, why this kernel cannot answer Info
// by statx and statmount, or nil when it can.
var statmountErr = sync.OnceValue(probeStatmount)

// statmountWorks reports whether Info can use statx and statmount.
func statmountWorks() bool { return statmountErr() == nil }

// probeStatmount asks the kernel about the root's mount: whether statx
// names mounts by unique ID and marks mount roots (Linux 6.8), and whether
// statmount knows every field Entry needs (supported_mask, Linux 6.15). A
// missing system call is ENOSYS, or EPERM under a seccomp filter; an
// unknown mask bit is EINVAL or left out of the answer.
func probeStatmount() error {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, "/", statxFlags, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return fmt.Errorf("statx /: %w", err)
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 || stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return errors.New("statx gives no unique mount ID or mount root attribute")
	}
	buf := make([]uint64, statmountBufSize/8)
	if err := statmount(stx.Mnt_id, statmountSupportedMask, bytesOf(buf)); err != nil {
		return fmt.Errorf("statmount: %w", err)
	}
	h := headerOf(buf)
	if h.mask&statmountSupportedMask == 0 {
		return errors.New("statmount does not say which fields it supports")
	}
	if h.supported&statmountWant != statmountWant {
		return fmt.Errorf("statmount supports fields %#x, not all of %#x", h.supported, statmountWant)
	}
	return nil
}

// infoStatmount is Info by statx and statmount. statx follows target
// through its symlinks and mounts to the top mount there, and the kernel
// says whether the file it arrives at is the root of that mount: when it
// is not, target is inside a mount, not a mount point.
func infoStatmount(target string) (Entry, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, target, statxFlags, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return Entry{}, fail("mount info of", target, err)
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return Entry{}, fail("mount info of", target, errors.New("statx gave no mount ID"))
	}
	if stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return Entry{}, notMountPoint(target)
	}
	bp := statmountBufs.Get().(*[]uint64)
	defer statmountBufs.Put(bp)
	e, err := statmountEntry(stx.Mnt_id, bp)
	if errors.Is(err, unix.ENOENT) {
		// Unmounted since statx, or a mount of another namespace reached
		// through /proc/<pid>/root.
		return Entry{}, notMountPoint(target)
	}
	if err != nil {
		return Entry{}, fail("mount info of", target, err)
	}
	if e.Target == "" {
		// Mounted outside the caller's root: mountinfo does not list it.
		return Entry{}, notMountPoint(target)
	}
	return e, nil
}

// statmountEntry describes the mount with the unique ID id, using *bp as
// the buffer and growing it when the answer does not fit.
func statmountEntry(id uint64, bp *[]uint64) (Entry, error) {
	for {
		err := statmount(id, statmountWant, bytesOf(*bp))
		if errors.Is(err, unix.EOVERFLOW) && len(*bp)*8 < statmountBufSizeMax {
			*bp = make([]uint64, len(*bp)*2)
			continue
		}
		if err != nil {
			return Entry{}, err
		}
		return parseStatmount(id, *bp)
	}
}

// bytesOf is the memory of buf as bytes, for the kernel to write into.
func bytesOf(buf []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)*8)
}

// headerOf is the statmount header at the start of buf.
func headerOf(buf []uint64) *statmountHeader {
	return (*statmountHeader)(unsafe.Pointer(unsafe.SliceData(buf)))
}

// statmount is the statmount(2) system call for the mount id in the
// caller's mount namespace, filling buf with the fields of mask.
func statmount(id, mask uint64, buf []byte) error {
	req := mntIDReq{size: uint32(unsafe.Sizeof(mntIDReq{})), mntID: id, param: mask}
	_, _, errno := unix.Syscall6(unix.SYS_STATMOUNT,
		uintptr(unsafe.Pointer(&req)), uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(len(buf)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// parseStatmount makes an Entry, in mountinfo's terms, of statmount's
// answer in buf about the mount id.
func parseStatmount(id uint64, buf []uint64) (Entry, error) {
	h := headerOf(buf)
	if h.mask&statmountNumbers != statmountNumbers {
		return Entry{}, fmt.Errorf("statmount of mount %d: answer with fields %#x lacks %#x", id, h.mask, statmountNumbers)
	}
	b := bytesOf(buf)
	if h.mntID != id || int(h.size) < statmountHeaderSize || int(h.size) > len(b) {
		return Entry{}, fmt.Errorf("statmount of mount %d: answer for mount %d of %d bytes in a %d-byte buffer", id, h.mntID, h.size, len(b))
	}
	strs := b[statmountHeaderSize:h.size]
	str := func(bit uint64, off uint32) (string, error) {
		if h.mask&bit == 0 {
			return "", nil
		}
		if int(off) < len(strs) {
			if n := bytes.IndexByte(strs[off:], 0); n >= 0 {
				return string(strs[off : int(off)+n]), nil
			}
		}
		return "", fmt.Errorf("statmount of mount %d: no string at %d of %d bytes", id, off, len(strs))
	}
	var e Entry
	var subtype, fsOpts string
	var err error
	for _, f := range []struct {
		bit uint64
		off uint32
		to  *string
	}{
		{statmountMntPoint, h.mntPoint, &e.Target},
		{statmountSBSource, h.sbSource, &e.Source},
		{statmountMntRoot, h.mntRoot, &e.Root},
		{statmountFSType, h.fsType, &e.FSType},
		{statmountFSSubtype, h.fsSubtype, &subtype},
		{statmountMntOpts, h.mntOpts, &fsOpts},
	} {
		if *f.to, err = str(f.bit, f.off); err != nil {
			return Entry{}, err
		}
	}
	// As mountinfo shows it, e.g. "fuse.sshfs".
	if subtype != "" {
		e.FSType += "." + subtype
	}
	e.Options = mountOptions(h.mntAttr)
	e.ReadOnly = h.mntAttr&unix.MOUNT_ATTR_RDONLY != 0
	e.SuperOptions = superOptions(h.sbFlags, fsOpts)
	e.Major, e.Minor = int(h.sbDevMajor), int(h.sbDevMinor)
	return e, nil
}

// mountOptions spells the per-mount attributes as mountinfo's sixth field
// does, in its order.
func mountOptions(attr uint64) []string {
	opts := []string{"rw"}
	if attr&unix.MOUNT_ATTR_RDONLY != 0 {
		opts[0] = "ro"
	}
	atime := attr & unix.MOUNT_ATTR__ATIME
	for _, o := range []struct {
		on   bool
		name string
	}{
		{attr&unix.MOUNT_ATTR_NOSUID != 0, "nosuid"},
		{attr&unix.MOUNT_ATTR_NODEV != 0, "nodev"},
		{attr&unix.MOUNT_ATTR_NOEXEC != 0, "noexec"},
		{atime == unix.MOUNT_ATTR_NOATIME, "noatime"},
		{attr&unix.MOUNT_ATTR_NODIRATIME != 0, "nodiratime"},
		// strictatime has no word in mountinfo: neither noatime nor relatime.
		{atime == unix.MOUNT_ATTR_RELATIME, "relatime"},
		{attr&unix.MOUNT_ATTR_NOSYMFOLLOW != 0, "nosymfollow"},
		{attr&unix.MOUNT_ATTR_IDMAP != 0, "idmapped"},
	} {
		if o.on {
			opts = append(opts, o.name)
		}
	}
	return opts
}

// superOptions spells the superblock flags and the filesystem's own
// options as mountinfo's last field does: "ro" or "rw", the generic flags,
// then the filesystem's (security module options first, as there). SB_*
// flags have the values of the MS_* mount flags.
func superOptions(sbFlags uint32, fsOpts string) []string {
	opts := []string{"rw"}
	if sbFlags&unix.MS_RDONLY != 0 {
		opts[0] = "ro"
	}
	for _, o := range []struct {
		flag uint32
		name string
	}{
		{unix.MS_SYNCHRONOUS, "sync"}, {unix.MS_DIRSYNC, "dirsync"}, {unix.MS_LAZYTIME, "lazytime"},
	} {
		if sbFlags&o.flag != 0 {
			opts = append(opts, o.name)
		}
	}
	return append(opts, splitOptions(fsOpts)...)
}

// notMountPoint is Info's answer for a target with no mount on it.
func notMountPoint(target string) error {
	return abi.Errorf(abi.NotFound, "mount: %q is not a mount point", target)
}
