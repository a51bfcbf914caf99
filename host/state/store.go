// Package state keeps the daemon's durable records: on the controller side
// every volume, snapshot and volume group snapshot it created, on the node
// side every volume it staged and published. Records survive restarts and
// crashes; the CSI services read them to answer idempotent retries, List
// calls and cleanup after a restart.
//
// state stores what its callers give it. It must never know about CSI
// messages, backends or mounts, never hold a lock of its own across slow
// work, and never rewrite the whole file.
//
// # On-disk layout
//
// One bbolt file (go.etcd.io/bbolt) with these buckets; keys are raw bytes,
// values are records in the tagged binary encoding described in records.go:
//
//	meta             "schema" -> uvarint schema version (currently 2)
//	                 "log_seq" -> uvarint: every log record up to this one is in the buckets
//	                 "log_segment" -> uvarint: later records are in log segments numbered this or higher
//	volumes          volume ID -> Volume
//	volume_names     volume name -> volume ID
//	snapshots        snapshot ID -> Snapshot
//	snapshot_names   snapshot name -> snapshot ID
//	snapshot_source  uvarint(len(source volume ID)) | source volume ID | snapshot ID -> empty
//	groups           group ID -> Group
//	group_names      unused: files written before groups lost their name index may hold entries
//	stages           volume ID -> Stage
//	publishes        uvarint(len(volume ID)) | volume ID | target path -> Publish
//	ephemeral        the CO's volume ID -> Ephemeral (inline ephemeral volumes)
//	intents          intent key -> Intent (operations logged before a module runs them)
//	volumes_deleting volume ID -> empty: the volumes marked Deleting, which start-up finishes
//	ephemeral_volumes volume ID -> the CO's volume ID: the inline ephemeral volume that holds it
//	snapshots_deleting snapshot ID -> empty: the snapshots marked Deleting, which start-up finishes
//
// The length prefix in composite keys keeps a volume ID from being a prefix
// of another key by accident, so a prefix scan finds exactly one volume's
// entries. Open refuses a file whose schema version is newer than this
// package's, and a non-empty bbolt file without a meta bucket.
//
// Next to the file lies its write-ahead log: segment files <file>.wal.NNNNNN
// with the changes not yet in the buckets (record format in wal.go), and
// <file>.wal.spare, a zero-filled file that becomes the next segment. A
// build of the daemon that knows no log reads the file correctly only after
// a clean Close, which leaves every change in the buckets.
//
// # Durability
//
// A write call runs its function under a store mutex that is held only for
// work in memory: against the call's view of the store, collecting its
// changes. If the function succeeds, the call appends one log record
// holding all of its changes, applies them to an in-memory overlay of the
// changes not yet in bbolt, releases the mutex, and returns once the record
// is on disk: one fdatasync per call, shared by the calls waiting at the
// same time. A caller that finds no sync in flight writes every buffered
// record with one write and one fdatasync and wakes every caller it
// covered; records buffered meanwhile go in the next one. Segments are
// zero-filled ahead of use, off the write path, so a sync overwrites blocks
// that are already allocated and has no file metadata to commit.
//
// A background checkpoint moves the overlay into bbolt when it holds about
// a thousand keys, the log grew by 2 MiB, or a second after the first write
// it does not cover: in one bbolt transaction committed with bbolt's
// fdatasync (NoSync stays false), which also records the last log record it
// covers; then it removes the segments it covered. Writers do not wait for
// it, unless the overlay grows to eight times that size meanwhile. bbolt
// writes pages copy-on-write and switches between two checksummed meta
// pages, so after a crash or power loss the file opens at its last
// checkpoint, and Open replays the log's later records into it before it
// returns. So a write that returned is there; one that had not returned is
// either wholly there or wholly absent, and indexes never disagree with the
// records they index, because a call's changes share one record. A record
// cut short at the very end of the log is the write the crash interrupted
// and ends the log; a damaged record anywhere else means acknowledged
// writes are gone, and Open fails with DATA_LOSS. The freelist is not
// synced (it is rebuilt when the file is opened), which saves a page write
// per checkpoint and costs nothing in safety.
//
// If writing or syncing the log fails, the store stops: that call and every
// later one fail with INTERNAL until the daemon restarts and recovers from
// the log, because after a failed fsync the kernel may have dropped the
// pages it could not write, and nothing in memory can be trusted to match
// the disk.
//
// # Reads
//
// A read sees the overlay over a bbolt read transaction, as one consistent
// state: each call's changes wholly or not at all. It may see a write whose
// call has not returned yet, because the overlay takes a call's changes
// before its record is on disk; if the daemon crashes before then, the
// write is gone after the restart. Reads do not wait for writers or
// checkpoints (except briefly while a growing bbolt file is remapped).
//
// # Paging
//
// List calls return records in key order. The next token is opaque: a
// checksummed encoding of the next key and of what is being listed. A list
// starts at the first key at or after the token's key, so a token stays
// valid when records around it are added or deleted. A token that does not
// decode, or that belongs to another listing, is ErrBadToken.
package state

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the layout version this package reads and writes.
// Version 2 added the write-ahead log beside the file: a file of version 2
// may be missing changes that only its log holds, so a daemon that knows
// only version 1 must refuse it. Version 3 has the derived index buckets
// (volumes_deleting, ephemeral_volumes, snapshots_deleting), which log
// records name: a daemon that knows only version 2 would take such a
// record for a torn write and drop it with the record change it carries,
// and would not keep the indexes. An older file is upgraded on Open, its
// indexes built anew from the records (a version 2 daemon may have changed
// the records without them), in one transaction with the new number.
const SchemaVersion = 3

