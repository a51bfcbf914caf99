package wire

import (
	"errors"
	"reflect"
	"testing"
)

// field is one decoded field of an arbitrary message, for the fuzzer.
type field struct {
	num   int
	typ   Type
	value uint64 // varint value, or fixed bytes as a number
	body  string // length-delimited body
}

// walk decodes any well-formed message generically: varints and
// length-delimited bodies are kept, fixed and group fields are skipped.
func walk(b []byte) ([]field, error) {
	return walkDecoder(NewDecoder(b))
}

func walkDecoder(d Decoder) ([]field, error) {
	var out []field
	for !d.Done() {
		num, typ, err := d.Next()
		if err != nil {
			return nil, err
		}
		f := field{num: num, typ: typ}
		switch typ {
		case Varint:
			f.value, err = d.Varint(typ)
		case Bytes:
			var body []byte
			body, err = d.Bytes(typ)
			f.body = string(body)
		default:
			err = d.Skip(num, typ)
		}
		if err != nil {
			return nil, err
		}
		if typ == Varint || typ == Bytes {
			out = append(out, f)
		}
	}
	return out, nil
}

// rewrite encodes fields again, canonically.
func rewrite(fs []field) []byte {
	var b []byte
	for _, f := range fs {
		b = AppendTag(b, f.num, f.typ)
		if f.typ == Varint {
			b = AppendVarint(b, f.value)
		} else {
			b = AppendVarint(b, uint64(len(f.body)))
			b = append(b, f.body...)
		}
	}
	return b
}

// FuzzDecode feeds arbitrary bytes to the Decoder: it must never panic, must
// fail only with one of its own errors, and what it accepts must survive a
// re-encode unchanged. Each length-delimited body is also tried as a string,
// a map entry, a packed run and a nested message.
//
//	go test ./wire -run '^$' -fuzz FuzzDecode -fuzztime 20s   (in abi/)
func FuzzDecode(f *testing.F) {
	f.Add(encodeSample())
	f.Add([]byte{0x1b, 0x08, 0x01, 0x1c})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, err := walk(b)
		if err != nil {
			if !isWireError(err) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		again, err := walk(rewrite(fs))
		if err != nil {
			t.Fatalf("re-encoded fields do not decode: %v", err)
		}
		if !reflect.DeepEqual(fs, again) {
			t.Fatalf("round trip changed the fields:\n%v\n%v", fs, again)
		}
		for _, fl := range fs {
			if fl.typ != Bytes {
				continue
			}
			enc := AppendTag(nil, 1, Bytes)
			enc = AppendVarint(enc, uint64(len(fl.body)))
			enc = append(enc, fl.body...)
			for _, read := range []func(d *Decoder) error{
				func(d *Decoder) error { _, err := d.String(Bytes); return err },
				func(d *Decoder) error { var m map[string]string; return d.StringMapEntry(Bytes, &m) },
				func(d *Decoder) error { _, err := ReadPacked[int32](d, Bytes, nil); return err },
				func(d *Decoder) error {
					sub, err := d.Message(Bytes)
					if err == nil {
						_, err = walkDecoder(sub)
					}
					return err
				},
			} {
				d := NewDecoder(enc)
				d.Next()
				if err := read(&d); err != nil && !isWireError(err) {
					t.Fatalf("unexpected error %v", err)
				}
			}
		}
	})
}

func isWireError(err error) bool {
	for _, e := range []error{ErrTruncated, ErrOverflow, ErrFieldNumber, ErrWireType, ErrMismatch, ErrGroup, ErrUTF8} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
