package wire

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestRoundTrip encodes one field with each encoder and reads it back with
// the matching Decoder method, checking the exact bytes on the way.
func TestRoundTrip(t *testing.T) {
	long := strings.Repeat("x", 200)
	cases := []struct {
		name   string
		encode func([]byte) []byte
		want   []byte // nil: only round-trip
		decode func(*Decoder, Type) (any, error)
		value  any
	}{
		{"bool", func(b []byte) []byte { return AppendBool(b, 1, true) }, []byte{0x08, 0x01},
			func(d *Decoder, t Type) (any, error) { return d.Bool(t) }, true},
		{"int32 positive", func(b []byte) []byte { return AppendInt32(b, 2, 300) }, []byte{0x10, 0xac, 0x02},
			func(d *Decoder, t Type) (any, error) { return d.Int32(t) }, int32(300)},
		{"int32 negative is ten bytes", func(b []byte) []byte { return AppendInt32(b, 2, -1) },
			[]byte{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
			func(d *Decoder, t Type) (any, error) { return d.Int32(t) }, int32(-1)},
		{"int32 min", func(b []byte) []byte { return AppendInt32(b, 3, math.MinInt32) }, nil,
			func(d *Decoder, t Type) (any, error) { return d.Int32(t) }, int32(math.MinInt32)},
		{"int64 max", func(b []byte) []byte { return AppendInt64(b, 4, math.MaxInt64) }, nil,
			func(d *Decoder, t Type) (any, error) { return d.Int64(t) }, int64(math.MaxInt64)},
		{"int64 min", func(b []byte) []byte { return AppendInt64(b, 4, math.MinInt64) }, nil,
			func(d *Decoder, t Type) (any, error) { return d.Int64(t) }, int64(math.MinInt64)},
		{"uint32 max", func(b []byte) []byte { return AppendUint32(b, 5, math.MaxUint32) },
			[]byte{0x28, 0xff, 0xff, 0xff, 0xff, 0x0f},
			func(d *Decoder, t Type) (any, error) { return d.Uint32(t) }, uint32(math.MaxUint32)},
		{"uint64 max", func(b []byte) []byte { return AppendUint64(b, 6, math.MaxUint64) }, nil,
			func(d *Decoder, t Type) (any, error) { return d.Uint64(t) }, uint64(math.MaxUint64)},
		{"string", func(b []byte) []byte { return AppendString(b, 7, "héllo") },
			[]byte{0x3a, 0x06, 'h', 0xc3, 0xa9, 'l', 'l', 'o'},
			func(d *Decoder, t Type) (any, error) { return d.String(t) }, "héllo"},
		{"string 200 bytes has a two-byte length", func(b []byte) []byte { return AppendString(b, 7, long) },
			append([]byte{0x3a, 0xc8, 0x01}, long...),
			func(d *Decoder, t Type) (any, error) { return d.String(t) }, long},
		{"bytes", func(b []byte) []byte { return AppendBytes(b, 8, []byte{0, 1, 0xff}) },
			[]byte{0x42, 0x03, 0, 1, 0xff},
			func(d *Decoder, t Type) (any, error) { return d.Bytes(t) }, []byte{0, 1, 0xff}},
		{"large field number", func(b []byte) []byte { return AppendBool(b, MaxField, true) },
			[]byte{0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01},
			func(d *Decoder, t Type) (any, error) { return d.Bool(t) }, true},
		{"packed int64", func(b []byte) []byte { return AppendPacked(b, 9, []int64{1, -1, 300}) },
			[]byte{0x4a, 0x0d, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0xac, 0x02},
			func(d *Decoder, t Type) (any, error) { return ReadPacked[int64](d, t, nil) }, []int64{1, -1, 300}},
		{"packed uint64 with zero", func(b []byte) []byte { return AppendPacked(b, 9, []uint64{0, math.MaxUint64}) }, nil,
			func(d *Decoder, t Type) (any, error) { return ReadPacked[uint64](d, t, nil) }, []uint64{0, math.MaxUint64}},
		{"packed named int32", func(b []byte) []byte { return AppendPacked(b, 9, []mode{1, -2}) }, nil,
			func(d *Decoder, t Type) (any, error) { return ReadPacked[mode](d, t, nil) }, []mode{1, -2}},
		{"nested message", func(b []byte) []byte {
			b, mark := BeginMessage(b, 10)
			b = AppendString(b, 1, "in")
			return EndMessage(b, mark)
		}, []byte{0x52, 0x04, 0x0a, 0x02, 'i', 'n'},
			innerName, "in"},
		{"nested message over 127 bytes is moved", func(b []byte) []byte {
			b, mark := BeginMessage(b, 10)
			b = AppendString(b, 1, long)
			return EndMessage(b, mark)
		}, append([]byte{0x52, 0xcb, 0x01, 0x0a, 0xc8, 0x01}, long...),
			innerName, long},
		{"empty nested message is kept by EndMessage", func(b []byte) []byte {
			b, mark := BeginMessage(b, 10)
			return EndMessage(b, mark)
		}, []byte{0x52, 0x00},
			innerName, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte{0xaa}
			b := tc.encode(append([]byte(nil), prefix...))
			if !bytes.HasPrefix(b, prefix) {
				t.Fatalf("encoder overwrote the existing buffer: % x", b)
			}
			b = b[len(prefix):]
			if tc.want != nil && !bytes.Equal(b, tc.want) {
				t.Fatalf("encoded % x, want % x", b, tc.want)
			}
			d := NewDecoder(b)
			if _, typ, err := d.Next(); err != nil {
				t.Fatalf("Next: %v", err)
			} else {
				got, err := tc.decode(&d, typ)
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				if !reflect.DeepEqual(got, tc.value) {
					t.Fatalf("decoded %#v, want %#v", got, tc.value)
				}
			}
			if !d.Done() {
				t.Fatalf("%d bytes left over", len(b))
			}
		})
	}
}

