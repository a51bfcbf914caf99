package wire

import "unicode/utf8"

// Decoder walks the fields of one encoded message. The zero Decoder has no
// input; use NewDecoder. A typical loop:
//
//	d := wire.NewDecoder(b)
//	for !d.Done() {
//		field, typ, err := d.Next()
//		...
//		switch field {
//		case 1:
//			m.Name, err = d.String(typ)
//		default:
//			err = d.Skip(field, typ)
//		}
//	}
//
// Every read checks the wire type it expects against the tag's and fails
// with ErrMismatch rather than guess: a field number reused with another type
// is a broken contract, not an unknown field.
type Decoder struct {
	b []byte // the input not yet consumed
	// s is the same bytes as b, as a string, when the input was small enough
	// to copy once up front; string fields are then substrings of it and cost
	// no allocation. Empty otherwise.
	s string
}

// shareLimit is the largest input whose strings share one copy. Beyond it
// each string is copied on its own, so that a small string kept by the
// caller does not pin a large input.
const shareLimit = 64 << 10

// NewDecoder returns a Decoder over b. The Decoder never writes to b, and
// values it returns never alias it: strings of an input up to 64 KiB share
// one copy of it, larger inputs' strings and all bytes fields are copied
// each on their own.
func NewDecoder(b []byte) Decoder {
	d := Decoder{b: b}
	if len(b) <= shareLimit {
		d.s = string(b)
	}
	return d
}

// Done reports whether the input is consumed.
func (d *Decoder) Done() bool { return len(d.b) == 0 }

// advance consumes n bytes, n <= len(d.b).
func (d *Decoder) advance(n int) {
	d.b = d.b[n:]
	if d.s != "" {
		d.s = d.s[n:]
	}
}

// Next reads the tag of the next field.
func (d *Decoder) Next() (field int, t Type, err error) {
	v, err := d.varint()
	if err != nil {
		return 0, 0, err
	}
	t = Type(v & 7)
	if t > Fixed32 {
		return 0, 0, ErrWireType
	}
	if v>>3 == 0 || v>>3 > MaxField {
		return 0, 0, ErrFieldNumber
	}
	return int(v >> 3), t, nil
}

// varint consumes one varint: at most ten bytes, the tenth holding only the
// 64th bit.
func (d *Decoder) varint() (uint64, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		if i == len(d.b) {
			return 0, ErrTruncated
		}
		c := d.b[i]
		if i == 9 && c > 1 {
			return 0, ErrOverflow
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			d.advance(i + 1)
			return v, nil
		}
	}
	return 0, ErrOverflow
}

// Varint reads the value of a varint field.
func (d *Decoder) Varint(t Type) (uint64, error) {
	if t != Varint {
		return 0, ErrMismatch
	}
	return d.varint()
}

// Bool reads a bool field; like protobuf, any non-zero value is true.
func (d *Decoder) Bool(t Type) (bool, error) {
	v, err := d.Varint(t)
	return v != 0, err
}

// Int32 reads an int32 (or int32 enum) field, truncating like protobuf.
func (d *Decoder) Int32(t Type) (int32, error) {
	v, err := d.Varint(t)
	return int32(v), err
}

// Int64 reads an int64 field.
func (d *Decoder) Int64(t Type) (int64, error) {
	v, err := d.Varint(t)
	return int64(v), err
}

// Uint32 reads a uint32 field, truncating like protobuf.
func (d *Decoder) Uint32(t Type) (uint32, error) {
	v, err := d.Varint(t)
	return uint32(v), err
}

// Uint64 reads a uint64 field.
func (d *Decoder) Uint64(t Type) (uint64, error) {
	return d.Varint(t)
}

// Message returns a Decoder over the body of a length-delimited field: a
// nested message to decode. It shares the input of d.
func (d *Decoder) Message(t Type) (Decoder, error) {
	if t != Bytes {
		return Decoder{}, ErrMismatch
	}
	return d.lengthDelimited()
}

// lengthDelimited consumes a length and that many bytes, and returns a
// Decoder over them.
func (d *Decoder) lengthDelimited() (Decoder, error) {
	v, err := d.varint()
	if err != nil {
		return Decoder{}, err
	}
	if v > uint64(len(d.b)) {
		return Decoder{}, ErrTruncated
	}
	n := int(v)
	body := Decoder{b: d.b[:n:n]}
	if d.s != "" {
		body.s = d.s[:n]
	}
	d.advance(n)
	return body, nil
}

// String reads a string field; it must be valid UTF-8, as in proto3.
func (d *Decoder) String(t Type) (string, error) {
	v, err := d.Message(t)
	if err != nil {
		return "", err
	}
	if !utf8.Valid(v.b) {
		return "", ErrUTF8
	}
	if v.s != "" {
		return v.s, nil
	}
	return string(v.b), nil
}

