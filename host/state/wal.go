package state

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/wasmcsi/wasmcsi/abi"
	"golang.org/x/sys/unix"
)

// The log is a sequence of segment files next to the bbolt file, named
// <file>.wal.<number> (six or more decimal digits, numbers increasing). A
// segment holds records back to back from offset 0; the rest of the file is
// zero. A record is:
//
//	length  u32 little-endian, the length of body (never 0)
//	crc     u32 little-endian, CRC-32C (Castagnoli) of body
//	body    uvarint seq | uvarint seq-first | change...
//
// seq numbers the write calls: each record's is one more than the one
// before it, across segments. first is the seq of the first record of the
// write (one write and one fdatasync) that carried this record to disk; it
// tells a torn last write apart from damage to earlier ones (see
// tailDamaged). A change is:
//
//	kind    byte: the bucket's index in allBuckets, | 0x80 for a delete
//	key     uvarint length | bytes
//	value   uvarint length | bytes (puts only)
//
// One record holds every change of one call, so a call is replayed whole or
// not at all.

const (
	recordHeader = 8
	// minRecord is the smallest record: a header, one-byte seq and first,
	// and a delete of a one-byte key.
	minRecord = recordHeader + 2 + 3
	// maxRecord bounds one call's record well below what the u32 length
	// can say.
	maxRecord  = 1 << 30
	deleteKind = 0x80
	// zeroBlock is the unit in which segments are zero-filled and checked
	// for zeros.
	zeroBlock = 64 << 10
)

// appendRecord appends the record of a call with sequence number seq,
// carried in a write that begins with record first, to dst.
func appendRecord(dst []byte, seq, first uint64, changes []change) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recordHeader)...)
	dst = binary.AppendUvarint(dst, seq)
	dst = binary.AppendUvarint(dst, seq-first)
	for _, c := range changes {
		kind := c.bucket
		if c.del {
			kind |= deleteKind
		}
		dst = append(dst, kind)
		dst = binary.AppendUvarint(dst, uint64(len(c.key)))
		dst = append(dst, c.key...)
		if !c.del {
			dst = binary.AppendUvarint(dst, uint64(len(c.val)))
			dst = append(dst, c.val...)
		}
	}
	body := dst[start+recordHeader:]
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(body, crcTable))
	return dst
}

// record is a decoded log record.
type record struct {
	seq, first uint64
	changes    []change // keys and values point into the segment's bytes
}

