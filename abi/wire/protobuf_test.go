package wire

import (
	"bytes"
	"math"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// sample is the message both compatibility tests use; its schema in proto3:
//
//	message Sample {
//	  string s = 1; bool b = 2; int32 i32 = 3; int64 i64 = 4;
//	  uint32 u32 = 5; uint64 u64 = 6; bytes raw = 7;
//	  repeated string names = 8; repeated int64 sizes = 9;
//	  repeated uint64 ids = 10; map<string, string> labels = 11;
//	  Inner inner = 12; repeated Inner inners = 13; Mode mode = 14;
//	}
//	message Inner { string name = 1; }
var sample = struct {
	s      string
	b      bool
	i32    int32
	i64    int64
	u32    uint32
	u64    uint64
	raw    []byte
	names  []string
	sizes  []int64
	ids    []uint64
	labels map[string]string
	inner  string
	inners []string
	mode   int32
}{
	s: "volume-1", b: true, i32: -7, i64: math.MinInt64 + 1, u32: math.MaxUint32,
	u64: 1 << 63, raw: []byte{0, 0xff, 0x80}, names: []string{"a", "", "c"},
	sizes: []int64{-1, 0, 1 << 40}, ids: []uint64{math.MaxUint64, 3},
	labels: map[string]string{"zone": "a", "": "no key", "rack": ""},
	inner:  "in", inners: []string{"x", ""}, mode: 5,
}

func appendInner(b []byte, field int, name string) []byte {
	b, mark := BeginMessage(b, field)
	b = AppendString(b, 1, name)
	return EndMessage(b, mark)
}

// encodeSample encodes sample in field-number order, as generated code does.
func encodeSample() []byte {
	v := sample
	var b []byte
	b = AppendString(b, 1, v.s)
	b = AppendBool(b, 2, v.b)
	b = AppendInt32(b, 3, v.i32)
	b = AppendInt64(b, 4, v.i64)
	b = AppendUint32(b, 5, v.u32)
	b = AppendUint64(b, 6, v.u64)
	b = AppendBytes(b, 7, v.raw)
	b = AppendStrings(b, 8, v.names)
	b = AppendPacked(b, 9, v.sizes)
	b = AppendPacked(b, 10, v.ids)
	b = AppendStringMap(b, 11, v.labels)
	b = appendInner(b, 12, v.inner)
	for _, n := range v.inners {
		b = appendInner(b, 13, n)
	}
	b = AppendInt32(b, 14, v.mode)
	return b
}

// TestProtowireReadsOurEncoding parses our bytes with protobuf's own wire
// reader and checks every value.
func TestProtowireReadsOurEncoding(t *testing.T) {
	b := encodeSample()
	var (
		names, inners []string
		sizes         []int64
		ids           []uint64
		labels        = map[string]string{}
		got           = map[protowire.Number]any{}
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				t.Fatalf("field %d: %v", num, protowire.ParseError(n))
			}
			b = b[n:]
			got[num] = v
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				t.Fatalf("field %d: %v", num, protowire.ParseError(n))
			}
			b = b[n:]
			switch num {
			case 8:
				names = append(names, string(v))
			case 9, 10:
				for len(v) > 0 {
					x, n := protowire.ConsumeVarint(v)
					if n < 0 {
						t.Fatalf("packed field %d: %v", num, protowire.ParseError(n))
					}
					v = v[n:]
					if num == 9 {
						sizes = append(sizes, int64(x))
					} else {
						ids = append(ids, x)
					}
				}
			case 11:
				var k, val string
				for len(v) > 0 {
					enum, etyp, n := protowire.ConsumeTag(v)
					if n < 0 || etyp != protowire.BytesType {
						t.Fatalf("map entry tag: %d %v", etyp, protowire.ParseError(n))
					}
					s, m := protowire.ConsumeString(v[n:])
					if m < 0 {
						t.Fatalf("map entry: %v", protowire.ParseError(m))
					}
					v = v[n+m:]
					if enum == 1 {
						k = s
					} else {
						val = s
					}
				}
				labels[k] = val
			case 12, 13:
				_, _, n := protowire.ConsumeTag(v)
				name := ""
				if n > 0 {
					name, _ = protowire.ConsumeString(v[n:])
				}
				if num == 12 {
					got[12] = name
				} else {
					inners = append(inners, name)
				}
			default:
				got[num] = string(v)
			}
		default:
			t.Fatalf("field %d: unexpected wire type %d", num, typ)
		}
	}
	v := sample
	want := map[protowire.Number]any{
		1: v.s, 2: uint64(1), 3: uint64(int64(v.i32)), 4: uint64(v.i64), 5: uint64(v.u32),
		6: v.u64, 7: string(v.raw), 12: v.inner, 14: uint64(v.mode),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("scalars: got %v, want %v", got, want)
	}
	for _, c := range []struct{ got, want any }{
		{names, v.names}, {sizes, v.sizes}, {ids, v.ids}, {labels, v.labels}, {inners, v.inners},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("got %v, want %v", c.got, c.want)
		}
	}
}

