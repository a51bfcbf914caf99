package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// settleDelay is how long the settler gathers operations before it syncs
// their pool folders: one folder sync covers every operation of the batch.
const settleDelay = 200 * time.Millisecond

// settler makes the pool folder changes of controller operations durable
// in batches, and only then writes what completes each operation (drops
// its intent, removes the record of a deleted volume), so that no
// completion reaches the disk before the change it describes
// (RATIONALE.md, "Records").
type settler struct {
	log *slog.Logger

	mu      sync.Mutex
	queue   []settling
	waiters []chan struct{} // flush callers, released after the next batch
	pending map[string]int  // keys with a completion queued
	copies  map[string]int  // sources (volKey, snapKey) of queued creates that copy them

	kick, urgent chan struct{}
	stop, done   chan struct{}

	// sync makes a folder's entries durable (syncFolder; tests fake it).
	sync func(path string) error
	// broken are the folders whose fsync failed. Linux reports a
	// writeback error to one fsync only: a later one may succeed although
	// the changes it should cover are gone (the kernel dropped the pages
	// it could not write, or the filesystem aborted its journal). So
	// nothing queued on such a folder completes in this process: the
	// intents and marks stay for start-up to finish, as the state store
	// stops after a failed sync of its own log. Its operations stay
	// pending, so calls that would race them answer ABORTED meanwhile.
	broken map[string]bool
	// nbroken counts the folders in broken, for Broken.
	nbroken atomic.Int32
	// fsErrors counts the errors the kernel recorded on the filesystem
	// of a folder (ext4Errors; tests fake it), and errBase is that count
	// when the settler first met the folder. An ext4 whose journal a write
	// error aborted may answer a later fsync with success while it is not
	// (yet) read-only, and the error itself may have gone to another
	// caller's fsync: a count above the base means the folder's queued
	// entries may be gone. Guarded by mu.
	fsErrors func(dir string) int
	errBase  map[string]int
}

// settling is one operation waiting for its batch.
type settling struct {
	key      string   // the volume ID or intent key it completes
	source   string   // what a create copied (volKey, snapKey), or ""
	dirs     []string // pool folders whose entries it changed unsynced
	complete func() error
}

