package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi/internal/wiregen/testdata/records"
	"github.com/wasmcsi/wasmcsi/abi/wire"
)

const recordsDir = "testdata/records"

func fullRecord() *records.Record {
	at := time.Unix(1_700_000_000, 123_456_789).UTC()
	return &records.Record{
		ID: "r-1", At: at,
		Segments: []map[string]string{{"zone": "a", "rack": "r1"}, {}, {"": ""}},
		Members: map[string]records.Member{
			"b": {Role: "reader", Since: at, Context: map[string]string{"k": "v"}},
			"a": {},
			"":  {Role: "no key"},
		},
		Tags: []string{"x", ""}, Labels: map[string]string{"l": "v"},
		Main: records.Member{Role: "main"}, Spare: &records.Member{},
		List: []records.Member{{}, {Role: "r"}}, Ptrs: []*records.Member{{Role: "p"}},
		Count: -1,
	}
}

func TestRecordKindsRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		in   *records.Record
	}{
		{"every field set", fullRecord()},
		{"zero", &records.Record{}},
		{"the epoch is not the zero time", &records.Record{At: time.Unix(0, 0).UTC()}},
		{"before the epoch", &records.Record{At: time.Unix(-5, 7).UTC()}},
		{"only empty segments", &records.Record{Segments: []map[string]string{{}, {}}}},
		{"one empty member", &records.Record{Members: map[string]records.Member{"n": {}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.in.AppendWire(nil)
			var out records.Record
			if err := out.UnmarshalWire(b); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if !reflect.DeepEqual(tc.in, &out) {
				t.Fatalf("round trip changed the record:\n in: %+v\nout: %+v", tc.in, &out)
			}
			if again := out.AppendWire(nil); !bytes.Equal(again, b) {
				t.Fatalf("re-encoding differs:\n% x\n% x", b, again)
			}
		})
	}
	if b := (&records.Record{}).AppendWire(nil); len(b) != 0 {
		t.Fatalf("zero record encoded to % x", b)
	}
}

// TestRecordKindsBytes pins the layout of the new kinds: a time is
// {1: seconds, 2: nanoseconds}; each segment is a message holding its map
// as field 1, empty ones too; each map element is one message, in key
// order, with the key as field 1 (omitted when empty) beside the value's
// own fields.
func TestRecordKindsBytes(t *testing.T) {
	in := &records.Record{
		At:       time.Unix(2, 3),
		Segments: []map[string]string{{"k": "v"}, {}},
		Members:  map[string]records.Member{"b": {Role: "r"}, "a": {}, "": {Role: "x"}},
	}
	want := []byte{
		0x12, 0x04, 0x08, 0x02, 0x10, 0x03, // At
		0x1a, 0x08, 0x0a, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, 'v', // Segments[0]
		0x1a, 0x00, // Segments[1]
		0x22, 0x03, 0x12, 0x01, 'x', // Members[""]: no key field
		0x22, 0x03, 0x0a, 0x01, 'a', // Members["a"]: only the key
		0x22, 0x06, 0x0a, 0x01, 'b', 0x12, 0x01, 'r', // Members["b"]
	}
	if got := in.AppendWire(nil); !bytes.Equal(got, want) {
		t.Fatalf("got  % x\nwant % x", got, want)
	}
}

// TestMapEntryKeyField: an entry without a key is the empty key, a
// repeated key keeps the last value, and a key of another wire type is an
// error located in the map's field.
func TestMapEntryKeyField(t *testing.T) {
	b := []byte{0x22, 0x03, 0x12, 0x01, 'x', 0x22, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, '1', 0x22, 0x06, 0x12, 0x01, '2', 0x0a, 0x01, 'k'}
	var r records.Record
	if err := r.UnmarshalWire(b); err != nil {
		t.Fatal(err)
	}
	if want := map[string]records.Member{"": {Role: "x"}, "k": {Role: "2"}}; !reflect.DeepEqual(r.Members, want) {
		t.Fatalf("got %+v, want %+v", r.Members, want)
	}
	err := r.UnmarshalWire([]byte{0x22, 0x02, 0x08, 0x01})
	var we *wire.Error
	if !errors.Is(err, wire.ErrMismatch) || !errors.As(err, &we) || we.Message != "Record" || we.Field != 4 {
		t.Fatalf("key of the wrong type: %v", err)
	}
	err = r.UnmarshalWire([]byte{0x22, 0x03, 0x12, 0x01, 0xff})
	if !errors.Is(err, wire.ErrUTF8) || err.Error() != "decode Record field 4: decode Member field 2: wire: string is not valid UTF-8" {
		t.Fatalf("bad value: %v", err)
	}
}

