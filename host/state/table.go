package state

import (
	"errors"
	"fmt"

	"github.com/wasmcsi/wasmcsi/abi/wire"
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

// table is one kind of record kept by ID in a bucket, with an optional
// unique-name index and indexes of its own: every record kind's put,
// insert, get, lookup by name, delete and listing are this code, so a fix
// to one is a fix to all.
type table[T any] struct {
	kind   string // "volume", in errors
	bucket []byte
	encode func(*T) ([]byte, error)
	decode func([]byte) (T, error)
	check  func(*T) error
	id     func(*T) string

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
	// still find it.
	hidden func(*T) bool
}

// put records v; with insert it refuses, writing nothing, an ID already
// recorded. write is the Store's write or writeSoon.
func (t *table[T]) put(write func(func(tx *txn) error) error, v T, insert bool) error {
	verb := "put"
	if insert {
		verb = "insert"
	}
	if err := t.check(&v); err != nil {
		return err
	}
	id := t.id(&v)
	val, err := t.encode(&v)
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", verb, t.kind, id, invalid(err))
	}
	err = write(func(tx *txn) error {
		recs := tx.Bucket(t.bucket)
		old := recs.Get([]byte(id))
		if insert && old != nil {
			return refuse(ErrIDTaken)
		}
		applyName, applyIndex := nothing, nothing
		var err error
		if t.names != nil {
			if applyName, err = nameIndex(tx.Bucket(t.names), id, t.name(&v), old, t.nameField); err != nil {
				return err
			}
		}
		if t.index != nil {
			if applyIndex, err = t.index(tx, &v, old); err != nil {
				return err
			}
		}
		if err := applyName(); err != nil {
			return err
		}
		if err := applyIndex(); err != nil {
			return err
		}
		return recs.Put([]byte(id), val)
	})
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", verb, t.kind, id, err)
	}
	return nil
}

// get returns the record with the given ID, or ErrNotFound, also for a
// hidden one.
func (t *table[T]) get(s *Store, id string) (T, error) {
	v, err := t.getAny(s, id)
	if err == nil && t.hidden != nil && t.hidden(&v) {
		var zero T
		return zero, fmt.Errorf("%s %s: being deleted: %w", t.kind, id, ErrNotFound)
	}
	return v, err
}

// getAny is get that also finds a hidden record.
func (t *table[T]) getAny(s *Store, id string) (T, error) {
	var v T
	found, err := s.get(t.bucket, []byte(id), func(b []byte) (err error) {
		v, err = t.decodeAt(id, b)
		return err
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s %s: %w", t.kind, id, err)
	}
	return v, nil
}

// byName returns the record with the given name, or ErrNotFound, also for
// a hidden one.
func (t *table[T]) byName(s *Store, name string) (T, error) {
	v, err := t.byNameAny(s, name)
	if err == nil && t.hidden != nil && t.hidden(&v) {
		var zero T
		return zero, fmt.Errorf("%s named %q: being deleted: %w", t.kind, name, ErrNotFound)
	}
	return v, err
}

// byNameAny is byName that also finds a hidden record.
func (t *table[T]) byNameAny(s *Store, name string) (T, error) {
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
func (t *table[T]) delete(write func(func(tx *txn) error) error, id string) error {
	err := write(func(tx *txn) error {
		recs := tx.Bucket(t.bucket)
		old := recs.Get([]byte(id))
		if old == nil {
			return refuse(ErrNotFound)
		}
		applyIndex := nothing
		if t.unindex != nil {
			var err error
			if applyIndex, err = t.unindex(tx, id, old); err != nil {
				return err
			}
		}
		if t.names != nil {
			if err := dropName(tx.Bucket(t.names), id, old, t.nameField); err != nil {
				return err
			}
		}
		if err := applyIndex(); err != nil {
			return err
		}
		return recs.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("delete %s %s: %w", t.kind, id, err)
	}
	return nil
}

// decodeAt decodes the record stored under key; a record that does not
// decode is DATA_LOSS.
func (t *table[T]) decodeAt(key string, b []byte) (T, error) {
	v, err := t.decode(b)
	if err != nil {
		return v, corrupt(t.kind, key, err)
	}
	return v, nil
}

// collect is a page visitor that appends each record to out, except the
// hidden ones (errSkip, which page does not count).
func (t *table[T]) collect(out *[]T) func(_ *txn, k, b []byte) error {
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

func nothing() error { return nil }
