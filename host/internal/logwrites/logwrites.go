// Package logwrites reads the log a Linux dm-log-writes device keeps of
// every write to the device it sits on, and replays a prefix of that log
// onto another device or image file: the state a power cut at that point
// would have left on the disk. The power-loss tier (host/faulttest) replays
// the log of a daemon's state folder and pools to each flush and FUA entry
// and starts the daemon on what it finds.
//
// The format is the kernel's (drivers/md/dm-log-writes.c, documented in
// Documentation/admin-guide/device-mapper/log-writes.rst): a super block at
// sector 0, then one entry after another, each a header block of the
// device's sector size (a log_write_entry, and a mark's name) followed by
// the data written, nr_sectors blocks of that size. The kernel logs a write
// only once a flush has covered it, so the log is in the order data became
// durable, and every prefix that ends at a flush or a FUA write is a state
// the disk could have been left in.
//
// It only reads the log and writes the image it is given; it is for tests
// and must never be imported by the daemon.
package logwrites

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Magic and Version are those of the kernel's struct log_write_super.
const (
	Magic   = 0x6a736677736872
	Version = 1
)

// Flags of an entry, as the kernel sets them.
type Flags uint64

const (
	Flush    Flags = 1 << 0 // a flush: everything logged before it is durable
	FUA      Flags = 1 << 1 // a write that bypassed the cache
	Discard  Flags = 1 << 2 // a discard of the range; no data follows
	Mark     Flags = 1 << 3 // a mark set with dmsetup message ... mark NAME
	Metadata Flags = 1 << 4 // the file system said the write was metadata
)

func (f Flags) String() string {
	var parts []string
	for _, n := range []struct {
		f    Flags
		name string
	}{{Flush, "flush"}, {FUA, "fua"}, {Discard, "discard"}, {Mark, "mark"}, {Metadata, "metadata"}} {
		if f&n.f != 0 {
			parts = append(parts, n.name)
		}
	}
	if len(parts) == 0 {
		return "write"
	}
	return strings.Join(parts, "|")
}

// superSize and entrySize are the sizes of the kernel's log_write_super
// (magic, version, nr_entries: le64; sectorsize: le32) and log_write_entry
// (sector, nr_sectors, flags, data_len: le64).
const (
	superSize = 8 + 8 + 8 + 4
	entrySize = 4 * 8
)

// Entry is one logged write, flush, discard or mark.
type Entry struct {
	Index     int    // its position in the log, from 0
	Sector    uint64 // first sector written, in SectorSize units
	NrSectors uint64 // sectors written (or discarded)
	Flags     Flags
	Mark      string // a mark's name
	data      int64  // offset of the written data in the log
}

// Durable reports whether the disk's state right after this entry is one a
// power cut could leave: a flush or a FUA write has just completed.
func (e Entry) Durable() bool { return e.Flags&(Flush|FUA) != 0 }

// Log is a parsed log.
type Log struct {
	r          io.ReaderAt
	SectorSize int64
	Entries    []Entry
}

// Open reads the super block and every entry header of the log in r. The
// super counts the entries up to the last FUA write or mark; entries the
// device logged after it (it was removed without a last mark) are read
// too, as far as they are whole.
func Open(r io.ReaderAt) (*Log, error) {
	var sb [superSize]byte
	if _, err := r.ReadAt(sb[:], 0); err != nil {
		return nil, fmt.Errorf("read the log's super block: %w", err)
	}
	le := binary.LittleEndian
	if m := le.Uint64(sb[0:]); m != Magic {
		return nil, fmt.Errorf("not a dm-log-writes log: magic %#x, want %#x", m, uint64(Magic))
	}
	if v := le.Uint64(sb[8:]); v != Version {
		return nil, fmt.Errorf("dm-log-writes log version %d, want %d", v, Version)
	}
	n := le.Uint64(sb[16:])
	ss := int64(le.Uint32(sb[24:]))
	if ss < 512 || ss&(ss-1) != 0 || ss > 64<<10 {
		return nil, fmt.Errorf("dm-log-writes log: sector size %d", ss)
	}
	l := &Log{r: r, SectorSize: ss}
	hdr := make([]byte, ss)
	// The kernel places the first entry at the device's second sector of
	// its own size and each next one right after the previous one's data.
	off := ss
	for i := 0; ; i++ {
		if _, err := r.ReadAt(hdr, off); err != nil {
			if uint64(i) < n {
				return nil, fmt.Errorf("entry %d of %d at byte %d: %w", i, n, off, err)
			}
			break
		}
		e := Entry{Index: i, Sector: le.Uint64(hdr[0:]), NrSectors: le.Uint64(hdr[8:]), Flags: Flags(le.Uint64(hdr[16:]))}
		dataLen := le.Uint64(hdr[24:])
		if uint64(i) >= n && !plausible(e, dataLen, ss) {
			break // past the counted entries: stale bytes of an older log, or zeros
		}
		if e.Flags&Mark != 0 {
			if dataLen > uint64(ss-entrySize) {
				return nil, fmt.Errorf("entry %d: mark of %d bytes", i, dataLen)
			}
			e.Mark = string(hdr[entrySize : entrySize+dataLen])
		}
		off += ss
		e.data = off
		if e.Flags&(Discard|Mark) == 0 {
			off += int64(e.NrSectors) * ss
		}
		l.Entries = append(l.Entries, e)
	}
	if uint64(len(l.Entries)) < n {
		return nil, fmt.Errorf("log holds %d entries, its super counts %d", len(l.Entries), n)
	}
	return l, nil
}

