package state

import (
	"errors"
	"fmt"

	"github.com/wasmcsi/wasmcsi/abi/wire"
	bolt "go.etcd.io/bbolt"
)

// record is what wiregen writes for a record type T (records.go).
type wireRecord[T any] interface {
	*T
	AppendWire([]byte) []byte
	UnmarshalWire([]byte) error
	ValidUTF8() bool
}

// errNotUTF8 refuses a record the decoder could not read back: abi/wire
// strings, like protobuf's, must be valid UTF-8.
var errNotUTF8 = errors.New("record holds a string that is not valid UTF-8")

// encode returns the encoding of v, or errNotUTF8.
func encode[T any, P wireRecord[T]](v *T) ([]byte, error) {
	if !P(v).ValidUTF8() {
		return nil, errNotUTF8
	}
	// Most records fit: one allocation.
	return P(v).AppendWire(make([]byte, 0, 256)), nil
}

func decode[T any, P wireRecord[T]](b []byte) (v T, err error) {
	err = P(&v).UnmarshalWire(b)
	return v, err
}

// stringField returns the string in top-level field f of an encoded record
// without decoding the rest: the write paths use it to find the old name or
// source of a record they are about to replace.
func stringField(b []byte, f int) (string, error) {
	return wire.FindString(wire.NewDecoder(b), f)
}

// table is one kind of record kept by key in a bucket, with an optional
// unique-name index and indexes of its own: every record kind's put,
// insert, get, lookup by name, delete and listing are this code, so a fix
// to one is a fix to all. A kind declares its buckets, key and indexes.
type table[T any, P wireRecord[T]] struct {
	kind, kinds string // "volume", "volumes": in errors
	bucket      []byte
	listing     listing // what its page tokens list (0: no listing)
	check       func(*T) error
	// key is where a record is kept: its ID, or a composite key (then
	// label says it for errors; nil: the key is its own label).
	key   func(*T) string
	label func(key string) string

	// names is the name index bucket (nil: none); name answers a record's
	// name and nameField is its field number in the encoding.
	names     []byte
	name      func(*T) string
	nameField int

	// index and unindex keep the kind's other indexes (nil: none): they
	// read what they need from old, the encoding being replaced or deleted
	// (nil for a new record), before anything is written, and answer what
	// to write once the name index is updated.
	index   func(tx *txn, v *T, old []byte) (apply func() error, err error)
	unindex func(tx *txn, id string, old []byte) (apply func() error, err error)

	// hidden says a record is being deleted (nil: none ever is): get,
	// byName and listings answer as if it were gone, getAny and byNameAny
	// still find it. hide marks a record so.
	hidden func(*T) bool
	hide   func(*T)
	// hiddenIndex is the bucket of the keys of the hidden records
	// (volumes_deleting, snapshots_deleting), kept by every put and
	// delete: start-up reads the few records being deleted from it
	// instead of decoding every record of the kind.
	hiddenIndex []byte
}

// put records v, replacing a record of its key; with insert it refuses,
// writing nothing, a key already recorded. write is the Store's write or
// writeSoon.
func (t *table[T, P]) put(write func(func(tx *txn) error) error, v T, insert bool) error {
	verb := "put"
	if insert {
		verb = "insert"
	}
	key, fn, err := t.change(&v, verb, insert)
	if err != nil {
		return err
	}
	if err := write(fn); err != nil {
		return t.errorf(verb, key, err)
	}
	return nil
}

// putAsync is put with the Store's writeAsync: it returns once readers see
// v, and wait returns once v is durable (or why it cannot be).
func (t *table[T, P]) putAsync(s *Store, v T) (wait func() error, err error) {
	key, fn, err := t.change(&v, "put", false)
	if err != nil {
		return nil, err
	}
	if wait, err = s.writeAsync(fn); err != nil {
		return nil, t.errorf("put", key, err)
	}
	return wait, nil
}