var (
	// ErrNotFound is returned, wrapped with the key, when a record does not exist.
	ErrNotFound = &abi.Error{Code: abi.NotFound, Message: "no such record"}
	// ErrNameTaken is returned, wrapped, when a put would give a second
	// record an existing record's name.
	ErrNameTaken = &abi.Error{Code: abi.AlreadyExists, Message: "name belongs to another record"}
	// ErrIDTaken is returned, wrapped, when an insert names an ID that is
	// already recorded. Its code is INTERNAL: the host chose the ID from a
	// module's answer, and a module that hands out one ID twice is broken.
	ErrIDTaken = &abi.Error{Code: abi.Internal, Message: "ID belongs to another record"}
	// ErrBadToken is returned when a List starting token names no position
	// in that listing. Its code is ABORTED, as CSI asks for an invalid
	// starting_token.
	ErrBadToken = &abi.Error{Code: abi.Aborted, Message: "starting token names no position in this listing"}
)

var (
	bucketMeta           = []byte("meta")
	bucketVolumes        = []byte("volumes")
	bucketVolumeNames    = []byte("volume_names")
	bucketSnapshots      = []byte("snapshots")
	bucketSnapshotNames  = []byte("snapshot_names")
	bucketSnapshotSource = []byte("snapshot_source")
	bucketGroups         = []byte("groups")
	bucketGroupNames     = []byte("group_names")
	bucketStages         = []byte("stages")
	bucketPublishes      = []byte("publishes")
	bucketEphemeral      = []byte("ephemeral")
	bucketIntents        = []byte("intents")
	// The derived indexes are made, and filled from the records they
	// index, after the log's replay (openIndexes), not by initSchema.
	bucketVolumesDeleting   = []byte("volumes_deleting")
	bucketEphemeralVolumes  = []byte("ephemeral_volumes")
	bucketSnapshotsDeleting = []byte("snapshots_deleting")

	keySchema = []byte("schema")

	// allBuckets lists every bucket. A bucket's index is its ID in log
	// records (wal.go): add new buckets at the end, never reorder.
	allBuckets = [][]byte{
		bucketMeta, bucketVolumes, bucketVolumeNames, bucketSnapshots,
		bucketSnapshotNames, bucketSnapshotSource, bucketGroups,
		bucketGroupNames, bucketStages, bucketPublishes, bucketEphemeral,
		bucketIntents, bucketVolumesDeleting, bucketEphemeralVolumes,
		bucketSnapshotsDeleting,
	}
)

const (
	// lockTimeout bounds how long Open waits for another process's flock
	// on the file before giving up.
	lockTimeout = time.Second
	// maxKey is the longest ID, name or path the store accepts, far above
	// CSI's own limits and below bbolt's maximum key size.
	maxKey = 4096
)