// TestDecoderReadsProtowireEncoding goes the other way: bytes written by
// protowire, with repeated integers unpacked, decode with our Decoder.
func TestDecoderReadsProtowireEncoding(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "volume-1")
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	minusSeven := int64(-7)
	b = protowire.AppendVarint(b, uint64(minusSeven))
	for _, s := range []int64{-1, 1 << 40} {
		b = protowire.AppendTag(b, 9, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(s))
	}
	b = protowire.AppendTag(b, 50, protowire.Fixed64Type) // unknown to us
	b = protowire.AppendFixed64(b, 42)
	b = protowire.AppendTag(b, 51, protowire.StartGroupType)
	b = protowire.AppendTag(b, 1, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, 1)
	b = protowire.AppendTag(b, 51, protowire.EndGroupType)
	b = protowire.AppendTag(b, 11, protowire.BytesType)
	entry := protowire.AppendTag(nil, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "v")
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "k")
	b = protowire.AppendBytes(b, entry)

	var (
		s      string
		i32    int32
		sizes  []int64
		labels map[string]string
	)
	d := NewDecoder(b)
	for !d.Done() {
		field, typ, err := d.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch field {
		case 1:
			s, err = d.String(typ)
		case 3:
			i32, err = d.Int32(typ)
		case 9:
			sizes, err = ReadPacked(&d, typ, sizes)
		case 11:
			err = d.StringMapEntry(typ, &labels)
		default:
			err = d.Skip(field, typ)
		}
		if err != nil {
			t.Fatalf("field %d: %v", field, err)
		}
	}
	if s != "volume-1" || i32 != -7 || !reflect.DeepEqual(sizes, []int64{-1, 1 << 40}) ||
		!reflect.DeepEqual(labels, map[string]string{"k": "v"}) {
		t.Fatalf("got %q %d %v %v", s, i32, sizes, labels)
	}
}

// TestSameBytesAsProtobuf builds the Sample schema at run time and checks
// that protobuf's deterministic marshalling produces exactly our bytes, and
// that protobuf parses our bytes back into the same message.
func TestSameBytesAsProtobuf(t *testing.T) {
	md := sampleDescriptor(t)
	msg := dynamicpb.NewMessage(md)
	f := md.Fields()
	v := sample
	msg.Set(f.ByNumber(1), protoreflect.ValueOfString(v.s))
	msg.Set(f.ByNumber(2), protoreflect.ValueOfBool(v.b))
	msg.Set(f.ByNumber(3), protoreflect.ValueOfInt32(v.i32))
	msg.Set(f.ByNumber(4), protoreflect.ValueOfInt64(v.i64))
	msg.Set(f.ByNumber(5), protoreflect.ValueOfUint32(v.u32))
	msg.Set(f.ByNumber(6), protoreflect.ValueOfUint64(v.u64))
	msg.Set(f.ByNumber(7), protoreflect.ValueOfBytes(v.raw))
	names := msg.Mutable(f.ByNumber(8)).List()
	for _, s := range v.names {
		names.Append(protoreflect.ValueOfString(s))
	}
	sizes := msg.Mutable(f.ByNumber(9)).List()
	for _, s := range v.sizes {
		sizes.Append(protoreflect.ValueOfInt64(s))
	}
	ids := msg.Mutable(f.ByNumber(10)).List()
	for _, s := range v.ids {
		ids.Append(protoreflect.ValueOfUint64(s))
	}
	labels := msg.Mutable(f.ByNumber(11)).Map()
	for k, s := range v.labels {
		labels.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(s))
	}
	innerMD := f.ByNumber(12).Message()
	newInner := func(name string) protoreflect.Value {
		m := dynamicpb.NewMessage(innerMD)
		m.Set(innerMD.Fields().ByNumber(1), protoreflect.ValueOfString(name))
		return protoreflect.ValueOfMessage(m)
	}
	msg.Set(f.ByNumber(12), newInner(v.inner))
	inners := msg.Mutable(f.ByNumber(13)).List()
	for _, n := range v.inners {
		if n == "" {
			inners.Append(protoreflect.ValueOfMessage(dynamicpb.NewMessage(innerMD)))
		} else {
			inners.Append(newInner(n))
		}
	}
	msg.Set(f.ByNumber(14), protoreflect.ValueOfEnum(protoreflect.EnumNumber(v.mode)))

	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	got := encodeSample()
	if !bytes.Equal(got, want) {
		t.Fatalf("our bytes differ from protobuf's\n ours: % x\nproto: % x", got, want)
	}
	parsed := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(got, parsed); err != nil {
		t.Fatalf("protobuf cannot parse our bytes: %v", err)
	}
	if !proto.Equal(parsed, msg) {
		t.Fatal("protobuf parsed our bytes into a different message")
	}
}