type mode int32

// innerName reads a nested message and returns its field 1 string.
func innerName(d *Decoder, t Type) (any, error) {
	sub, err := d.Message(t)
	if err != nil || sub.Done() {
		return "", err
	}
	_, typ, err := sub.Next()
	if err != nil {
		return "", err
	}
	return sub.String(typ)
}

func TestZeroValuesAreOmitted(t *testing.T) {
	var b []byte
	b = AppendBool(b, 1, false)
	b = AppendInt32(b, 2, 0)
	b = AppendInt64(b, 3, 0)
	b = AppendUint32(b, 4, 0)
	b = AppendUint64(b, 5, 0)
	b = AppendString(b, 6, "")
	b = AppendBytes(b, 7, nil)
	b = AppendBytes(b, 7, []byte{})
	b = AppendStrings(b, 8, nil)
	b = AppendPacked[int64](b, 9, nil)
	b = AppendStringMap(b, 10, nil)
	b = AppendStringMap(b, 10, map[string]string{})
	b, mark := BeginMessage(b, 11)
	b = EndMessageOmitEmpty(b, mark)
	if len(b) != 0 {
		t.Fatalf("zero values encoded to % x", b)
	}
	// EndMessageOmitEmpty removes only its own field.
	b = AppendBool(b, 1, true)
	b, mark = BeginMessage(b, 3000)
	b = EndMessageOmitEmpty(b, mark)
	if want := []byte{0x08, 0x01}; !bytes.Equal(b, want) {
		t.Fatalf("got % x, want % x", b, want)
	}
}

func TestRepeatedStringsKeepEmptyElements(t *testing.T) {
	in := []string{"a", "", "c"}
	b := AppendStrings(nil, 3, in)
	var out []string
	d := NewDecoder(b)
	for !d.Done() {
		field, typ, err := d.Next()
		if err != nil || field != 3 {
			t.Fatalf("Next = %d, %v", field, err)
		}
		if err := d.RepeatedString(typ, &out); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("got %q, want %q", out, in)
	}
}