// plausible tells an entry the device wrote after its last super update
// from whatever the log device held before: only known flags, a mark with
// a name and no sectors, anything else without inline data (the kernel
// sets data_len for marks only).
func plausible(e Entry, dataLen uint64, ss int64) bool {
	if e.Flags&^(Flush|FUA|Discard|Mark|Metadata) != 0 {
		return false
	}
	switch {
	case e.Flags&Mark != 0:
		return e.NrSectors == 0 && dataLen > 0 && dataLen <= uint64(ss-entrySize)
	case e.Flags&Discard != 0:
		return e.NrSectors > 0 && dataLen == 0
	case e.NrSectors == 0:
		return e.Flags&Flush != 0 && dataLen == 0
	default:
		return dataLen == 0
	}
}

// DurablePoints are the indexes of the entries after which the disk's
// state is one a power cut could leave (see Entry.Durable).
func (l *Log) DurablePoints() []int {
	var out []int
	for _, e := range l.Entries {
		if e.Durable() {
			out = append(out, e.Index)
		}
	}
	return out
}

// FindMark returns the index of the first mark named name at or after
// entry from, or -1.
func (l *Log) FindMark(name string, from int) int {
	for i := max(from, 0); i < len(l.Entries); i++ {
		if e := l.Entries[i]; e.Flags&Mark != 0 && e.Mark == name {
			return i
		}
	}
	return -1
}

// Replay applies the entries [from, to) to dst, which must hold the state
// after entry from-1 (from 0: the device's content when the log began,
// zeros for a log that starts with mkfs). A discard is replayed as a hole
// when dst is a regular file and as zeros otherwise.
func (l *Log) Replay(dst io.WriterAt, from, to int) error {
	if from < 0 || to > len(l.Entries) || from > to {
		return fmt.Errorf("replay entries [%d, %d) of %d", from, to, len(l.Entries))
	}
	var buf []byte
	for _, e := range l.Entries[from:to] {
		if e.Flags&Mark != 0 || e.NrSectors == 0 {
			continue
		}
		off, n := int64(e.Sector)*l.SectorSize, int64(e.NrSectors)*l.SectorSize
		if e.Flags&Discard != 0 {
			if err := zero(dst, off, n); err != nil {
				return fmt.Errorf("entry %d: discard %d bytes at %d: %w", e.Index, n, off, err)
			}
			continue
		}
		for done := int64(0); done < n; {
			chunk := min(n-done, 1<<20)
			if int64(cap(buf)) < chunk {
				buf = make([]byte, chunk)
			}
			b := buf[:chunk]
			if _, err := l.r.ReadAt(b, e.data+done); err != nil {
				return fmt.Errorf("entry %d: read its data: %w", e.Index, err)
			}
			if _, err := dst.WriteAt(b, off+done); err != nil {
				return fmt.Errorf("entry %d: write %d bytes at %d: %w", e.Index, len(b), off+done, err)
			}
			done += chunk
		}
	}
	return nil
}

// zero makes [off, off+n) of dst read as zeros.
func zero(dst io.WriterAt, off, n int64) error {
	if f, ok := dst.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
			if err == nil || !errors.Is(err, unix.EOPNOTSUPP) {
				return err
			}
		}
	}
	z := make([]byte, min(n, 1<<20))
	for done := int64(0); done < n; {
		chunk := min(n-done, int64(len(z)))
		if _, err := dst.WriteAt(z[:chunk], off+done); err != nil {
			return err
		}
		done += chunk
	}
	return nil
}
