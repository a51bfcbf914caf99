package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestTime: a time survives to the nanosecond in UTC, before the epoch
// too; the zero Time is omitted and the epoch is not.
func TestTime(t *testing.T) {
	for _, in := range []time.Time{
		time.Unix(1_700_000_000, 123_456_789), time.Unix(-5, 7), time.Unix(0, 0),
		time.Date(2026, 11, 24, 10, 0, 0, 1, time.FixedZone("x", 3600)),
	} {
		b := AppendTime(nil, 3, in)
		if len(b) == 0 {
			t.Fatalf("%v: not written", in)
		}
		d := NewDecoder(b)
		field, typ, err := d.Next()
		if err != nil || field != 3 {
			t.Fatalf("%v: tag %d %v", in, field, err)
		}
		got, err := d.Time(typ)
		if err != nil {
			t.Fatalf("%v: %v", in, err)
		}
		if !got.Equal(in) || got.Location() != time.UTC {
			t.Fatalf("%v: read back %v", in, got)
		}
	}
	if b := AppendTime([]byte{1}, 3, time.Time{}); !bytes.Equal(b, []byte{1}) {
		t.Fatalf("zero time written: % x", b)
	}
	bad := NewDecoder([]byte{0x1a, 0x02, 0x08, 0x80}) // seconds cut short
	_, typ, _ := bad.Next()
	if _, err := bad.Time(typ); !errors.Is(err, ErrTruncated) || err.Error() != "decode Time field 1: wire: truncated input" {
		t.Fatalf("truncated time: %v", err)
	}
}

// TestTimeIsProtobufTimestamp: the body of a time field is what protobuf
// writes for google.protobuf.Timestamp, and reads back as the same time.
func TestTimeIsProtobufTimestamp(t *testing.T) {
	for _, in := range []time.Time{time.Unix(1_700_000_000, 123_456_789), time.Unix(-5, 7), time.Unix(1, 0)} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(timestamppb.New(in))
		if err != nil {
			t.Fatal(err)
		}
		b := AppendTime(nil, 1, in)
		if body := b[2:]; !bytes.Equal(body, want) {
			t.Fatalf("%v: body % x, protobuf's Timestamp % x", in, body, want)
		}
		var ts timestamppb.Timestamp
		if err := proto.Unmarshal(b[2:], &ts); err != nil || !ts.AsTime().Equal(in) {
			t.Fatalf("%v: protobuf reads %v, %v", in, ts.AsTime(), err)
		}
	}
}

// TestStringMaps: every element is written, empty ones too, and reads back
// as a map, so that the count and order survive.
func TestStringMaps(t *testing.T) {
	in := []map[string]string{{"zone": "a", "rack": "r"}, {}, nil, {"": ""}}
	b := AppendStringMaps(nil, 11, in)
	var got []map[string]string
	d := NewDecoder(b)
	for !d.Done() {
		field, typ, err := d.Next()
		if err != nil || field != 11 {
			t.Fatalf("tag %d %v", field, err)
		}
		if err := d.RepeatedStringMap(typ, &got); err != nil {
			t.Fatal(err)
		}
	}
	want := []map[string]string{{"zone": "a", "rack": "r"}, {}, {}, {"": ""}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// The second and third elements are empty messages: tag and length 0.
	if !bytes.Contains(b, []byte{0x5a, 0x00, 0x5a, 0x00}) {
		t.Fatalf("empty elements not written: % x", b)
	}
	d = NewDecoder([]byte{0x5a, 0x02, 0x0a, 0x05})
	_, typ, _ := d.Next()
	if err := d.RepeatedStringMap(typ, &got); !errors.Is(err, ErrTruncated) {
		t.Fatalf("truncated entry: %v", err)
	}
}

func TestSortedKeys(t *testing.T) {
	if got := SortedKeys(map[string]int{"b": 1, "a": 2, "": 3}); !reflect.DeepEqual(got, []string{"", "a", "b"}) {
		t.Fatalf("got %q", got)
	}
	if got := SortedKeys(map[string]bool(nil)); len(got) != 0 {
		t.Fatalf("nil map: %q", got)
	}
}

// TestFindString reads one field, its last occurrence, and leaves the
// Decoder it was given where it was.
func TestFindString(t *testing.T) {
	b := AppendString(nil, 1, "first")
	b = AppendInt64(b, 2, 7)
	b = AppendString(b, 3, "x")
	b = AppendString(b, 1, "last")
	d := NewDecoder(b)
	for field, want := range map[int]string{1: "last", 3: "x", 4: ""} {
		if got, err := FindString(d, field); err != nil || got != want {
			t.Errorf("field %d: %q, %v; want %q", field, got, err, want)
		}
	}
	if f, _, err := d.Next(); err != nil || f != 1 {
		t.Fatalf("the caller's Decoder moved: field %d, %v", f, err)
	}
	if _, err := FindString(NewDecoder([]byte{0x12, 9}), 2); !errors.Is(err, ErrTruncated) {
		t.Fatalf("truncated: %v", err)
	}
	if _, err := FindString(NewDecoder(AppendInt64(nil, 2, 1)), 2); !errors.Is(err, ErrMismatch) {
		t.Fatalf("varint where a string is wanted: %v", err)
	}
}

func TestValidStrings(t *testing.T) {
	for _, tc := range []struct {
		ok   bool
		strs []string
		m    map[string]string
	}{
		{true, nil, nil},
		{true, []string{"a", "", "é"}, map[string]string{"": "", "k": "é"}},
		{false, []string{"a", "\xff"}, nil},
		{false, nil, map[string]string{"\xff": "v"}},
		{false, nil, map[string]string{"k": "\xc3"}},
	} {
		if got := ValidStrings(tc.strs) && ValidStringMap(tc.m); got != tc.ok {
			t.Errorf("%q %q: %v, want %v", tc.strs, tc.m, got, tc.ok)
		}
	}
}