// parseRecord decodes the record at the start of b and returns its size.
func parseRecord(b []byte) (r record, size int, err error) {
	if len(b) < recordHeader {
		return r, 0, fmt.Errorf("record header cut off after %d bytes", len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	switch {
	case n == 0:
		return r, 0, fmt.Errorf("zero record length")
	case uint64(n) > uint64(len(b)-recordHeader):
		return r, 0, fmt.Errorf("record of %d bytes cut off after %d", n, len(b)-recordHeader)
	}
	body := b[recordHeader : recordHeader+int(n)]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[4:]) {
		return r, 0, fmt.Errorf("record checksum mismatch")
	}
	bad := func(what string) (record, int, error) {
		return record{}, 0, fmt.Errorf("malformed record: %s", what)
	}
	var m int
	if r.seq, m = binary.Uvarint(body); m <= 0 || r.seq == 0 {
		return bad("sequence number")
	}
	body = body[m:]
	delta, m := binary.Uvarint(body)
	if m <= 0 || delta >= r.seq {
		return bad("first sequence number of its write")
	}
	r.first = r.seq - delta
	body = body[m:]
	bytesField := func() ([]byte, bool) {
		l, m := binary.Uvarint(body)
		if m <= 0 || l > uint64(len(body)-m) {
			return nil, false
		}
		v := body[m : m+int(l)]
		body = body[m+int(l):]
		return v, true
	}
	for len(body) > 0 {
		c := change{bucket: body[0] &^ deleteKind, del: body[0]&deleteKind != 0}
		body = body[1:]
		if c.bucket == 0 || int(c.bucket) >= numBuckets {
			return bad(fmt.Sprintf("bucket %d", c.bucket))
		}
		var ok bool
		if c.key, ok = bytesField(); !ok || len(c.key) == 0 {
			return bad("key")
		}
		if !c.del {
			if c.val, ok = bytesField(); !ok {
				return bad("value")
			}
		}
		r.changes = append(r.changes, c)
	}
	if len(r.changes) == 0 {
		return bad("no changes")
	}
	return r, recordHeader + int(n), nil
}

// segment is one open log segment file.
type segment struct {
	num uint64
	f   *os.File
	// prepared is the size the file was zero-filled to: records written
	// below it overwrite blocks already allocated, so fdatasync has no
	// file metadata to commit. 0 for a file that grows as records are
	// appended. Measured on ext4 with one writer, a PutVolume took
	// 211-221 us in a prepared segment and 248-286 us appending.
	prepared int64
	end      int64 // offset after the last record given to the log, written or not
}

// segmentName returns the name of segment num of the state file at base.
func segmentName(base string, num uint64) string {
	return fmt.Sprintf("%s.wal.%06d", base, num)
}

// chunk is records of one segment that go to disk in one write.
type chunk struct {
	seg         *segment
	off         int64 // where buf goes in seg
	buf         []byte
	first, last uint64 // seq of the first and last record in buf
}

// failure is the error that stopped the log.
type failure struct{ err error }

// wal is the write side of the log: it numbers records, buffers them, and
// makes them durable with group commit: a writer that waits for its record
// and finds no write in flight writes everything buffered with one write
// and one fdatasync, and wakes every writer that covered; records buffered
// meanwhile go in the next one.
type wal struct {
	mu      sync.Mutex
	cond    sync.Cond // on mu: durable, syncing or failed changed
	seq     uint64    // last sequence number given out
	durable uint64    // every record up to this one is on disk
	written uint64    // every record up to this one is in the kernel (written, maybe not synced)
	syncing bool      // a write and fdatasync are in flight
	segs    []*segment
	cur     *chunk   // records for the last segment not yet being written
	queue   []*chunk // records for earlier segments, written before cur
	free    [][]byte // chunk buffers to reuse
	failed  atomic.Pointer[failure]
}

// newWAL starts a log whose records continue after seq in the segment seg.
func newWAL(seq uint64, seg *segment) *wal {
	w := &wal{seq: seq, durable: seq, segs: []*segment{seg}, cur: &chunk{seg: seg}}
	w.cond.L = &w.mu
	return w
}

// err returns the failure that stopped the log, or nil.
func (w *wal) err() error {
	if f := w.failed.Load(); f != nil {
		return f.err
	}
	return nil
}

// fail stops the log for good: after a failed write or fdatasync the kernel
// may have dropped dirty pages, so nothing after that point can be trusted
// to reach the disk. The first cause sticks.
func (w *wal) fail(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failLocked(cause)
}

func (w *wal) failLocked(cause error) {
	f := &failure{&abi.Error{Code: abi.Internal, Message: "state log failed; the store takes no more calls until the daemon restarts and replays the log: " + cause.Error()}}
	if w.failed.CompareAndSwap(nil, f) {
		w.cond.Broadcast()
	}
}

// append buffers the record of changes and returns its sequence number
// and size. The record is durable once wait(seq) returns nil.
func (w *wal) append(changes []change) (seq uint64, size int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.err(); err != nil {
		return 0, 0, err
	}
	seq = w.seq + 1
	c := w.cur
	if len(c.buf) == 0 {
		c.first = seq
	}
	n := len(c.buf)
	c.buf = appendRecord(c.buf, seq, c.first, changes)
	size = len(c.buf) - n
	if size > maxRecord {
		c.buf = c.buf[:n]
		return 0, 0, abi.Errorf(abi.InvalidArgument, "record of %d bytes is larger than %d", size, maxRecord)
	}
	c.last = seq
	c.seg.end += int64(size)
	w.seq = seq
	return seq, size, nil
}

// wait returns when record seq is on disk, or with the log's failure.
func (w *wal) wait(seq uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.durable < seq {
		if err := w.err(); err != nil {
			return err
		}
		if w.syncing {
			w.cond.Wait()
			continue
		}
		if len(w.queue) == 0 && len(w.cur.buf) == 0 {
			return abi.Errorf(abi.Internal, "state log: record %d is neither on disk nor buffered", seq)
		}
		w.flush()
	}
	return nil
}

// waitWritten returns when record seq is at least written to the segment
// file (in the kernel's page cache, so a killed process keeps it; a power
// cut may not), or with the log's failure. The write and sync run in a
// goroutine of their own (wait), so the sync goes on after this returns.
func (w *wal) waitWritten(seq uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	started := false
	for w.written < seq && w.durable < seq {
		if err := w.err(); err != nil {
			return err
		}
		if !w.syncing && !started {
			if len(w.queue) == 0 && len(w.cur.buf) == 0 {
				return abi.Errorf(abi.Internal, "state log: record %d is neither written nor buffered", seq)
			}
			started = true
			go func() { _ = w.wait(seq) }() // a failure stops the log, which the loop sees
		}
		w.cond.Wait()
	}
	return nil
}

// flush writes the oldest buffered chunk and syncs its segment, one
// segment at a time, so a segment is whole on disk before its successor
// holds anything. Called with mu held; mu is released while the disk works.
func (w *wal) flush() {
	var c *chunk
	if len(w.queue) > 0 {
		c, w.queue = w.queue[0], w.queue[1:]
	} else {
		c = w.cur
		w.cur = &chunk{seg: c.seg, off: c.off + int64(len(c.buf)), buf: w.buffer()}
	}
	w.syncing = true
	w.mu.Unlock()
	_, err := c.seg.f.WriteAt(c.buf, c.off)
	if err == nil {
		// In the kernel now: a kill of the process keeps it.
		w.mu.Lock()
		w.written = c.last
		w.cond.Broadcast()
		w.mu.Unlock()
		err = fdatasync(int(c.seg.f.Fd()))
	}
	w.mu.Lock()
	w.syncing = false
	if err != nil {
		w.failLocked(fmt.Errorf("write %s: %w", c.seg.f.Name(), err))
	} else {
		w.durable = c.last
	}
	if len(w.free) < 2 {
		w.free = append(w.free, c.buf[:0])
	}
	w.cond.Broadcast()
}

// fdatasync syncs a segment's data; tests slow it down.
var fdatasync = unix.Fdatasync

// buffer returns an empty chunk buffer.
func (w *wal) buffer() []byte {
	if n := len(w.free); n > 0 {
		b := w.free[n-1]
		w.free = w.free[:n-1]
		return b
	}
	return nil
}

// lastSeq returns the sequence number of the last record appended.
func (w *wal) lastSeq() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq
}

