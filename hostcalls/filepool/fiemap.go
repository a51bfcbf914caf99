package filepool

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FS_IOC_FIEMAP and its flags, from linux/fiemap.h (golang.org/x/sys/unix
// does not carry them).
const (
	fsIocFiemap    = 0xc020660b // _IOWR('f', 11, struct fiemap)
	fiemapFlagSync = 0x1

	extentLast       = 0x1
	extentUnknown    = 0x2
	extentDelalloc   = 0x4
	extentEncoded    = 0x8
	extentEncrypted  = 0x80
	extentNotAligned = 0x100
	extentInline     = 0x200
	extentTail       = 0x400
	extentUnwritten  = 0x800

	// extentOpaque marks extents whose physical offset does not map
	// logical bytes one to one to disk bytes, or that are not on disk yet.
	extentOpaque = extentUnknown | extentDelalloc | extentEncoded | extentEncrypted |
		extentNotAligned | extentInline | extentTail | extentUnwritten

	fiemapBatch = 64
)

// struct fiemap and struct fiemap_extent.
type fiemapHeader struct {
	start, length                           uint64
	flags, mappedExtents, extentCount, resv uint32
}

type fiemapExtent struct {
	logical, physical, length uint64
	resv64                    [2]uint64
	flags                     uint32
	resv                      [3]uint32
}

type fiemapRequest struct {
	hdr fiemapHeader
	ext [fiemapBatch]fiemapExtent
}

// extent is one mapping of a file's logical bytes to the disk.
type extent struct {
	logical, physical, length int64
	flags                     uint32
}

// errNoFiemap means the filesystem cannot map extents; callers then read.
var errNoFiemap = errors.New("FIEMAP not supported")

// extents maps [start, start+length) of the file fd. The first call syncs
// the file's dirty pages (FIEMAP_FLAG_SYNC): without that, a write that is
// still in the page cache over a shared extent would be invisible here.
func extents(fd int, start, length int64) ([]extent, error) {
	var out []extent
	req := new(fiemapRequest)
	end := start + length
	flags := uint32(fiemapFlagSync)
	for start < end {
		req.hdr = fiemapHeader{start: uint64(start), length: uint64(end - start), flags: flags, extentCount: fiemapBatch}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(req)))
		if e != 0 {
			if e == unix.EOPNOTSUPP || e == unix.ENOTTY || e == unix.EINVAL {
				return nil, errNoFiemap
			}
			return nil, e
		}
		flags = 0
		n := int(req.hdr.mappedExtents)
		if n == 0 {
			break
		}
		for _, x := range req.ext[:n] {
			out = append(out, extent{int64(x.logical), int64(x.physical), int64(x.length), x.flags})
		}
		last := req.ext[n-1]
		if last.flags&extentLast != 0 {
			break
		}
		start = int64(last.logical + last.length)
	}
	return out, nil
}

// sameBlocks returns the logical ranges where a and b, the extent maps of
// two files in one filesystem sorted by logical offset, point at the very
// same disk bytes, so their contents are equal without reading them.
func sameBlocks(a, b []extent) []Range {
	var out []Range
	for i, j := 0, 0; i < len(a) && j < len(b); {
		x, y := a[i], b[j]
		lo := max(x.logical, y.logical)
		hi := min(x.logical+x.length, y.logical+y.length)
		if lo < hi && (x.flags|y.flags)&extentOpaque == 0 && x.physical != 0 &&
			x.physical-x.logical == y.physical-y.logical {
			if n := len(out); n > 0 && out[n-1].Offset+out[n-1].Length == lo {
				out[n-1].Length += hi - lo
			} else {
				out = append(out, Range{Offset: lo, Length: hi - lo})
			}
		}
		if x.logical+x.length <= y.logical+y.length {
			i++
		} else {
			j++
		}
	}
	return out
}