// change checks and encodes v and returns its key and the write function
// that records it and keeps its indexes.
func (t *table[T, P]) change(v *T, verb string, insert bool) (string, func(tx *txn) error, error) {
	if err := t.check(v); err != nil {
		return "", nil, err
	}
	key := t.key(v)
	val, err := encode[T, P](v)
	if err != nil {
		return "", nil, t.errorf(verb, key, invalid(err))
	}
	return key, func(tx *txn) error {
		recs := tx.Bucket(t.bucket)
		old := recs.Get([]byte(key))
		if insert && old != nil {
			return refuse(ErrIDTaken)
		}
		applyName, applyIndex := nothing, nothing
		var err error
		if t.names != nil {
			if applyName, err = nameIndex(tx.Bucket(t.names), key, t.name(v), old, t.nameField); err != nil {
				return err
			}
		}
		if t.index != nil {
			if applyIndex, err = t.index(tx, v, old); err != nil {
				return err
			}
		}
		if err := applyName(); err != nil {
			return err
		}
		if err := applyIndex(); err != nil {
			return err
		}
		if err := t.indexHidden(tx, key, t.hidden != nil && t.hidden(v)); err != nil {
			return err
		}
		return recs.Put([]byte(key), val)
	}, nil
}

// indexHidden puts key into the hidden index or takes it out. It writes
// nothing when the index already says so, as for most records, which are
// not hidden.
func (t *table[T, P]) indexHidden(tx *txn, key string, hidden bool) error {
	if t.hiddenIndex == nil {
		return nil
	}
	idx := tx.Bucket(t.hiddenIndex)
	switch there := idx.Get([]byte(key)) != nil; {
	case hidden && !there:
		return idx.Put([]byte(key), []byte{})
	case !hidden && there:
		return idx.Delete([]byte(key))
	}
	return nil
}

// markHidden hides the record of key (hide) and returns once that is
// durable; a record already hidden is left as it is.
func (t *table[T, P]) markHidden(s *Store, key string) error {
	return s.write(func(tx *txn) error {
		old := tx.Bucket(t.bucket).Get([]byte(key))
		if old == nil {
			return refuse(ErrNotFound)
		}
		v, err := t.decodeAt(key, old)
		if err != nil || t.hidden(&v) {
			return err
		}
		t.hide(&v)
		_, put, err := t.change(&v, "mark", false)
		if err != nil {
			return err
		}
		return put(tx)
	})
}