func TestStringMap(t *testing.T) {
	in := map[string]string{"b": "2", "a": "", "": "empty key", "c": strings.Repeat("v", 300)}
	b := AppendStringMap(nil, 4, in)
	// Keys in order, key and value always present: entry "" first.
	wantFirst := []byte{0x22, 0x0d, 0x0a, 0x00, 0x12, 0x09}
	if !bytes.HasPrefix(b, wantFirst) {
		t.Fatalf("first entry % x, want prefix % x", b[:len(wantFirst)], wantFirst)
	}
	if got := decodeMap(t, b); !reflect.DeepEqual(in, got) {
		t.Fatalf("got %q, want %q", got, in)
	}
}

// TestStringMapOrder: entries are written in key order for small maps
// (insertion sort) and large ones (library sort), so encodings are stable.
func TestStringMapOrder(t *testing.T) {
	for _, n := range []int{2, 16, 17, 100} {
		in := map[string]string{}
		for i := 0; i < n; i++ {
			in["key-"+strings.Repeat("x", i%3)+itoa(uint64(i*7919%1000))] = itoa(uint64(i))
		}
		b := AppendStringMap(nil, 1, in)
		if again := AppendStringMap(nil, 1, in); !bytes.Equal(b, again) {
			t.Fatalf("%d entries: two encodings of one map differ", n)
		}
		var keys []string
		d := NewDecoder(b)
		for !d.Done() {
			_, typ, err := d.Next()
			if err != nil {
				t.Fatal(err)
			}
			var one map[string]string
			if err := d.StringMapEntry(typ, &one); err != nil {
				t.Fatal(err)
			}
			for k := range one {
				keys = append(keys, k)
			}
		}
		if len(keys) != n || !slices.IsSorted(keys) {
			t.Fatalf("%d entries: keys written as %q", n, keys)
		}
		if got := decodeMap(t, b); !reflect.DeepEqual(in, got) {
			t.Fatalf("%d entries: round trip changed the map", n)
		}
	}
}

