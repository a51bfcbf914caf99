package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// options are the checkpoint thresholds and the segment size. Tests shrink
// or stretch them; Open uses defaultOptions.
type options struct {
	// A checkpoint starts when the active layer holds maxEntries keys, or
	// the log grew by maxBytes since the last one, or maxDelay after the
	// first write the last one did not cover. Writers wait (back-pressure)
	// only when the active layer is eight times over maxEntries or
	// maxBytes, which a checkpoint in progress can cause.
	maxEntries int
	maxBytes   int64
	maxDelay   time.Duration
	// segmentBytes is the size a new segment is zero-filled to before it
	// takes records.
	segmentBytes int64
}

// defaultOptions bound the overlay to about a thousand keys and a replay
// after a crash to about a second of writes.
func defaultOptions() options {
	return options{maxEntries: 1024, maxBytes: 2 << 20, maxDelay: time.Second, segmentBytes: 4 << 20}
}

// overloaded reports whether writers must wait for a checkpoint to catch up.
func (o *options) overloaded(entries int, bytes int64) bool {
	return entries >= 8*o.maxEntries || bytes >= 8*o.maxBytes
}

// Meta keys of the checkpoint: every record up to keyLogSeq is in bbolt,
// and records after it are in segments numbered keyLogSegment or higher.
var (
	keyLogSeq     = []byte("log_seq")
	keyLogSegment = []byte("log_segment")
)

// spareName is the zero-filled file that becomes the next segment;
// spareTemp is that file while it is being filled.
func spareName(base string) string { return base + ".wal.spare" }
func spareTemp(base string) string { return base + ".wal.tmp" }

// checkpointLoop runs checkpoints when they are due and keeps a spare
// segment ready, until stop is closed.
func (s *Store) checkpointLoop() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		s.ckptMu.Lock()
		if !s.spare {
			// A failure is no reason to stop: without a spare the log
			// appends to its segment, which costs a metadata commit
			// per sync, and the next round tries again.
			_ = s.prepareSpare(nil)
		}
		due, wait := s.due()
		var err error
		if due {
			err = s.checkpointLocked(false)
		}
		s.ckptMu.Unlock()
		if err != nil {
			return // the store has failed
		}
		if due {
			continue
		}
		if wait > 0 {
			timer.Reset(wait)
		}
		select {
		case <-s.stop:
			return
		case <-s.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// due reports whether a checkpoint should run now, or else how long until
// the oldest pending write makes one due (0: nothing pending). ckptMu held.
func (s *Store) due() (bool, time.Duration) {
	_, prepared, end := s.log.current()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.log.err() != nil {
		return false, 0
	}
	// Move to the spare when the segment appends or is filling up.
	if s.spare && end > 0 && (prepared == 0 || end >= s.opts.maxBytes) {
		return true, 0
	}
	entries := s.layers.Load().active.entries
	if entries == 0 {
		return false, 0
	}
	age := time.Since(s.firstPending)
	if entries >= s.opts.maxEntries || s.pendingBytes >= s.opts.maxBytes || age >= s.opts.maxDelay {
		return true, 0
	}
	return false, s.opts.maxDelay - age
}

// kickCheckpoint wakes the checkpoint loop without waiting for it.
func (s *Store) kickCheckpoint() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// wakeWriters wakes writers waiting for room, so they see a failure or Close.
func (s *Store) wakeWriters() {
	s.mu.Lock()
	s.room.Broadcast()
	s.mu.Unlock()
}

// checkpointAll writes every change made so far into bbolt.
func (s *Store) checkpointAll() error {
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil
	}
	if err := s.log.err(); err != nil {
		return err
	}
	return s.checkpointLocked(false)
}

// checkpointLocked moves the active layer into bbolt. ckptMu held. An
// error stops the store: a frozen layer that did not reach bbolt must not be
// replaced by the next one, and the log still holds it for the next Open.
func (s *Store) checkpointLocked(final bool) error {
	err := s.moveLayer(final)
	if err != nil {
		s.log.fail(err)
		s.wakeWriters()
	}
	return err
}