// Store is an open state file. Its methods are safe for concurrent use.
type Store struct {
	db   boltFile
	path string
	opts options
	log  *wal

	// mu serializes the memory work of write calls and the moments a
	// checkpoint freezes or drops a layer.
	mu           sync.Mutex
	room         sync.Cond // on mu: writers waiting for the overlay to shrink
	closed       bool
	firstPending time.Time // first write the next checkpoint covers
	pendingBytes int64     // log bytes since the last checkpoint began

	// rw pairs the layers a reader loads with the bbolt transaction it
	// opens: a checkpoint publishes layers under its write side, so no
	// checkpoint can both commit and drop a layer in between.
	rw     sync.RWMutex
	layers atomic.Pointer[layers]

	// ckptMu makes checkpoints one at a time and guards spare.
	ckptMu sync.Mutex
	spare  bool // the spare segment file is ready
	kick   chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

// boltFile is the store's bbolt file, the checkpoint of its state.
type boltFile struct {
	*bolt.DB
	s *Store
}

// View runs fn in a bbolt read transaction after a checkpoint of every
// write made so far, so that fn sees the whole state in bbolt's own terms:
// a consistency check, bucket statistics. The store's reads do not use it:
// they read the overlay over a read transaction instead of waiting for a
// checkpoint.
func (f boltFile) View(fn func(*bolt.Tx) error) error {
	if err := f.s.checkpointAll(); err != nil {
		return err
	}
	return f.DB.View(fn)
}

// Open opens or creates the state file at path (mode 0600) and replays its
// log. It fails after a second if another process has the file open.
func Open(path string) (*Store, error) { return open(path, defaultOptions()) }

func open(path string, opts options) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        lockTimeout,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("open state %s: file is locked by another process: %w", path, err)
		}
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	// bbolt's flock on the file also keeps other processes off its log.
	var seq uint64
	var seg *segment
	var version uint64
	err = db.Update(func(tx *bolt.Tx) (err error) {
		version, err = initSchema(tx)
		return err
	})
	if err == nil {
		var next uint64
		if seq, next, err = recoverLog(db, path); err == nil {
			err = openIndexes(db, version)
		}
		if err == nil {
			seg, err = startSegment(path, next)
		}
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	s := &Store{
		path: path,
		opts: opts,
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	s.db = boltFile{DB: db, s: s}
	s.log = newWAL(seq, seg)
	s.room.L = &s.mu
	s.layers.Store(&layers{active: &layer{}})
	go s.checkpointLoop()
	return s, nil
}

// initSchema checks the schema version of an existing file, or writes it
// into a new one, and creates missing buckets. It returns the file's
// version; openIndexes upgrades an older one.
func initSchema(tx *bolt.Tx) (version uint64, err error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		empty := true
		tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
		if !empty {
			return 0, abi.Errorf(abi.FailedPrecondition, "not a wasmcsi state file: no meta bucket")
		}
	} else if raw := meta.Get(keySchema); raw != nil {
		v, n := binary.Uvarint(raw)
		switch {
		case n <= 0 || n != len(raw) || v == 0:
			return 0, abi.Errorf(abi.DataLoss, "corrupt schema version")
		case v > SchemaVersion:
			return 0, abi.Errorf(abi.FailedPrecondition, "state schema version %d is newer than this daemon's %d; refusing to touch it", v, SchemaVersion)
		}
		version = v
	}
	for _, name := range allBuckets {
		if slices.ContainsFunc(derivedIndexes, func(d derivedIndex) bool { return bytes.Equal(d.bucket, name) }) {
			continue
		}
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return 0, fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	if tx.Bucket(bucketMeta).Get(keySchema) == nil {
		return SchemaVersion, tx.Bucket(bucketMeta).Put(keySchema, binary.AppendUvarint(nil, SchemaVersion))
	}
	return version, nil
}

// derivedIndex is an index bucket whose entries follow from the records
// of another: fill writes them from those records.
type derivedIndex struct {
	bucket []byte
	fill   func(tx *bolt.Tx) error
}

var derivedIndexes = []derivedIndex{
	{bucketVolumesDeleting, volumeTable.fillHidden},
	{bucketEphemeralVolumes, indexEphemeralVolumes},
	{bucketSnapshotsDeleting, snapshotTable.fillHidden},
}

// openIndexes makes each derived index a file lacks (a new file, or one
// written before the index) from the records it indexes, in one
// transaction with its bucket, so that a crash cannot leave the bucket
// without its entries. A file of an older schema version gets every index
// anew, and the new version number, in that same transaction. It runs
// after the log's replay, which may change such a file's records alone.
func openIndexes(db *bolt.DB, version uint64) error {
	upgrade := version < SchemaVersion
	var missing []derivedIndex
	if err := db.View(func(tx *bolt.Tx) error {
		for _, d := range derivedIndexes {
			if upgrade || tx.Bucket(d.bucket) == nil {
				missing = append(missing, d)
			}
		}
		return nil
	}); err != nil || len(missing) == 0 {
		return err
	}
	return db.Update(func(tx *bolt.Tx) error {
		for _, d := range missing {
			if err := tx.DeleteBucket(d.bucket); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
				return fmt.Errorf("drop bucket %s: %w", d.bucket, err)
			}
			if _, err := tx.CreateBucket(d.bucket); err != nil {
				return fmt.Errorf("create bucket %s: %w", d.bucket, err)
			}
			if err := d.fill(tx); err != nil {
				return fmt.Errorf("index %s: %w", d.bucket, err)
			}
		}
		if upgrade {
			if err := tx.Bucket(bucketMeta).Put(keySchema, binary.AppendUvarint(nil, SchemaVersion)); err != nil {
				return fmt.Errorf("upgrade schema version %d to %d: %w", version, SchemaVersion, err)
			}
		}
		return nil
	})
}