// current returns the number, prepared size and end of the segment that
// takes new records.
func (w *wal) current() (num uint64, prepared, end int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.segs[len(w.segs)-1]
	return s.num, s.prepared, s.end
}

// rotate makes next the segment that takes new records; records already
// buffered still go to their own segment.
func (w *wal) rotate(next *segment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.cur.buf) > 0 {
		w.queue = append(w.queue, w.cur)
	}
	w.cur = &chunk{seg: next, buf: w.buffer()}
	w.segs = append(w.segs, next)
}

// release removes from the log and returns the segments numbered below
// keep. Their records must be durable and checkpointed.
func (w *wal) release(keep uint64) []*segment {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*segment
	for len(w.segs) > 0 && w.segs[0].num < keep {
		out = append(out, w.segs[0])
		w.segs = w.segs[1:]
	}
	return out
}

// close closes the files of the segments still in the log.
func (w *wal) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.segs {
		s.f.Close()
	}
	w.segs = nil
}

// listSegments returns the numbers of the log segment files of the state
// file at base, in order.
func listSegments(base string) ([]uint64, error) {
	entries, err := os.ReadDir(filepath.Dir(base))
	if err != nil {
		return nil, err
	}
	prefix := filepath.Base(base) + ".wal."
	var nums []uint64
	for _, e := range entries {
		digits, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || len(digits) < 6 {
			continue
		}
		n, err := strconv.ParseUint(digits, 10, 64)
		if err != nil {
			continue
		}
		nums = append(nums, n)
	}
	slices.Sort(nums)
	return nums, nil
}