func sampleDescriptor(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	field := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, repeated bool, typeName string) *descriptorpb.FieldDescriptorProto {
		label := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
		if repeated {
			label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
		}
		f := &descriptorpb.FieldDescriptorProto{
			Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(), Label: label.Enum(),
			JsonName: proto.String(name),
		}
		if typeName != "" {
			f.TypeName = proto.String(typeName)
		}
		return f
	}
	const (
		tString = descriptorpb.FieldDescriptorProto_TYPE_STRING
		tBool   = descriptorpb.FieldDescriptorProto_TYPE_BOOL
		tInt32  = descriptorpb.FieldDescriptorProto_TYPE_INT32
		tInt64  = descriptorpb.FieldDescriptorProto_TYPE_INT64
		tUint32 = descriptorpb.FieldDescriptorProto_TYPE_UINT32
		tUint64 = descriptorpb.FieldDescriptorProto_TYPE_UINT64
		tBytes  = descriptorpb.FieldDescriptorProto_TYPE_BYTES
		tMsg    = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
		tEnum   = descriptorpb.FieldDescriptorProto_TYPE_ENUM
	)
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("sample.proto"),
		Package: proto.String("wiretest"),
		Syntax:  proto.String("proto3"),
		EnumType: []*descriptorpb.EnumDescriptorProto{{
			Name: proto.String("Mode"),
			Value: []*descriptorpb.EnumValueDescriptorProto{
				{Name: proto.String("MODE_UNKNOWN"), Number: proto.Int32(0)},
				{Name: proto.String("MODE_FIVE"), Number: proto.Int32(5)},
			},
		}},
		MessageType: []*descriptorpb.DescriptorProto{
			{
				Name: proto.String("Sample"),
				Field: []*descriptorpb.FieldDescriptorProto{
					field("s", 1, tString, false, ""),
					field("b", 2, tBool, false, ""),
					field("i32", 3, tInt32, false, ""),
					field("i64", 4, tInt64, false, ""),
					field("u32", 5, tUint32, false, ""),
					field("u64", 6, tUint64, false, ""),
					field("raw", 7, tBytes, false, ""),
					field("names", 8, tString, true, ""),
					field("sizes", 9, tInt64, true, ""),
					field("ids", 10, tUint64, true, ""),
					field("labels", 11, tMsg, true, ".wiretest.Sample.LabelsEntry"),
					field("inner", 12, tMsg, false, ".wiretest.Inner"),
					field("inners", 13, tMsg, true, ".wiretest.Inner"),
					field("mode", 14, tEnum, false, ".wiretest.Mode"),
				},
				NestedType: []*descriptorpb.DescriptorProto{{
					Name: proto.String("LabelsEntry"),
					Field: []*descriptorpb.FieldDescriptorProto{
						field("key", 1, tString, false, ""),
						field("value", 2, tString, false, ""),
					},
					Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
				}},
			},
			{
				Name:  proto.String("Inner"),
				Field: []*descriptorpb.FieldDescriptorProto{field("name", 1, tString, false, "")},
			},
		},
	}
	file, err := protodesc.NewFile(fd, nil)
	if err != nil {
		t.Fatalf("build descriptor: %v", err)
	}
	return file.Messages().ByName("Sample")
}