func newSettler(log *slog.Logger) *settler {
	st := &settler{
		log: log, pending: map[string]int{}, copies: map[string]int{}, sync: syncFolder, broken: map[string]bool{},
		fsErrors: func(dir string) int { _, n := ext4Errors(dir); return n }, errBase: map[string]int{},
		kick: make(chan struct{}, 1), urgent: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go st.loop()
	return st
}

// add queues complete to run once dirs are synced.
func (st *settler) add(key string, dirs []string, complete func() error) {
	st.addCopy(key, "", dirs, complete)
}

// addCopy is add for a create that copied source (volKey or snapKey of
// a clone's or a restore's source; "" for none): until it completes, its
// replay after a crash needs the source (copying).
func (st *settler) addCopy(key, source string, dirs []string, complete func() error) {
	st.mu.Lock()
	for _, d := range dirs {
		if _, ok := st.errBase[d]; !ok {
			st.errBase[d] = st.fsErrors(d) // once per folder
		}
	}
	st.queue = append(st.queue, settling{key: key, source: source, dirs: dirs, complete: complete})
	st.pending[key]++
	if source != "" {
		st.copies[source]++
	}
	st.mu.Unlock()
	select {
	case st.kick <- struct{}{}:
	default:
	}
}

// settling reports whether a completion of key is queued.
func (st *settler) settling(key string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.pending[key] > 0
}

// copying reports whether a create that copied source (volKey, snapKey)
// is still queued.
func (st *settler) copying(source string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.copies[source] > 0
}

// flush runs a batch now and returns once every operation queued before
// the call is through one (or ctx ends).
func (st *settler) flush(ctx context.Context) error {
	ch := make(chan struct{})
	st.mu.Lock()
	st.waiters = append(st.waiters, ch)
	st.mu.Unlock()
	select {
	case st.urgent <- struct{}{}:
	default:
	}
	select {
	case <-ch:
		return nil
	case <-st.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close settles what is queued and stops the settler.
func (st *settler) close() {
	select {
	case <-st.stop:
	default:
		close(st.stop)
	}
	<-st.done
}

func (st *settler) loop() {
	defer close(st.done)
	for {
		select {
		case <-st.stop:
			st.batch()
			return
		case <-st.urgent:
		case <-st.kick:
			t := time.NewTimer(settleDelay)
			select {
			case <-t.C:
			case <-st.urgent:
				t.Stop()
			case <-st.stop:
				t.Stop()
			}
		}
		st.batch()
	}
}

// batch syncs the folders of every queued operation, once each, and then
// writes their completions in the order they were queued. The operations
// on a folder that does not sync are tried again with the next batch (and
// start-up finishes them after a restart); the others complete.
func (st *settler) batch() {
	st.mu.Lock()
	q, w := st.queue, st.waiters
	st.queue, st.waiters = nil, nil
	st.mu.Unlock()
	defer func() {
		for _, ch := range w {
			close(ch)
		}
	}()
	if len(q) == 0 {
		return
	}
	// Each folder is synced once. An operation completes when all its
	// folders synced; one whose folder did not waits for the next batch,
	// and so does every later operation on any of its folders, so each
	// folder's operations still complete in the order they were queued
	// while a broken folder (one backend's storage failing) holds back
	// only the operations on it, not every backend's.
	synced, held := map[string]bool{}, map[string]bool{}
	var done, again []settling
	for _, op := range q {
		ok, broken := true, false
		for _, d := range op.dirs {
			switch {
			case st.broken[d]:
				ok, broken = false, true
			case held[d]:
				ok = false
			case synced[d]:
			default:
				var fe *fsyncError
				switch err := st.syncChecked(d); {
				case errors.As(err, &fe):
					st.log.Error("sync pool folder failed; its operations complete at the next start", "folder", d, "err", err)
					st.markBroken(d)
					ok, broken = false, true
				case err != nil:
					st.log.Error("sync pool folder; its operations complete later", "folder", d, "err", err)
					held[d] = true
					ok = false
				default:
					synced[d] = true
				}
			}
		}
		if !ok {
			for _, d := range op.dirs {
				held[d] = true
				if broken {
					st.markBroken(d) // keep the order of its operations
				}
			}
			if !broken {
				again = append(again, op)
			}
			// An operation on a broken folder is dropped here: its intent
			// or mark stays for start-up, and its pending count stays, so
			// calls that would race it answer ABORTED until then. Nothing
			// of it is kept in memory however long the folder stays broken.
			continue
		}
		done = append(done, op)
	}
	for _, op := range done {
		if err := op.complete(); err != nil {
			st.log.Error("complete an operation; start-up finishes it", "key", op.key, "err", err)
		}
	}
	st.mu.Lock()
	for _, op := range done {
		if st.pending[op.key]--; st.pending[op.key] <= 0 {
			delete(st.pending, op.key)
		}
		if op.source != "" {
			if st.copies[op.source]--; st.copies[op.source] <= 0 {
				delete(st.copies, op.source)
			}
		}
	}
	if len(again) > 0 {
		st.queue = append(again, st.queue...)
	}
	st.mu.Unlock()
	if len(again) > 0 {
		select {
		case st.kick <- struct{}{}:
		default:
		}
	}
}

// syncChecked syncs folder d and then checks that its filesystem counted no
// error since the settler met the folder (see fsErrors).
func (st *settler) syncChecked(d string) error {
	if err := st.sync(d); err != nil {
		return err
	}
	st.mu.Lock()
	base := st.errBase[d]
	st.mu.Unlock()
	if n := st.fsErrors(d); n > base {
		return &fsyncError{fmt.Errorf("the filesystem recorded %d new errors since its operations were queued", n-base)}
	}
	return nil
}

// markBroken records that folder d's operations wait for start-up.
func (st *settler) markBroken(d string) {
	if !st.broken[d] {
		st.broken[d] = true
		st.nbroken.Add(1)
	}
}

// Broken says whether some pool folder failed to sync in this process: its
// operations complete only at the next start, so the daemon reports itself
// not ready (Probe) for a liveness check to restart it.
func (st *settler) Broken() bool { return st.nbroken.Load() > 0 }

// syncFolder makes the entries of the folder path durable. A failed fsync
// is an *fsyncError: unlike a folder that cannot be opened (moved away
// for a while), it may have lost changes for good.
func syncFolder(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return &fsyncError{err}
	}
	// A filesystem that turned read-only under us (ext4 after its journal
	// aborted on a write error) answers fsync with success without
	// writing anything, and another caller's fsync may already have been
	// told of the error: the entries queued here may be gone.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err == nil && fs.Flags&unix.ST_RDONLY != 0 {
		return &fsyncError{unix.EROFS}
	}
	return nil
}

type fsyncError struct{ err error }

func (e *fsyncError) Error() string { return "fsync: " + e.err.Error() }
func (e *fsyncError) Unwrap() error { return e.err }