// segmentData is the content of one segment file read for replay.
type segmentData struct {
	name string
	data []byte
}

// readLog returns, in order, the records of segs (in number order) newer
// than the checkpoint ckpt. The log ends where the last segment that holds
// anything stops holding valid records: a torn or missing record there is
// the write a crash interrupted, which no caller was told had succeeded. A
// bad record anywhere else, a record out of sequence, or a gap after the
// checkpoint is DataLoss: records that were acknowledged are gone.
func readLog(segs []segmentData, ckpt uint64) ([]record, error) {
	last := -1
	for i, s := range segs {
		if !allZero(s.data) {
			last = i
		}
	}
	var out []record
	var prev uint64 // seq of the last record read, 0 before the first
	for i, s := range segs[:last+1] {
		for off := 0; off < len(s.data) && !allZero(s.data[off:]); {
			r, n, err := parseRecord(s.data[off:])
			if err != nil {
				if i == last && !tailDamaged(s.data, off, prev, ckpt) {
					return out, nil
				}
				return nil, dataLoss(s.name, off, err)
			}
			switch {
			case prev == 0 && r.seq > ckpt+1:
				return nil, dataLoss(s.name, off, fmt.Errorf("log resumes at record %d after checkpoint %d", r.seq, ckpt))
			case prev != 0 && r.seq != prev+1:
				return nil, dataLoss(s.name, off, fmt.Errorf("record %d follows record %d", r.seq, prev))
			}
			prev = r.seq
			if r.seq > ckpt {
				out = append(out, r)
			}
			off += n
		}
	}
	return out, nil
}

// tailDamaged reports whether a bad record at off of the last segment lies
// before a record that a later write put there: then the bad record was
// already on disk when that write began, and its damage lost acknowledged
// data. A torn last write leaves only its own records behind it (first no
// later than the bad record's seq), and zeros. The bad record's length
// cannot be trusted, so every offset after it is tried; the sequence
// number window and the checksum keep that cheap and exact.
func tailDamaged(data []byte, off int, prev, ckpt uint64) bool {
	// expect is the bad record's seq, or an upper bound of it when no
	// record came before it.
	expect := prev + 1
	if prev == 0 {
		expect = ckpt + 1
	}
	for p := off + 1; p+minRecord <= len(data); p++ {
		n := binary.LittleEndian.Uint32(data[p:])
		if n < minRecord-recordHeader || uint64(n) > uint64(len(data)-p-recordHeader) {
			continue
		}
		// Records between the bad one and p take at least minRecord
		// bytes each, which bounds the seq a record at p can have.
		seq, _ := binary.Uvarint(data[p+recordHeader:])
		if seq < prev+1 || seq > expect+1+uint64((p-off)/minRecord) {
			continue
		}
		r, size, err := parseRecord(data[p:])
		if err != nil {
			continue
		}
		if r.first > expect {
			return true
		}
		p += size - 1
	}
	return false
}

// dataLoss is the error of a log that lost acknowledged records.
func dataLoss(name string, off int, err error) error {
	return &abi.Error{Code: abi.DataLoss, Message: fmt.Sprintf("state log %s at offset %d: %v", name, off, err)}
}

// zeros is a block of zero bytes to compare and write.
var zeros [zeroBlock]byte

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), zeroBlock)
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