// TestValidUTF8 puts one invalid string in each place a record holds
// strings: ValidUTF8 finds each, and UnmarshalWire refuses what it finds.
func TestValidUTF8(t *testing.T) {
	const bad = "\xff"
	if !fullRecord().ValidUTF8() || !(&records.Record{}).ValidUTF8() || !(*records.Record)(nil).ValidUTF8() || !(&records.Counter{N: 1}).ValidUTF8() {
		t.Fatal("a valid record is refused")
	}
	for name, spoil := range map[string]func(r *records.Record){
		"named string":      func(r *records.Record) { r.ID = bad },
		"segment key":       func(r *records.Record) { r.Segments[0][bad] = "" },
		"segment value":     func(r *records.Record) { r.Segments[1]["k"] = bad },
		"map key":           func(r *records.Record) { r.Members[bad] = records.Member{} },
		"map value":         func(r *records.Record) { r.Members["a"] = records.Member{Role: bad} },
		"map value's map":   func(r *records.Record) { r.Members["a"] = records.Member{Context: map[string]string{"k": bad}} },
		"repeated string":   func(r *records.Record) { r.Tags[1] = bad },
		"string map":        func(r *records.Record) { r.Labels[bad] = "" },
		"nested":            func(r *records.Record) { r.Main.Role = bad },
		"pointer":           func(r *records.Record) { r.Spare.Role = bad },
		"repeated nested":   func(r *records.Record) { r.List[1].Role = bad },
		"repeated pointers": func(r *records.Record) { r.Ptrs[0].Context = map[string]string{bad: ""} },
	} {
		r := fullRecord()
		spoil(r)
		if r.ValidUTF8() {
			t.Errorf("%s: invalid UTF-8 not found", name)
		}
		var out records.Record
		if err := out.UnmarshalWire(r.AppendWire(nil)); !errors.Is(err, wire.ErrUTF8) {
			t.Errorf("%s: UnmarshalWire accepted what ValidUTF8 refuses: %v", name, err)
		}
	}
}

func TestRecordKindDeclarations(t *testing.T) {
	errorCases := []struct {
		name, src, want string
		opt             Options
	}{
		{"map value using the key's field", "type V struct {\n\tA string `wire:\"1\"`\n}\ntype M struct {\n\tX map[string]V `wire:\"1\"`\n}",
			"m.go:6: M.X: map value V uses field number 1, which holds the key (V.A at", Options{}},
		{"map of message pointers", "type V struct {\n\tA string `wire:\"2\"`\n}\ntype M struct {\n\tX map[string]*V `wire:\"1\"`\n}",
			"m.go:6: M.X: unsupported type map[string]*V", Options{}},
		{"map keyed by another type", "type V struct {\n\tA string `wire:\"2\"`\n}\ntype M struct {\n\tX map[int64]V `wire:\"1\"`\n}",
			"m.go:6: M.X: unsupported type map[int64]V", Options{}},
		{"slice of times", "import \"time\"\ntype M struct {\n\tX []time.Time `wire:\"1\"`\n}", "m.go:4: M.X: unsupported type []time.Time", Options{}},
		{"pointer to a time", "import \"time\"\ntype M struct {\n\tX *time.Time `wire:\"1\"`\n}", "m.go:4: M.X: unsupported type *time.Time", Options{}},
		{"a Time of another package", "import \"example.com/time\"\ntype M struct {\n\tX time.Time `wire:\"1\"`\n}", "m.go:4: M.X: unsupported type time.Time", Options{}},
		{"slice of other maps", "type M struct {\n\tX []map[string]int64 `wire:\"1\"`\n}", "m.go:3: M.X: unsupported type []map[string]int64", Options{}},
		{"package-level utf8 with -utf8", "var utf8 = 1\ntype M struct {\n\tA string `wire:\"1\"`\n}", "m.go:2: package-level name utf8 clashes", Options{CheckUTF8: true}},
	}
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writePkg(t, map[string]string{"m.go": "package p\n" + tc.src + "\n"})
			_, err := Generate(dir, tc.opt)
			if err == nil {
				t.Fatal("no error")
			}
			if msg := strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), ""); !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not contain %q", msg, tc.want)
			}
		})
	}
	// time imported under another name is still time.Time; without -utf8
	// no ValidUTF8 is written, and a package-level utf8 is no clash.
	dir := writePkg(t, map[string]string{"m.go": "package p\nimport stdtime \"time\"\nvar utf8 = 1\ntype M struct {\n\tX stdtime.Time `wire:\"1\"`\n\tS string `wire:\"2\"`\n}\n"})
	out, err := Generate(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := string(out.Files["m_wire.go"])
	if !strings.Contains(got, "m.X, err = d.Time(typ)") || strings.Contains(got, "ValidUTF8") {
		t.Fatalf("m_wire.go:\n%s", got)
	}
}
