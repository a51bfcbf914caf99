package wire

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// Integer is every type a varint field may hold, named enums included.
type Integer interface {
	~int32 | ~int64 | ~uint32 | ~uint64
}

// AppendVarint appends v as a base-128 varint.
func AppendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// SizeVarint is the number of bytes AppendVarint writes for v.
func SizeVarint(v uint64) int {
	n := 1
	for v >= 0x80 {
		n++
		v >>= 7
	}
	return n
}

// AppendTag appends the tag of field with wire type t.
func AppendTag(b []byte, field int, t Type) []byte {
	return AppendVarint(b, uint64(field)<<3|uint64(t))
}

// AppendBool appends field when v is true.
func AppendBool(b []byte, field int, v bool) []byte {
	if !v {
		return b
	}
	return append(AppendTag(b, field, Varint), 1)
}

// AppendInt32 appends field when v is not zero. Like protobuf's int32, a
// negative value is sign-extended to ten bytes.
func AppendInt32(b []byte, field int, v int32) []byte {
	return AppendInt64(b, field, int64(v))
}

// AppendInt64 appends field when v is not zero, in two's complement.
func AppendInt64(b []byte, field int, v int64) []byte {
	if v == 0 {
		return b
	}
	return AppendVarint(AppendTag(b, field, Varint), uint64(v))
}

// AppendUint32 appends field when v is not zero.
func AppendUint32(b []byte, field int, v uint32) []byte {
	return AppendUint64(b, field, uint64(v))
}

// AppendUint64 appends field when v is not zero.
func AppendUint64(b []byte, field int, v uint64) []byte {
	if v == 0 {
		return b
	}
	return AppendVarint(AppendTag(b, field, Varint), v)
}

// AppendString appends field when s is not empty.
func AppendString(b []byte, field int, s string) []byte {
	if len(s) == 0 {
		return b
	}
	b = AppendVarint(AppendTag(b, field, Bytes), uint64(len(s)))
	return append(b, s...)
}

// AppendBytes appends field when v is not empty.
func AppendBytes(b []byte, field int, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = AppendVarint(AppendTag(b, field, Bytes), uint64(len(v)))
	return append(b, v...)
}

// AppendStrings appends one occurrence of field per element, empty elements
// included, as protobuf does for repeated strings.
func AppendStrings(b []byte, field int, vs []string) []byte {
	for _, s := range vs {
		b = AppendVarint(AppendTag(b, field, Bytes), uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// AppendPacked appends vs as one packed field when vs is not empty.
// Signed values are sign-extended, as in protobuf.
func AppendPacked[T Integer](b []byte, field int, vs []T) []byte {
	if len(vs) == 0 {
		return b
	}
	n := 0
	for _, v := range vs {
		n += SizeVarint(uint64(v))
	}
	b = AppendVarint(AppendTag(b, field, Bytes), uint64(n))
	for _, v := range vs {
		b = AppendVarint(b, uint64(v))
	}
	return b
}

// AppendStringMap appends one entry message {1: key, 2: value} per element
// of m, in key order so that equal maps encode to equal bytes. Key and value
// are written even when empty, as protobuf does.
func AppendStringMap(b []byte, field int, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	var small [16]entry
	entries := small[:0]
	for k, v := range m {
		entries = append(entries, entry{k, v})
	}
	sortEntries(entries)
	for _, e := range entries {
		n := 2 + SizeVarint(uint64(len(e.k))) + len(e.k) + SizeVarint(uint64(len(e.v))) + len(e.v)
		b = AppendVarint(AppendTag(b, field, Bytes), uint64(n))
		b = AppendVarint(append(b, 1<<3|byte(Bytes)), uint64(len(e.k)))
		b = append(b, e.k...)
		b = AppendVarint(append(b, 2<<3|byte(Bytes)), uint64(len(e.v)))
		b = append(b, e.v...)
	}
	return b
}

// AppendStringMaps appends one nested message per element of ms, holding
// the element as map field 1; empty elements are written too, so that the
// count survives.
func AppendStringMaps(b []byte, field int, ms []map[string]string) []byte {
	for _, m := range ms {
		var mark int
		b, mark = BeginMessage(b, field)
		b = EndMessage(AppendStringMap(b, 1, m), mark)
	}
	return b
}

// SortedKeys returns the keys of m in order: encoders of maps walk them so
// that equal maps encode to equal bytes.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ValidStrings reports whether every element of vs is valid UTF-8, as the
// Decoder requires of strings.
func ValidStrings(vs []string) bool {
	for _, s := range vs {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// ValidStringMap reports whether every key and value of m is valid UTF-8.
func ValidStringMap(m map[string]string) bool {
	for k, v := range m {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

// entry is one element of a map being encoded.
type entry struct{ k, v string }

// sortEntries sorts by key: insertion sort for the few entries maps usually
// hold, the library's sort beyond.
func sortEntries(es []entry) {
	if len(es) > 16 {
		slices.SortFunc(es, func(a, b entry) int { return strings.Compare(a.k, b.k) })
		return
	}
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].k < es[j-1].k; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}

// BeginMessage appends the tag of a length-delimited field and one byte of
// room for its length. It returns the buffer and a mark to pass to
// EndMessage once the body has been appended. This avoids a sizing pass: a
// body of 128 bytes or more costs one move of the body.
func BeginMessage(b []byte, field int) ([]byte, int) {
	mark := len(b)
	return append(AppendTag(b, field, Bytes), 0), mark
}

// EndMessage writes the length of the field begun at mark.
func EndMessage(b []byte, mark int) []byte {
	start := bodyStart(b, mark)
	n := len(b) - start
	if n < 0x80 {
		b[start-1] = byte(n)
		return b
	}
	extra := SizeVarint(uint64(n)) - 1
	for i := 0; i < extra; i++ {
		b = append(b, 0)
	}
	copy(b[start+extra:], b[start:start+n])
	AppendVarint(b[:start-1], uint64(n))
	return b
}

// EndMessageOmitEmpty is EndMessage, except that a field whose body is empty
// (a struct holding only zero values) is removed, tag and all.
func EndMessageOmitEmpty(b []byte, mark int) []byte {
	if bodyStart(b, mark) == len(b) {
		return b[:mark]
	}
	return EndMessage(b, mark)
}

// bodyStart is the offset of the body of the field begun at mark: after its
// tag and the one byte reserved for the length.
func bodyStart(b []byte, mark int) int {
	i := mark
	for b[i] >= 0x80 {
		i++
	}
	return i + 2
}