// Bytes reads a bytes field into a new slice; empty reads as nil.
func (d *Decoder) Bytes(t Type) ([]byte, error) {
	v, err := d.Message(t)
	if err != nil || len(v.b) == 0 {
		return nil, err
	}
	return append([]byte(nil), v.b...), nil
}

// RepeatedString reads one element of a repeated string field onto *dst.
func (d *Decoder) RepeatedString(t Type, dst *[]string) error {
	s, err := d.String(t)
	if err == nil {
		*dst = append(*dst, s)
	}
	return err
}

// StringMapEntry reads one {1: key, 2: value} entry of a map field into
// *dst, allocating the map on first use. A missing key or value is empty;
// unknown fields inside the entry are skipped; a repeated key keeps the last
// value, as in protobuf.
func (d *Decoder) StringMapEntry(t Type, dst *map[string]string) error {
	e, err := d.Message(t)
	if err != nil {
		return err
	}
	var k, v string
	for !e.Done() {
		field, ft, err := e.Next()
		if err != nil {
			return err
		}
		switch field {
		case 1:
			k, err = e.String(ft)
		case 2:
			v, err = e.String(ft)
		default:
			err = e.Skip(field, ft)
		}
		if err != nil {
			return err
		}
	}
	if *dst == nil {
		*dst = make(map[string]string)
	}
	(*dst)[k] = v
	return nil
}

// RepeatedStringMap reads one element of a field AppendStringMaps wrote
// onto *dst. An empty element reads as an empty map, not nil, so that the
// count survives.
func (d *Decoder) RepeatedStringMap(t Type, dst *[]map[string]string) error {
	body, err := d.Message(t)
	if err != nil {
		return err
	}
	m := map[string]string{}
	for !body.Done() {
		field, ft, err := body.Next()
		if err != nil {
			return err
		}
		if field == 1 {
			err = body.StringMapEntry(ft, &m)
		} else {
			err = body.Skip(field, ft)
		}
		if err != nil {
			return err
		}
	}
	*dst = append(*dst, m)
	return nil
}

// FindString returns the string in field of the message d reads (its last
// occurrence; "" when it has none) without consuming d: for a reader that
// needs one field, such as an index key, and not the whole message.
func FindString(d Decoder, field int) (v string, err error) {
	for !d.Done() {
		f, t, err := d.Next()
		if err != nil {
			return "", err
		}
		if f == field {
			v, err = d.String(t)
		} else {
			err = d.Skip(f, t)
		}
		if err != nil {
			return "", err
		}
	}
	return v, nil
}

// ReadPacked reads one occurrence of a repeated integer field onto dst:
// either a packed run (wire type Bytes) or a single varint, since protobuf
// writers may send either.
func ReadPacked[T Integer](d *Decoder, t Type, dst []T) ([]T, error) {
	switch t {
	case Varint:
		v, err := d.varint()
		if err != nil {
			return dst, err
		}
		return append(dst, T(v)), nil
	case Bytes:
		p, err := d.lengthDelimited()
		if err != nil {
			return dst, err
		}
		if dst == nil {
			// Every varint ends in one byte below 0x80: count them to size dst once.
			n := 0
			for _, c := range p.b {
				if c < 0x80 {
					n++
				}
			}
			dst = make([]T, 0, n)
		}
		for !p.Done() {
			v, err := p.varint()
			if err != nil {
				return dst, err
			}
			dst = append(dst, T(v))
		}
		return dst, nil
	}
	return dst, ErrMismatch
}

// Skip consumes the value of a field the reader does not know, of any wire
// type, so that messages from newer writers still decode.
func (d *Decoder) Skip(field int, t Type) error {
	return d.skip(field, t, 0)
}

func (d *Decoder) skip(field int, t Type, depth int) error {
	switch t {
	case Varint:
		_, err := d.varint()
		return err
	case Fixed64:
		return d.fixed(8)
	case Fixed32:
		return d.fixed(4)
	case Bytes:
		_, err := d.lengthDelimited()
		return err
	case StartGroup:
		if depth >= maxGroupDepth {
			return ErrGroup
		}
		for {
			f, ft, err := d.Next()
			if err != nil {
				return err
			}
			if ft == EndGroup {
				if f != field {
					return ErrGroup
				}
				return nil
			}
			if err := d.skip(f, ft, depth+1); err != nil {
				return err
			}
		}
	case EndGroup:
		return ErrGroup // an end without its start
	}
	return ErrWireType
}

func (d *Decoder) fixed(n int) error {
	if len(d.b) < n {
		return ErrTruncated
	}
	d.advance(n)
	return nil
}
