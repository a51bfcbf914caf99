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
// values are records in the tagged binary encoding described in codec.go:
//
//	meta             "schema" -> uvarint schema version (currently 1)
//	volumes          volume ID -> Volume
//	volume_names     volume name -> volume ID
//	snapshots        snapshot ID -> Snapshot
//	snapshot_names   snapshot name -> snapshot ID
//	snapshot_source  uvarint(len(source volume ID)) | source volume ID | snapshot ID -> empty
//	groups           group ID -> Group
//	group_names      group name -> group ID
//	stages           volume ID -> Stage
//	publishes        uvarint(len(volume ID)) | volume ID | target path -> Publish
//
// The length prefix in composite keys keeps a volume ID from being a prefix
// of another key by accident, so a prefix scan finds exactly one volume's
// entries. Open refuses a file whose schema version is newer than this
// package's, and a non-empty bbolt file without a meta bucket.
//
// # Durability
//
// Every write call runs in a read-write transaction committed with bbolt's
// default fdatasync (NoSync stays false) and returns only after that
// transaction is on disk. Concurrent calls share one transaction and one
// sync through DB.Batch; a call that finds no other write in flight commits
// at once instead of waiting for company. bbolt writes pages copy-on-write and switches between
// two checksummed meta pages, so after a crash or power loss the file opens
// at the last committed transaction: a write that returned is there, one that
// had not returned is either wholly there or wholly absent, and indexes never
// disagree with the records they index because both change in the same
// transaction. The freelist is not synced (it is rebuilt when the file is
// opened), which saves a page write per commit and costs nothing in safety.
//
// # Paging
//
// List calls return records in key order. The next token is opaque: a
// checksummed encoding of the next key and of what is being listed. A list
// starts at the first key at or after the token's key, so a token stays
// valid when records around it are added or deleted. A token that does not
// decode, or that belongs to another listing, is ErrBadToken.
//
// Reads run in bbolt read transactions and do not wait for writers (except
// briefly while a growing file is remapped).
package state

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the layout version this package reads and writes.
const SchemaVersion = 1

var (
	// ErrNotFound is returned, wrapped with the key, when a record does not exist.
	ErrNotFound = &abi.Error{Code: abi.NotFound, Message: "no such record"}
	// ErrNameTaken is returned, wrapped, when a put would give a second
	// record an existing record's name.
	ErrNameTaken = &abi.Error{Code: abi.AlreadyExists, Message: "name belongs to another record"}
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

	keySchema = []byte("schema")

	allBuckets = [][]byte{
		bucketMeta, bucketVolumes, bucketVolumeNames, bucketSnapshots,
		bucketSnapshotNames, bucketSnapshotSource, bucketGroups,
		bucketGroupNames, bucketStages, bucketPublishes,
	}
)

const (
	// lockTimeout bounds how long Open waits for another process's flock
	// on the file before giving up.
	lockTimeout = time.Second
	// batchDelay is how long the first writer of a batch waits for others
	// to join it. It is a fraction of one commit (two fdatasyncs), so a
	// batch fills up with the writers that arrive while the previous
	// commit is syncing without adding much latency; see BenchmarkPutDelete.
	batchDelay = 200 * time.Microsecond
	// maxKey is the longest ID, name or path the store accepts, far above
	// CSI's own limits and below bbolt's maximum key size.
	maxKey = 4096
)

// Store is an open state file. Its methods are safe for concurrent use.
type Store struct {
	db *bolt.DB
	// writers counts write calls in flight; a write that finds none other
	// commits at once instead of waiting batchDelay for company.
	writers atomic.Int32
}

// Open opens or creates the state file at path (mode 0600). It fails after
// a second if another process has the file open.
func Open(path string) (*Store, error) {
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
	db.MaxBatchDelay = batchDelay
	if err := db.Update(initSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// initSchema checks the schema version of an existing file, or writes it
// into a new one, and creates missing buckets.
func initSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		empty := true
		tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
		if !empty {
			return abi.Errorf(abi.FailedPrecondition, "not a wasmcsi state file: no meta bucket")
		}
	} else if raw := meta.Get(keySchema); raw != nil {
		v, n := binary.Uvarint(raw)
		switch {
		case n <= 0 || n != len(raw) || v == 0:
			return abi.Errorf(abi.DataLoss, "corrupt schema version")
		case v > SchemaVersion:
			return abi.Errorf(abi.FailedPrecondition, fmt.Sprintf(
				"state schema version %d is newer than this daemon's %d; refusing to touch it", v, SchemaVersion))
		}
		// v == SchemaVersion; an older version would be migrated here.
	}
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	if tx.Bucket(bucketMeta).Get(keySchema) == nil {
		return tx.Bucket(bucketMeta).Put(keySchema, binary.AppendUvarint(nil, SchemaVersion))
	}
	return nil
}

// Close closes the file after transactions in progress end.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state %s: %w", s.db.Path(), err)
	}
	return nil
}

// Path is the file the store was opened from.
func (s *Store) Path() string { return s.db.Path() }

// refusal marks an error that a write function returns to refuse the
// operation. It must be returned before the function writes anything: the
// write then commits nothing for this call while the rest of its batch
// goes ahead, instead of bbolt re-running the whole batch.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

func refuse(err error) error { return refusal{err} }

// write runs fn in a fsynced read-write transaction, batched with concurrent
// writers. fn may run more than once (bbolt re-runs a batch when a call in it
// fails), so it must only change tx and variables it sets on every run.
func (s *Store) write(fn func(tx *bolt.Tx) error) error {
	var refused error
	run := func(tx *bolt.Tx) error {
		refused = nil
		err := fn(tx)
		var r refusal
		if errors.As(err, &r) {
			refused = r.err
			return nil
		}
		return err
	}
	var err error
	if s.writers.Add(1) == 1 {
		err = s.db.Update(run)
	} else {
		err = s.db.Batch(run)
	}
	s.writers.Add(-1)
	if err != nil {
		return err
	}
	return refused
}

func checkKey(what, k string) error {
	switch {
	case k == "":
		return abi.Errorf(abi.InvalidArgument, what+" is empty")
	case len(k) > maxKey:
		return abi.Errorf(abi.InvalidArgument, fmt.Sprintf("%s is longer than %d bytes", what, maxKey))
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
	listGroups
	listStages
	listPublishes
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
func (s *Store) page(l listing, bucket, prefix []byte, token string, max int, visit func(tx *bolt.Tx, k, v []byte) error) (string, error) {
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
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		n := 0
		for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if max > 0 && n == max {
				next = encodeToken(l, k)
				return nil
			}
			if err := visit(tx, k, v); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return next, err
}

// get returns a copy-free view of bucket[key] to decode within a read
// transaction.
func (s *Store) get(bucket []byte, key []byte, decode func(v []byte) error) (found bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
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
func nameIndex(names *bolt.Bucket, id, name string, old []byte, nameField int) (apply func() error, err error) {
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
func dropName(names *bolt.Bucket, id string, old []byte, nameField int) error {
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
func invalid(err error) error { return abi.Errorf(abi.InvalidArgument, err.Error()) }

func corrupt(what, key string, err error) error {
	return &abi.Error{Code: abi.DataLoss, Message: fmt.Sprintf("decode %s %q: %v", what, key, err)}
}