// moveLayer is the work of a checkpoint.
//
// Under mu it freezes the active layer (a new, empty one takes writes) at a
// boundary sequence number, and moves the log to the spare segment if one
// is ready, so that the older segments hold nothing after the boundary.
// Without mu it waits until the log is durable up to the boundary, writes
// the frozen layer and the boundary into bbolt in one fsynced transaction,
// then drops the frozen layer and the segments the transaction covers.
// Writers never wait for it, except for the moments it holds mu. With
// final (Close), every segment is covered and nothing may be written after.
func (s *Store) moveLayer(final bool) error {
	cur, _, end := s.log.current()
	var next *segment
	if !final && s.spare && end > 0 {
		var err error
		if next, err = s.useSpare(cur + 1); err != nil {
			return err
		}
	}

	s.mu.Lock()
	before := s.layers.Load()
	if before.active.entries == 0 && next == nil && !final {
		s.mu.Unlock()
		return nil
	}
	boundary := s.log.lastSeq()
	keep := cur // first segment that may hold records after boundary
	switch {
	case final:
		keep = cur + 1
	case next != nil:
		s.log.rotate(next)
		keep = next.num
	}
	frozen := before.active
	s.publishLayers(&layers{active: &layer{}, frozen: frozen})
	s.firstPending, s.pendingBytes = time.Time{}, 0
	s.room.Broadcast()
	s.mu.Unlock()

	if err := s.log.wait(boundary); err != nil {
		return err
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for b := 1; b < numBuckets; b++ {
			bk := tx.Bucket(allBuckets[b])
			var it treeIter
			for it.seek(frozen.roots[b], nil); it.node() != nil; it.next() {
				n := it.node()
				var err error
				if n.del {
					err = bk.Delete(n.key)
				} else {
					err = bk.Put(n.key, n.val)
				}
				if err != nil {
					return fmt.Errorf("%s %q: %w", allBuckets[b], n.key, err)
				}
			}
		}
		return putCheckpoint(tx, boundary, keep)
	})
	if err != nil {
		return fmt.Errorf("checkpoint state into %s: %w", s.db.Path(), err)
	}

	s.mu.Lock()
	s.publishLayers(&layers{active: s.layers.Load().active})
	s.mu.Unlock()
	return s.dropSegments(s.log.release(keep))
}

// publishLayers makes l what reads see. mu held. rw keeps it from changing
// between a reader loading the layers and opening its bbolt transaction.
func (s *Store) publishLayers(l *layers) {
	s.rw.Lock()
	s.layers.Store(l)
	s.rw.Unlock()
}

// putCheckpoint records in meta that records up to seq are in bbolt and
// later ones in segments numbered keep or higher.
func putCheckpoint(tx *bolt.Tx, seq, keep uint64) error {
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(keyLogSeq, binary.AppendUvarint(nil, seq)); err != nil {
		return err
	}
	return meta.Put(keyLogSegment, binary.AppendUvarint(nil, keep))
}

// getCheckpoint reads what putCheckpoint wrote; a new file has checkpoint
// 0 and keeps every segment.
func getCheckpoint(db *bolt.DB) (seq, keep uint64, err error) {
	err = db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		for _, f := range []struct {
			key []byte
			v   *uint64
		}{{keyLogSeq, &seq}, {keyLogSegment, &keep}} {
			raw := meta.Get(f.key)
			if raw == nil {
				continue
			}
			v, n := binary.Uvarint(raw)
			if n <= 0 || n != len(raw) {
				return abi.Errorf(abi.DataLoss, "corrupt %s in meta", f.key)
			}
			*f.v = v
		}
		return nil
	})
	return seq, keep, err
}

// useSpare renames the spare to segment num and makes the name durable, so
// that records synced into it are found after a power loss. ckptMu held.
func (s *Store) useSpare(num uint64) (*segment, error) {
	name := segmentName(s.path, num)
	if err := os.Rename(spareName(s.path), name); err != nil {
		return nil, fmt.Errorf("log segment: %w", err)
	}
	s.spare = false
	if err := syncDir(s.path); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("log segment: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("log segment: %w", err)
	}
	return &segment{num: num, f: f, prepared: info.Size()}, nil
}

// dropSegments removes checkpointed segments, keeping the newest as the
// spare when none is ready: only the part it used needs zeroing again.
// ckptMu held.
func (s *Store) dropSegments(segs []*segment) error {
	if len(segs) == 0 {
		return nil
	}
	for i, seg := range segs {
		if i == len(segs)-1 && !s.spare && s.prepareSpare(seg) == nil {
			continue
		}
		seg.f.Close()
		if err := os.Remove(seg.f.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove log segment: %w", err)
		}
	}
	return syncDir(s.path)
}