// Close waits for write calls in progress, checkpoints every change into
// the bbolt file, and closes it. After the log failed, it closes without
// a checkpoint and returns the failure; the next Open replays the log.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.room.Broadcast()
	s.mu.Unlock()
	close(s.stop)
	<-s.done

	err := s.log.err()
	if err == nil {
		s.ckptMu.Lock()
		err = s.checkpointLocked(true)
		s.ckptMu.Unlock()
	}
	s.log.close()
	if cerr := s.db.DB.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close state %s: %w", s.path, err)
	}
	return nil
}

// Path is the file the store was opened from.
func (s *Store) Path() string { return s.path }

// refusal marks an error that a write function returns to refuse the
// operation: the call writes nothing and returns the wrapped error as it
// is. Any other error of the function also writes nothing.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

func refuse(err error) error { return refusal{err} }

// errClosed is what calls on a closed store return.
var errClosed = fmt.Errorf("state is closed: %w", bolterrors.ErrDatabaseNotOpen)

// write runs fn once against a view of the store and, if it succeeds,
// logs and applies its changes and waits until they are durable.
func (s *Store) write(fn func(tx *txn) error) error {
	seq, err := s.apply(fn)
	if err != nil || seq == 0 {
		return err
	}
	return s.log.wait(seq)
}

// writeAsync is write that returns as soon as the changes are applied
// (readers see them) and logged in memory, with the log's write and sync
// already started; the returned wait blocks until they are durable, or
// reports why they cannot be. The Store's methods that use it end in
// Async, those that use writeSoon in Soon.
func (s *Store) writeAsync(fn func(tx *txn) error) (wait func() error, err error) {
	seq, err := s.apply(fn)
	if err != nil {
		return nil, err
	}
	if seq == 0 {
		return func() error { return nil }, nil
	}
	// The log syncs when someone waits: wait now, on the caller's behalf,
	// so the disk works while the caller does.
	done := make(chan error, 1)
	go func() { done <- s.log.wait(seq) }()
	return sync.OnceValue(func() error { return <-done }), nil
}

// writeSoon is write that neither waits for the disk nor starts a sync:
// the changes reach the disk with the log's next sync, which the next
// waited write starts, or with the checkpoint that follows within
// maxDelay. For changes whose loss in a crash is harmless.
func (s *Store) writeSoon(fn func(tx *txn) error) error {
	_, err := s.apply(fn)
	return err
}