func decodeMap(t *testing.T, b []byte) map[string]string {
	t.Helper()
	var out map[string]string
	d := NewDecoder(b)
	for !d.Done() {
		_, typ, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		if err := d.StringMapEntry(typ, &out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestStringMapEntryEdgeCases(t *testing.T) {
	cases := []struct {
		name  string
		entry []byte
		want  map[string]string
	}{
		{"missing value", []byte{0x0a, 0x01, 'k'}, map[string]string{"k": ""}},
		{"missing key", []byte{0x12, 0x01, 'v'}, map[string]string{"": "v"}},
		{"value before key", []byte{0x12, 0x01, 'v', 0x0a, 0x01, 'k'}, map[string]string{"k": "v"}},
		{"unknown field inside entry", []byte{0x0a, 0x01, 'k', 0x18, 0x05, 0x12, 0x01, 'v'}, map[string]string{"k": "v"}},
		{"repeated key field: last wins", []byte{0x0a, 0x01, 'x', 0x0a, 0x01, 'k', 0x12, 0x01, 'v'}, map[string]string{"k": "v"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := append([]byte{0x0a, byte(len(tc.entry))}, tc.entry...)
			d := NewDecoder(b)
			_, typ, err := d.Next()
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]string
			if err := d.StringMapEntry(typ, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPackedAcceptsUnpacked: protobuf writers may send repeated integers one
// varint per occurrence, or mix both forms.
func TestPackedAcceptsUnpacked(t *testing.T) {
	var b []byte
	b = AppendTag(b, 5, Varint)
	b = AppendVarint(b, 7)
	b = AppendPacked(b, 5, []int64{8, 9})
	b = AppendTag(b, 5, Varint)
	b = AppendVarint(b, 10)
	var got []int64
	d := NewDecoder(b)
	for !d.Done() {
		_, typ, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		if got, err = ReadPacked(&d, typ, got); err != nil {
			t.Fatal(err)
		}
	}
	if want := []int64{7, 8, 9, 10}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestSkipEveryWireType(t *testing.T) {
	var b []byte
	b = AppendUint64(b, 100, 1<<40)                                // varint
	b = append(AppendTag(b, 101, Fixed64), 1, 2, 3, 4, 5, 6, 7, 8) // fixed64
	b = AppendString(b, 102, "skipped")                            // bytes
	b = AppendTag(b, 103, StartGroup)                              // group with
	b = AppendBool(b, 1, true)                                     //   a varint,
	b = AppendTag(b, 2, StartGroup)                                //   a nested group,
	b = append(AppendTag(b, 3, Fixed32), 1, 2, 3, 4)               //   a fixed32
	b = AppendTag(b, 2, EndGroup)                                  //
	b = AppendTag(b, 103, EndGroup)                                //
	b = append(AppendTag(b, 104, Fixed32), 1, 2, 3, 4)             // fixed32
	b = AppendString(b, 1, "known")
	d := NewDecoder(b)
	var known string
	for !d.Done() {
		field, typ, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		if field == 1 {
			known, err = d.String(typ)
		} else {
			err = d.Skip(field, typ)
		}
		if err != nil {
			t.Fatalf("field %d: %v", field, err)
		}
	}
	if known != "known" {
		t.Fatalf("known field = %q", known)
	}
}

// TestMalformedInput: every malformed input is an error, never a panic, and
// the error says what is wrong.
func TestMalformedInput(t *testing.T) {
	overlong := []byte{0x20, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"truncated tag", []byte{0x80}, ErrTruncated},
		{"truncated varint value", []byte{0x20, 0xff}, ErrTruncated},
		{"missing varint value", []byte{0x20}, ErrTruncated},
		{"truncated length", []byte{0x0a}, ErrTruncated},
		{"length beyond input", []byte{0x0a, 0x05, 'a', 'b'}, ErrTruncated},
		{"huge length", []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, ErrTruncated},
		{"truncated fixed64", []byte{0x21, 1, 2, 3}, ErrTruncated},
		{"truncated fixed32", []byte{0x25, 1, 2, 3}, ErrTruncated},
		{"varint of eleven bytes", overlong, ErrOverflow},
		{"varint tenth byte above 1", []byte{0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, ErrOverflow},
		{"tag of eleven bytes", overlong[1:], ErrOverflow},
		{"wire type 6", []byte{0x0e, 0x00}, ErrWireType},
		{"wire type 7", []byte{0x0f, 0x00}, ErrWireType},
		{"field number 0", []byte{0x00, 0x00}, ErrFieldNumber},
		{"field number above 2^29-1", []byte{0x80, 0x80, 0x80, 0x80, 0x10, 0x00}, ErrFieldNumber},
		{"end group without start", []byte{0x2c}, ErrGroup},
		{"group never ended", []byte{0x2b, 0x08, 0x01}, ErrTruncated},
		{"group ended by another field", []byte{0x2b, 0x24}, ErrGroup},
		{"groups nested too deep", bytes.Repeat([]byte{0x2b}, maxGroupDepth+2), ErrGroup},
		{"known string field as varint", []byte{0x08, 0x01}, ErrMismatch},
		{"invalid UTF-8 string", []byte{0x0a, 0x02, 0xc3, 0x28}, ErrUTF8},
		{"truncated map entry", []byte{0x12, 0x03, 0x0a, 0x05, 'k'}, ErrTruncated},
		{"map key not UTF-8", []byte{0x12, 0x03, 0x0a, 0x01, 0xff}, ErrUTF8},
		{"packed run cut inside a varint", []byte{0x1a, 0x02, 0x01, 0x80}, ErrTruncated},
		{"packed as fixed32", []byte{0x1d, 1, 2, 3, 4}, ErrMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := decodeTestMessage(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var we *Error
			if !errors.As(err, &we) || we.Message != "testMessage" {
				t.Fatalf("error %v is not located in testMessage", err)
			}
		})
	}
}

// decodeTestMessage decodes the way generated code does a message with
// field 1 string, 2 map<string,string>, 3 repeated int64; everything else is
// skipped.
func decodeTestMessage(b []byte) error {
	var (
		s    string
		m    map[string]string
		ints []int64
	)
	d := NewDecoder(b)
	for !d.Done() {
		field, typ, err := d.Next()
		if err != nil {
			return Wrap("testMessage", 0, err)
		}
		switch field {
		case 1:
			s, err = d.String(typ)
		case 2:
			err = d.StringMapEntry(typ, &m)
		case 3:
			ints, err = ReadPacked(&d, typ, ints)
		default:
			err = d.Skip(field, typ)
		}
		if err != nil {
			return Wrap("testMessage", field, err)
		}
	}
	_, _, _ = s, m, ints
	return nil
}

// TestEveryTruncationFails cuts a valid message at every byte: a cut at a
// field boundary decodes, any other cut is ErrTruncated.
func TestEveryTruncationFails(t *testing.T) {
	var b []byte
	var boundaries = map[int]bool{0: true}
	b = AppendString(b, 1, "name")
	boundaries[len(b)] = true
	b = AppendStringMap(b, 2, map[string]string{"k": "v"})
	boundaries[len(b)] = true
	b = AppendPacked(b, 3, []int64{-1, 5})
	boundaries[len(b)] = true
	b = append(AppendTag(b, 9, Fixed64), 1, 2, 3, 4, 5, 6, 7, 8)
	boundaries[len(b)] = true
	if err := decodeTestMessage(b); err != nil {
		t.Fatalf("whole message: %v", err)
	}
	for n := 0; n < len(b); n++ {
		err := decodeTestMessage(b[:n:n])
		if boundaries[n] {
			if err != nil {
				t.Errorf("cut at boundary %d: %v", n, err)
			}
		} else if !errors.Is(err, ErrTruncated) {
			t.Errorf("cut at %d: got %v, want ErrTruncated", n, err)
		}
	}
}

func TestErrorText(t *testing.T) {
	inner := Wrap("Inner", 2, ErrTruncated)
	outer := Wrap("Outer", 7, inner)
	if got, want := outer.Error(), "decode Outer field 7: decode Inner field 2: wire: truncated input"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got, want := Wrap("Tag", 0, ErrWireType).Error(), "decode Tag: wire: invalid wire type"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if Wrap("X", 1, nil) != nil {
		t.Fatal("Wrap of nil is not nil")
	}
}

// TestDecoderDoesNotAliasInput: decoded strings and bytes stay intact when
// the caller reuses the input buffer, for inputs whose strings share one
// copy and for larger ones whose strings are copied one by one.
func TestDecoderDoesNotAliasInput(t *testing.T) {
	for _, pad := range []int{1, shareLimit} {
		b := AppendBytes(nil, 1, []byte("abc"))
		b = AppendString(b, 2, "def")
		b = AppendString(b, 3, strings.Repeat("p", pad))
		d := NewDecoder(b)
		_, typ, _ := d.Next()
		raw, err := d.Bytes(typ)
		if err != nil {
			t.Fatal(err)
		}
		_, typ, _ = d.Next()
		s, err := d.String(typ)
		if err != nil {
			t.Fatal(err)
		}
		_, typ, _ = d.Next()
		p, err := d.String(typ)
		if err != nil || len(p) != pad || !d.Done() {
			t.Fatalf("padding: %d bytes, %v, done %v", len(p), err, d.Done())
		}
		for i := range b {
			b[i] = 0
		}
		if string(raw) != "abc" || s != "def" || strings.Trim(p, "p") != "" {
			t.Fatalf("input of %d bytes: decoded values changed with the input: %q %q", len(b), raw, s)
		}
	}
}

func TestSizeVarint(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 16383, 16384, 1<<35 - 1, 1 << 35, math.MaxInt64, math.MaxUint64} {
		if got, want := SizeVarint(v), len(AppendVarint(nil, v)); got != want {
			t.Errorf("SizeVarint(%d) = %d, want %d", v, got, want)
		}
	}
}