// prepareSpare makes a zero-filled file of at least segmentBytes the spare:
// from (a checkpointed segment, of which only the used part needs zeroing)
// or, with from nil, a new file. It takes the spare's name only once its
// zeros are on disk, so the spare never holds anything but zeros. It closes
// from's file. ckptMu held.
func (s *Store) prepareSpare(from *segment) error {
	var f *os.File
	var used int64
	if from != nil {
		f, used = from.f, from.end
	} else {
		var err error
		if f, err = os.OpenFile(spareTemp(s.path), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
			return fmt.Errorf("log spare: %w", err)
		}
	}
	defer f.Close()
	err := fillZeros(f, used, s.opts.segmentBytes)
	if err == nil {
		err = os.Rename(f.Name(), spareName(s.path))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("log spare: %w", err)
	}
	s.spare = true
	return nil
}

// fillZeros writes zeros over the first used bytes of f and from its end up
// to size, and syncs it.
func fillZeros(f *os.File, used, size int64) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	write := func(from, to int64) error {
		for off := from; off < to; off += zeroBlock {
			if _, err := f.WriteAt(zeros[:min(zeroBlock, to-off)], off); err != nil {
				return err
			}
		}
		return nil
	}
	if err := write(0, min(used, info.Size())); err != nil {
		return err
	}
	if err := write(info.Size(), size); err != nil {
		return err
	}
	return unix.Fdatasync(int(f.Fd()))
}

// syncDir makes the entries of the folder of path durable.
func syncDir(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("sync state folder: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync state folder %s: %w", d.Name(), err)
	}
	return nil
}

// recoverLog replays into bbolt, in one transaction, every record of the
// log after the checkpoint, records there the new checkpoint, and removes
// the segments. It returns the last sequence number and the number of the
// segment to continue with.
func recoverLog(db *bolt.DB, base string) (seq, next uint64, err error) {
	ckpt, keep, err := getCheckpoint(db)
	if err != nil {
		return 0, 0, err
	}
	nums, err := listSegments(base)
	if err != nil {
		return 0, 0, fmt.Errorf("list log segments: %w", err)
	}
	var segs []segmentData
	next = max(keep, 1)
	for _, num := range nums {
		next = max(next, num+1)
		if num < keep {
			continue // left behind by a checkpoint that covered it
		}
		name := segmentName(base, num)
		data, err := os.ReadFile(name)
		if err != nil {
			return 0, 0, fmt.Errorf("read log segment: %w", err)
		}
		segs = append(segs, segmentData{name: name, data: data})
	}
	records, err := readLog(segs, ckpt)
	if err != nil {
		return 0, 0, err
	}
	seq = ckpt
	if len(records) > 0 {
		seq = records[len(records)-1].seq
	}
	if len(records) > 0 || next != keep {
		err := db.Update(func(tx *bolt.Tx) error {
			for _, r := range records {
				for _, c := range r.changes {
					b := tx.Bucket(allBuckets[c.bucket])
					var err error
					if c.del {
						err = b.Delete(c.key)
					} else {
						err = b.Put(c.key, c.val)
					}
					if err != nil {
						return fmt.Errorf("replay record %d: %w", r.seq, err)
					}
				}
			}
			return putCheckpoint(tx, seq, next)
		})
		if err != nil {
			return 0, 0, fmt.Errorf("replay state log: %w", err)
		}
	}
	for _, num := range nums {
		if err := os.Remove(segmentName(base, num)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, 0, fmt.Errorf("remove log segment: %w", err)
		}
	}
	if err := os.Remove(spareTemp(base)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, 0, fmt.Errorf("remove log spare: %w", err)
	}
	return seq, next, syncDir(base)
}

// startSegment creates segment num to take the first records after Open:
// the spare left by the last run if there is one, else a new, appending file.
func startSegment(base string, num uint64) (*segment, error) {
	name := segmentName(base, num)
	var prepared int64
	switch info, err := os.Stat(spareName(base)); {
	case err == nil:
		if err := os.Rename(spareName(base), name); err != nil {
			return nil, fmt.Errorf("log segment: %w", err)
		}
		prepared = info.Size()
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("log spare: %w", err)
	}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("log segment: %w", err)
	}
	if err := syncDir(base); err != nil {
		f.Close()
		return nil, err
	}
	return &segment{num: num, f: f, prepared: prepared}, nil
}