// Written returns once every change applied so far is at least written to
// the log file: a killed daemon keeps it (a power cut may not, and a crash
// of the machine also ends what such a record describes, a mount say).
// For a caller about to change the system in a way a record must explain
// after a kill, while the record's sync runs beside the change.
func (s *Store) Written() error {
	if err := s.log.err(); err != nil {
		return err
	}
	return s.log.waitWritten(s.log.lastSeq())
}

// Sync returns once every change applied so far, those of the Soon
// writes too, is durable: at once when the log has nothing unsynced. For a
// caller about to change what a record only recoverable so far describes
// (a volume whose record InsertVolumeSoon wrote): after the change, the
// logged intent the record would be rebuilt from no longer describes it.
func (s *Store) Sync() error {
	if err := s.log.err(); err != nil {
		return err
	}
	return s.log.wait(s.log.lastSeq())
}

// apply runs fn once against a view of the store and, if it succeeds and
// changed something, appends its changes to the log and applies them to
// the in-memory layer. It returns the log sequence number to wait for, 0
// when nothing changed.
func (s *Store) apply(fn func(tx *txn) error) (uint64, error) {
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return 0, errClosed
		}
		if err := s.log.err(); err != nil {
			s.mu.Unlock()
			return 0, err
		}
		if !s.opts.overloaded(s.layers.Load().active.entries, s.pendingBytes) {
			break
		}
		s.kickCheckpoint()
		s.room.Wait()
	}
	cur := s.layers.Load()
	btx, err := s.db.Begin(false)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	tx := &txn{tx: btx, active: cur.active, frozen: cur.frozen, writable: true}
	err = fn(tx)
	btx.Rollback()
	if err != nil {
		s.mu.Unlock()
		var r refusal
		if errors.As(err, &r) {
			return 0, r.err
		}
		return 0, err
	}
	if len(tx.changes) == 0 {
		s.mu.Unlock()
		return 0, nil
	}
	seq, size, err := s.log.append(tx.changes)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	s.layers.Store(&layers{active: tx.active, frozen: cur.frozen})
	if cur.active.entries == 0 {
		s.firstPending = time.Now()
		s.kickCheckpoint() // to time the checkpoint
	}
	if tx.active.entries >= s.opts.maxEntries && cur.active.entries < s.opts.maxEntries ||
		s.pendingBytes < s.opts.maxBytes && s.pendingBytes+int64(size) >= s.opts.maxBytes {
		s.kickCheckpoint()
	}
	s.pendingBytes += int64(size)
	s.mu.Unlock()
	return seq, nil
}

// view runs fn against the current state: the overlay over a bbolt read
// transaction.
func (s *Store) view(fn func(tx *txn) error) error {
	if err := s.log.err(); err != nil {
		return err
	}
	s.rw.RLock()
	l := s.layers.Load()
	btx, err := s.db.Begin(false)
	s.rw.RUnlock()
	if err != nil {
		return err
	}
	defer btx.Rollback()
	return fn(&txn{tx: btx, active: l.active, frozen: l.frozen})
}

func checkKey(what, k string) error {
	switch {
	case k == "":
		return abi.Errorf(abi.InvalidArgument, "%s is empty", what)
	case len(k) > maxKey:
		return abi.Errorf(abi.InvalidArgument, "%s is longer than %d bytes", what, maxKey)
	}
	return nil
}

// prefixKey returns uvarint(len(a)) | a | b, the composite key of the
// snapshot_source and publishes buckets; with b empty it is the prefix of
// every key for a.
func prefixKey(a, b string) []byte {
	k := make([]byte, 0, binary.MaxVarintLen64+len(a)+len(b))
	k = binary.AppendUvarint(k, uint64(len(a)))
	k = append(k, a...)
	return append(k, b...)
}

// splitPrefixKey undoes prefixKey.
func splitPrefixKey(k []byte) (a, b string, err error) {
	l, n := binary.Uvarint(k)
	if n <= 0 || l > uint64(len(k)-n) {
		return "", "", fmt.Errorf("corrupt composite key %q", k)
	}
	return string(k[n : n+int(l)]), string(k[n+int(l):]), nil
}

