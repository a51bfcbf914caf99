package wire

import "time"

// AppendTime appends field as a nested {1: Unix seconds, 2: nanoseconds},
// the layout of google.protobuf.Timestamp, unless t is the zero Time.
func AppendTime(b []byte, field int, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b, mark := BeginMessage(b, field)
	b = AppendInt64(b, 1, t.Unix())
	b = AppendInt64(b, 2, int64(t.Nanosecond()))
	return EndMessage(b, mark)
}

// Time reads a field AppendTime wrote, in UTC and without a monotonic
// reading. A missing part is zero, so an empty message is the Unix epoch.
func (d *Decoder) Time(t Type) (time.Time, error) {
	body, err := d.Message(t)
	if err != nil {
		return time.Time{}, err
	}
	var sec, nsec int64
	for !body.Done() {
		field, ft, err := body.Next()
		if err != nil {
			return time.Time{}, Wrap("Time", 0, err)
		}
		switch field {
		case 1:
			sec, err = body.Int64(ft)
		case 2:
			nsec, err = body.Int64(ft)
		default:
			err = body.Skip(field, ft)
		}
		if err != nil {
			return time.Time{}, Wrap("Time", field, err)
		}
	}
	return time.Unix(sec, nsec).UTC(), nil
}
