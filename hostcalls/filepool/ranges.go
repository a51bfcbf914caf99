package filepool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

const (
	// maxBlockSize bounds ChangedRanges' block size (and so its buffers).
	maxBlockSize = 64 << 20
	// readChunk is how much ChangedRanges reads from each file at once.
	readChunk = 1 << 20
)

// Range is a byte range of a volume file.
type Range struct {
	Offset int64
	Length int64
}

// End returns the offset just past r.
func (r Range) End() int64 { return r.Offset + r.Length }

// AllocatedRanges lists the data segments of the volume file name from
// fromOffset on (SEEK_DATA/SEEK_HOLE), at most maxRanges of them. A segment that
// fromOffset cuts starts at fromOffset. next is the offset to continue from,
// or 0 when the listing is complete. Segments have the filesystem's
// allocation granularity; a filesystem without hole support reports the
// whole file as one segment.
func (p *Pool) AllocatedRanges(ctx context.Context, name string, fromOffset int64, maxRanges int) (ranges []Range, next int64, err error) {
	if err := checkPaging(fromOffset, maxRanges); err != nil {
		return nil, 0, fmt.Errorf("allocated ranges of %s: %w", name, err)
	}
	if err := checkName(name); err != nil {
		return nil, 0, fmt.Errorf("allocated ranges of %s: %w", name, err)
	}
	f, err := p.openRegular(name, unix.O_RDONLY)
	if err != nil {
		return nil, 0, fmt.Errorf("allocated ranges of %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("allocated ranges of %s: %w", name, err)
	}
	size := fi.Size()
	for off := fromOffset; off < size; {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		data := dataAt(f, off, size)
		if data >= size {
			break
		}
		if len(ranges) == maxRanges {
			return ranges, data, nil
		}
		hole := holeAt(f, data, size)
		ranges = append(ranges, Range{Offset: data, Length: hole - data})
		off = hole
	}
	return ranges, 0, nil
}

// ChangedRanges lists the ranges, in blocks of blockSize bytes, whose
// contents differ between the volume files base and target (a snapshot and
// a later snapshot or volume), from fromOffset on, at most maxRanges ranges
// of adjacent changed blocks. Bytes past a file's end and holes read as zeros,
// so a block that is a hole in one file and zeros in the other is
// unchanged. Only data segments of either file are read; blocks whose
// extents the two files share on disk (a reflink clone not written since)
// are skipped without reading. fromOffset must be a multiple of blockSize.
// next is the offset to continue from, or 0 when the listing is complete.
func (p *Pool) ChangedRanges(ctx context.Context, base, target string, fromOffset int64, maxRanges int, blockSize int64) (ranges []Range, next int64, err error) {
	ranges, next, _, err = p.changedRanges(ctx, base, target, fromOffset, maxRanges, blockSize)
	return ranges, next, err
}

// changedRanges is ChangedRanges that also says how many bytes it read from
// each file, so tests can see shared extents being skipped.
func (p *Pool) changedRanges(ctx context.Context, base, target string, fromOffset int64, maxRanges int, blockSize int64) (ranges []Range, next, read int64, err error) {
	wrap := func(err error) error { return fmt.Errorf("changed ranges from %s to %s: %w", base, target, err) }
	if err := checkPaging(fromOffset, maxRanges); err != nil {
		return nil, 0, 0, wrap(err)
	}
	if blockSize <= 0 || blockSize > maxBlockSize || fromOffset%blockSize != 0 {
		return nil, 0, 0, wrap(abi.Errorf(abi.InvalidArgument,
			"block size must be in (0, 64 MiB] and divide the start offset"))
	}
	if err := checkName(base); err != nil {
		return nil, 0, 0, wrap(err)
	}
	if err := checkName(target); err != nil {
		return nil, 0, 0, wrap(err)
	}
	bf, err := p.openRegular(base, unix.O_RDONLY)
	if err != nil {
		return nil, 0, 0, wrap(err)
	}
	defer bf.Close()
	tf, err := p.openRegular(target, unix.O_RDONLY)
	if err != nil {
		return nil, 0, 0, wrap(err)
	}
	defer tf.Close()
	bi, err := bf.Stat()
	if err != nil {
		return nil, 0, 0, wrap(err)
	}
	ti, err := tf.Stat()
	if err != nil {
		return nil, 0, 0, wrap(err)
	}
	chunk := max(blockSize, readChunk/blockSize*blockSize)
	c := &comparer{
		base: bf, target: tf,
		bs:    blockSize,
		size:  max(bi.Size(), ti.Size()),
		limit: maxRanges,
		bufB:  make([]byte, chunk),
		bufT:  make([]byte, chunk),
	}
	c.end = ceil(c.size, blockSize)
	ranges, next, err = c.run(ctx, fromOffset)
	if err != nil {
		return nil, 0, 0, wrap(err)
	}
	return ranges, next, c.read, nil
}

// comparer walks two files block by block over the union of their data.
type comparer struct {
	base, target *os.File
	bs           int64
	size, end    int64 // the larger file size, and that rounded up to bs
	limit        int
	out          []Range
	bufB, bufT   []byte
	noFiemap     bool
	read         int64 // bytes read from each file
}

// run returns the changed ranges from cur on and the offset to go on from.
func (c *comparer) run(ctx context.Context, cur int64) ([]Range, int64, error) {
	for cur < c.end {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		// The next segment where either file has data, cut where either
		// file switches between data and hole.
		db, dt := dataAt(c.base, cur, c.end), dataAt(c.target, cur, c.end)
		s := min(db, dt)
		if s >= c.end {
			break
		}
		e := c.end
		if db == s {
			e = min(e, holeAt(c.base, s, c.end))
		} else {
			e = min(e, db)
		}
		if dt == s {
			e = min(e, holeAt(c.target, s, c.end))
		} else {
			e = min(e, dt)
		}
		lo, hi := max(cur, s/c.bs*c.bs), min(ceil(e, c.bs), c.end)
		var same []Range
		if db == s && dt == s {
			var err error
			if same, err = c.shared(lo, hi); err != nil {
				return nil, 0, err
			}
		}
		if next, stop, err := c.compare(ctx, lo, hi, same); err != nil || stop {
			return c.out, next, err
		}
		cur = hi
	}
	return c.out, 0, nil
}

// shared returns the ranges in [lo, hi) where both files map the same disk
// bytes, or none when the filesystem cannot say.
func (c *comparer) shared(lo, hi int64) ([]Range, error) {
	if c.noFiemap {
		return nil, nil
	}
	a, err := extents(int(c.base.Fd()), lo, hi-lo)
	if err == nil {
		var b []extent
		if b, err = extents(int(c.target.Fd()), lo, hi-lo); err == nil {
			return sameBlocks(a, b), nil
		}
	}
	if errors.Is(err, errNoFiemap) {
		c.noFiemap = true
		return nil, nil
	}
	return nil, fmt.Errorf("FIEMAP: %w", err)
}

// compare compares the blocks of [lo, hi), skipping those inside same, and
// records changed ones. stop says the result is full; next is then the
// first changed block left out.
func (c *comparer) compare(ctx context.Context, lo, hi int64, same []Range) (next int64, stop bool, err error) {
	for off := lo; off < hi; {
		for len(same) > 0 && same[0].End() < off+c.bs {
			same = same[1:]
		}
		if len(same) > 0 && same[0].Offset <= off {
			// Skip every whole block inside the shared range.
			off = max(off+c.bs, same[0].End()/c.bs*c.bs)
			continue
		}
		end := min(off+int64(len(c.bufB)), hi)
		if len(same) > 0 {
			if s := ceil(same[0].Offset, c.bs); s > off && s < end {
				end = s
			}
		}
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		n := end - off
		c.read += n
		if err := readFull(c.base, c.bufB[:n], off); err != nil {
			return 0, false, err
		}
		if err := readFull(c.target, c.bufT[:n], off); err != nil {
			return 0, false, err
		}
		for b := int64(0); b < n; b += c.bs {
			if bytes.Equal(c.bufB[b:b+c.bs], c.bufT[b:b+c.bs]) {
				continue
			}
			if !c.add(off + b) {
				return off + b, true, nil
			}
		}
		off = end
	}
	return 0, false, nil
}

// add records the changed block at off, joining it to the last range when
// adjacent. It reports false when that would need a range beyond the limit.
func (c *comparer) add(off int64) bool {
	length := min(c.bs, c.size-off)
	if n := len(c.out); n > 0 && c.out[n-1].End() == off {
		c.out[n-1].Length += length
		return true
	}
	if len(c.out) == c.limit {
		return false
	}
	c.out = append(c.out, Range{Offset: off, Length: length})
	return true
}

// readFull reads len(b) bytes at off, zero-filling what lies past the end.
func readFull(f *os.File, b []byte, off int64) error {
	n, err := f.ReadAt(b, off)
	if errors.Is(err, io.EOF) {
		clear(b[n:])
		return nil
	}
	return err
}

// dataAt returns the first data offset at or after off, or end when there
// is none before end.
func dataAt(f *os.File, off, end int64) int64 {
	d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if err != nil {
		// ENXIO: only a hole (or the end of file) after off. Any other
		// error cannot happen on a regular file opened for reading.
		return end
	}
	return min(d, end)
}

// holeAt returns the first hole offset at or after off (the file's end
// counts as one), at most end.
func holeAt(f *os.File, off, end int64) int64 {
	h, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
	if err != nil {
		return end
	}
	return min(h, end)
}

func checkPaging(fromOffset int64, maxRanges int) error {
	if fromOffset < 0 {
		return abi.Errorf(abi.InvalidArgument, "negative start offset")
	}
	if maxRanges <= 0 {
		return abi.Errorf(abi.InvalidArgument, "the range limit must be positive")
	}
	return nil
}

func ceil(v, unit int64) int64 { return (v + unit - 1) / unit * unit }