// listing names what a token pages through, so a token cannot be replayed
// against another listing.
type listing byte

const (
	listVolumes listing = iota + 1
	listSnapshots
	listSnapshotsBySource
	_ // was the groups listing; the values of the others stay
	listStages
	listPublishes
	listEphemerals
	listIntents
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// encodeToken returns the opaque token for starting l at key k (plus the
// prefix for filtered listings, so a token from one filter fails another).
func encodeToken(l listing, k []byte) string {
	b := make([]byte, 0, 1+len(k)+4)
	b = append(b, byte(l))
	b = append(b, k...)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeToken returns the key a token for listing l with key prefix p
// starts at.
func decodeToken(l listing, p []byte, token string) ([]byte, error) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) < 5 {
		return nil, ErrBadToken
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, crcTable) != sum || listing(body[0]) != l || !bytes.HasPrefix(body[1:], p) {
		return nil, ErrBadToken
	}
	return body[1:], nil
}

// page visits up to max (0: all) entries of bucket whose keys start with
// prefix, beginning at token, and returns the token of the next page, or ""
// after the last.
func (s *Store) page(l listing, bucket, prefix []byte, token string, max int, visit func(tx *txn, k, v []byte) error) (string, error) {
	if max < 0 {
		return "", abi.Errorf(abi.InvalidArgument, "negative max entries")
	}
	start := prefix
	if token != "" {
		k, err := decodeToken(l, prefix, token)
		if err != nil {
			return "", err
		}
		start = k
	}
	var next string
	err := s.view(func(tx *txn) error {
		c := tx.Bucket(bucket).Cursor()
		n := 0
		for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if max > 0 && n == max {
				next = encodeToken(l, k)
				return nil
			}
			if err := visit(tx, k, v); errors.Is(err, errSkip) {
				continue
			} else if err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return next, err
}

// errSkip is what a page visitor returns for an entry that the listing
// leaves out and does not count.
var errSkip = errors.New("not listed")

// get returns a copy-free view of bucket[key] to decode within a read
// transaction.
func (s *Store) get(bucket []byte, key []byte, decode func(v []byte) error) (found bool, err error) {
	err = s.view(func(tx *txn) error {
		v := tx.Bucket(bucket).Get(key)
		if v == nil {
			return nil
		}
		found = true
		return decode(v)
	})
	return found, err
}

// nameIndex keeps a name -> ID index bucket in step with a put of record id
// whose previous encoding is old (nil if new) and whose name becomes name.
// nameField is the field number of the name in the record. It refuses,
// writing nothing, when name belongs to another record.
func nameIndex(names bucket, id, name string, old []byte, nameField int) (apply func() error, err error) {
	var oldName string
	if old != nil {
		if oldName, err = stringField(old, nameField); err != nil {
			return nil, fmt.Errorf("decode stored record %s: %w", id, err)
		}
	}
	if name != "" {
		if owner := names.Get([]byte(name)); owner != nil && string(owner) != id {
			return nil, refuse(fmt.Errorf("name %q is taken by %s: %w", name, owner, ErrNameTaken))
		}
	}
	return func() error {
		if oldName != "" && oldName != name {
			if err := names.Delete([]byte(oldName)); err != nil {
				return err
			}
		}
		if name != "" && oldName != name {
			return names.Put([]byte(name), []byte(id))
		}
		return nil
	}, nil
}

// dropName removes the index entry of a record being deleted.
func dropName(names bucket, id string, old []byte, nameField int) error {
	name, err := stringField(old, nameField)
	if err != nil {
		return fmt.Errorf("decode stored record %s: %w", id, err)
	}
	if name == "" {
		return nil
	}
	if owner := names.Get([]byte(name)); string(owner) == id {
		return names.Delete([]byte(name))
	}
	return nil
}

// invalid gives a caller's mistake its category.
func invalid(err error) error { return abi.Errorf(abi.InvalidArgument, "%v", err) }

func corrupt(what, key string, err error) error {
	return &abi.Error{Code: abi.DataLoss, Message: fmt.Sprintf("decode %s %q: %v", what, key, err)}
}