// allHidden returns every hidden record, in key order, read through the
// hidden index: its cost is that of the hidden records, whatever the
// number of records. An index entry without its hidden record is
// DATA_LOSS.
func (t *table[T, P]) allHidden(s *Store) ([]T, error) {
	var out []T
	err := s.view(func(tx *txn) error {
		recs := tx.Bucket(t.bucket)
		c := tx.Bucket(t.hiddenIndex).Cursor()
		for k, _ := c.Seek(nil); k != nil; k, _ = c.Next() {
			b := recs.Get(k)
			if b == nil {
				return corrupt(string(t.hiddenIndex)+" index", t.labelOf(string(k)), fmt.Errorf("no such %s", t.kind))
			}
			v, err := t.decodeAt(string(k), b)
			if err != nil {
				return err
			}
			if !t.hidden(&v) {
				return corrupt(string(t.hiddenIndex)+" index", t.labelOf(string(k)), fmt.Errorf("%s not marked Deleting", t.kind))
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}

// fillHidden fills the hidden index from the records: once, when Open
// finds a file written before the index, whose hidden records only their
// records say are hidden.
//
// A record it cannot decode is no reason to refuse the whole file: it is
// indexed as hidden, since it may be a deletion in progress, and every
// call that reads it answers DATA_LOSS naming it, as start-up's look at the
// hidden records then does (which holds back the logged creates, as for
// a hidden record that breaks later); every other record is served.
func (t *table[T, P]) fillHidden(tx *bolt.Tx) error {
	idx := tx.Bucket(t.hiddenIndex)
	return tx.Bucket(t.bucket).ForEach(func(k, b []byte) error {
		v, err := t.decodeAt(string(k), b)
		if err == nil && !t.hidden(&v) {
			return nil
		}
		return idx.Put(k, []byte{})
	})
}

// get returns the record with the given key, or ErrNotFound, also for a
// hidden one.
func (t *table[T, P]) get(s *Store, key string) (T, error) {
	v, err := t.getAny(s, key)
	if err == nil && t.hidden != nil && t.hidden(&v) {
		var zero T
		return zero, fmt.Errorf("%s %s: being deleted: %w", t.kind, t.labelOf(key), ErrNotFound)
	}
	return v, err
}

// getAny is get that also finds a hidden record.
func (t *table[T, P]) getAny(s *Store, key string) (T, error) {
	var v T
	found, err := s.get(t.bucket, []byte(key), func(b []byte) (err error) {
		v, err = t.decodeAt(key, b)
		return err
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s %s: %w", t.kind, t.labelOf(key), err)
	}
	return v, nil
}

// byName returns the record with the given name, or ErrNotFound, also for
// a hidden one.
func (t *table[T, P]) byName(s *Store, name string) (T, error) {
	v, err := t.byNameAny(s, name)
	if err == nil && t.hidden != nil && t.hidden(&v) {
		var zero T
		return zero, fmt.Errorf("%s named %q: being deleted: %w", t.kind, name, ErrNotFound)
	}
	return v, err
}

// byNameAny is byName that also finds a hidden record.
func (t *table[T, P]) byNameAny(s *Store, name string) (T, error) {
	var v T
	var found bool
	err := s.view(func(tx *txn) error {
		id := tx.Bucket(t.names).Get([]byte(name))
		if id == nil {
			return nil
		}
		b := tx.Bucket(t.bucket).Get(id)
		if b == nil {
			return corrupt(t.kind+" name index", name, fmt.Errorf("names missing %s %s", t.kind, id))
		}
		found = true
		var err error
		v, err = t.decodeAt(string(id), b)
		return err
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s named %q: %w", t.kind, name, err)
	}
	return v, nil
}

// delete removes the record and its index entries, or returns ErrNotFound;
// write is the Store's write or writeSoon.
func (t *table[T, P]) delete(write func(func(tx *txn) error) error, key string) error {
	err := write(func(tx *txn) error {
		recs := tx.Bucket(t.bucket)
		old := recs.Get([]byte(key))
		if old == nil {
			return refuse(ErrNotFound)
		}
		applyIndex := nothing
		if t.unindex != nil {
			var err error
			if applyIndex, err = t.unindex(tx, key, old); err != nil {
				return err
			}
		}
		if t.names != nil {
			if err := dropName(tx.Bucket(t.names), key, old, t.nameField); err != nil {
				return err
			}
		}
		if err := applyIndex(); err != nil {
			return err
		}
		if err := t.indexHidden(tx, key, false); err != nil {
			return err
		}
		return recs.Delete([]byte(key))
	})
	if err != nil {
		return t.errorf("delete", key, err)
	}
	return nil
}

// list returns up to max records (0: all) whose keys start with prefix, in
// key order, starting at token ("" for the first page), and the token of
// the next page, "" after the last.
func (t *table[T, P]) list(s *Store, prefix []byte, token string, max int) (out []T, next string, err error) {
	next, err = s.page(t.listing, t.bucket, prefix, token, max, t.collect(&out))
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", t.kinds, err)
	}
	return out, next, nil
}

// all returns every record in key order.
func (t *table[T, P]) all(s *Store) ([]T, error) {
	out, _, err := t.list(s, nil, "", 0)
	return out, err
}

// decodeAt decodes the record stored under key; a record that does not
// decode is DATA_LOSS.
func (t *table[T, P]) decodeAt(key string, b []byte) (T, error) {
	v, err := decode[T, P](b)
	if err != nil {
		return v, corrupt(t.kind, t.labelOf(key), err)
	}
	return v, nil
}

// collect is a page visitor that appends each record to out, except the
// hidden ones (errSkip, which page does not count).
func (t *table[T, P]) collect(out *[]T) func(_ *txn, k, b []byte) error {
	return func(_ *txn, k, b []byte) error {
		v, err := t.decodeAt(string(k), b)
		if err != nil {
			return err
		}
		if t.hidden != nil && t.hidden(&v) {
			return errSkip
		}
		*out = append(*out, v)
		return nil
	}
}

func (t *table[T, P]) labelOf(key string) string {
	if t.label == nil {
		return key
	}
	return t.label(key)
}

// errorf locates err in an operation on the record of key.
func (t *table[T, P]) errorf(verb, key string, err error) error {
	return fmt.Errorf("%s %s %s: %w", verb, t.kind, t.labelOf(key), err)
}

func nothing() error { return nil }
