package main

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi/internal/wiregen/testdata/fixture"
)

// message1KiB is shaped like a create_volume request: a name, parameters,
// a few capabilities and topology segments; it encodes to about 1 KiB.
func message1KiB() *fixture.ThingV2 {
	m := &fixture.ThingV2{
		Name:  "pvc-6f1c2a9e-3b7d-4c55-9f0e-1d2b3c4d5e6f",
		Extra: "csi.storage.k8s.io/pvc/namespace=default",
		Size:  10 << 30, Count: 3,
		Inner: &fixture.Inner{Name: "requisite", Labels: map[string]string{"topology.wasmcsi.dev/node": "worker-1"}},
		Tags:  []string{"ext4", "noatime", "nodiratime", "discard"},
		Nums:  []int64{1, 5, 7},
		Meta:  map[string]string{},
	}
	for i := 0; i < 12; i++ {
		k := "parameter.example.com/key-" + strconv.Itoa(i)
		m.Meta[k] = "value-of-parameter-" + strconv.Itoa(i*7919)
	}
	for i := 0; i < 3; i++ {
		m.Nested = append(m.Nested, fixture.ThingV2{
			Name: "capability-" + strconv.Itoa(i), Size: int64(i), Tags: []string{"rw", "sync"},
			Meta: map[string]string{"zone": "zone-" + strconv.Itoa(i)},
		})
	}
	return m
}

// BenchmarkRoundTrip1KiB encodes into a reused buffer and decodes into a
// reused message, as the host and a module do per call.
func BenchmarkRoundTrip1KiB(b *testing.B) {
	in := message1KiB()
	buf := in.AppendWire(nil)
	if len(buf) < 900 || len(buf) > 1200 {
		b.Fatalf("message is %d bytes, want about 1 KiB", len(buf))
	}
	var out fixture.ThingV2
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = in.AppendWire(buf[:0])
		if err := out.UnmarshalWire(buf); err != nil {
			b.Fatal(err)
		}
	}
	if !reflect.DeepEqual(in, &out) {
		b.Fatal("round trip changed the message")
	}
}

func BenchmarkEncode1KiB(b *testing.B) {
	in := message1KiB()
	buf := in.AppendWire(nil)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = in.AppendWire(buf[:0])
	}
}

func BenchmarkDecode1KiB(b *testing.B) {
	buf := message1KiB().AppendWire(nil)
	var out fixture.ThingV2
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if err := out.UnmarshalWire(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzUnmarshal decodes arbitrary bytes into generated messages: no panic,
// and whatever decodes re-encodes to bytes that decode to the same message.
//
//	go test ./internal/wiregen -run '^$' -fuzz FuzzUnmarshal -fuzztime 20s   (in abi/)
func FuzzUnmarshal(f *testing.F) {
	f.Add(message1KiB().AppendWire(nil))
	f.Add(full().AppendWire(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, pair := range [][2]wireMessage{
			{&fixture.ThingV2{}, &fixture.ThingV2{}},
			{&fixture.Everything{}, &fixture.Everything{}},
			{&fixture.Node{}, &fixture.Node{}},
		} {
			m, again := pair[0], pair[1]
			if err := m.UnmarshalWire(b); err != nil {
				continue
			}
			if err := again.UnmarshalWire(m.AppendWire(nil)); err != nil {
				t.Fatalf("%T: re-encoded message does not decode: %v", m, err)
			}
			if !reflect.DeepEqual(m, again) {
				t.Fatalf("%T: round trip changed the message:\n%+v\n%+v", m, m, again)
			}
		}
	})
}
