package state

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi/wire"
)

// codec binds one record type's encode and decode for table tests.
type codec[T any] struct {
	enc func(*T) ([]byte, error)
	dec func([]byte) (T, error)
}

func roundTrip[T any](t *testing.T, c codec[T], v T) {
	t.Helper()
	b, err := c.enc(&v)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	got, err := c.dec(b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, v)
	}
	again, _ := c.enc(&got)
	if !bytes.Equal(again, b) {
		t.Fatalf("encoding is not deterministic:\n%x\n%x", b, again)
	}
}

var (
	volumeCodec   = codec[Volume]{encodeVolume, decodeVolume}
	snapshotCodec = codec[Snapshot]{encodeSnapshot, decodeSnapshot}
	groupCodec    = codec[Group]{encodeGroup, decodeGroup}
	stageCodec    = codec[Stage]{encodeStage, decodeStage}
	publishCodec  = codec[Publish]{encodePublish, decodePublish}
)

func TestCodecRoundTrip(t *testing.T) {
	big := strings.Repeat("x", 300) // nested bodies over 127 bytes move on close
	bigVolume := fullVolume("v-big", "n")
	bigVolume.Published["node-3"] = PublishedNode{Context: map[string]string{"k": big}}
	bigVolume.Capabilities = append(bigVolume.Capabilities, Capability{MountFlags: []string{big}})
	bigVolume.Topology = append(bigVolume.Topology, map[string]string{big: big})
	negative := Volume{ID: "v", CapacityBytes: -1, Capabilities: []Capability{{AccessMode: -3}},
		CreatedAt: time.Unix(-5, 7).UTC()}

	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"volume zero", func(t *testing.T) { roundTrip(t, volumeCodec, Volume{}) }},
		{"volume full", func(t *testing.T) { roundTrip(t, volumeCodec, fullVolume("v1", "pvc-1")) }},
		{"volume large nested", func(t *testing.T) { roundTrip(t, volumeCodec, bigVolume) }},
		{"volume negative numbers", func(t *testing.T) { roundTrip(t, volumeCodec, negative) }},
		{"volume empty capability", func(t *testing.T) {
			roundTrip(t, volumeCodec, Volume{ID: "v", Capabilities: []Capability{{}, {Block: true}}})
		}},
		{"snapshot", func(t *testing.T) {
			roundTrip(t, snapshotCodec, Snapshot{ID: "s", Name: "n", Backend: "b", LocalID: "l",
				SourceVolumeID: "v", SizeBytes: 1 << 40, Context: map[string]string{"": ""},
				CreatedAt: created, ReadyToUse: true, GroupID: "g",
				Topology: []map[string]string{{"zone": "a"}, {"zone": "b"}}})
		}},
		{"group", func(t *testing.T) {
			roundTrip(t, groupCodec, Group{ID: "g", Name: "n", SnapshotIDs: []string{"a", "", "c"}, CreatedAt: created,
				SourceVolumeIDs: []string{"v1", "v2"}, Parameters: map[string]string{"k": "v", "": ""}})
		}},
		{"stage", func(t *testing.T) {
			roundTrip(t, stageCodec, Stage{VolumeID: "v", StagingPath: "/s", Backend: "b", Device: "/dev/x",
				Directory: "/d", FsType: "ext4", MountFlags: []string{"a", "b"}, Block: true,
				Context: map[string]string{"k": "v"}, AccessMode: 3, StagedAt: created,
				VolumeContext: map[string]string{"path": "/p"}, BackendFlags: []string{"nouuid"}, DeviceFile: "2049:12",
				Unstaging: true, LostReported: true})
		}},
		{"publish", func(t *testing.T) {
			roundTrip(t, publishCodec, Publish{VolumeID: "v", TargetPath: "/t", StagingPath: "/s",
				ReadOnly: true, Block: true, MountFlags: []string{"ro"}, Backend: "b", Device: "/dev/x",
				FsType: "xfs", Context: map[string]string{"k": "v"}, AccessMode: 5, PublishedAt: created})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}

// TestCodecSkipsUnknownFields is the forward-compatibility promise: fields
// a newer daemon added, of any wire type, are skipped.
func TestCodecSkipsUnknownFields(t *testing.T) {
	v := fullVolume("v1", "pvc-1")
	b, err := encodeVolume(&v)
	if err != nil {
		t.Fatal(err)
	}
	b = wire.AppendInt64(b, 99, 42)
	b = wire.AppendString(b, 100, "from the future")
	m := 0
	b, m = wire.BeginMessage(b, 101)
	b = wire.AppendString(b, 1, "nested")
	b = wire.EndMessage(b, m)
	got, err := decodeVolume(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("got %+v\nwant %+v", got, v)
	}
}

func TestCodecRejectsCorrupt(t *testing.T) {
	full, _ := encodeVolume(&Volume{ID: "vol-1", Name: "name"})
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"string cut short", full[:len(full)-2], wire.ErrTruncated},
		{"length past end", []byte{1<<3 | 2, 50, 'a'}, wire.ErrTruncated},
		{"known field with wrong wire type", wire.AppendInt64(nil, 1, 7), wire.ErrMismatch},
		{"field number zero", []byte{0 << 3, 1}, wire.ErrFieldNumber},
		{"string not UTF-8", wire.AppendString(nil, 2, "\xff"), wire.ErrUTF8},
		{"bad time", wire.AppendString(nil, 12, "\x08"), wire.ErrTruncated},
		{"bad capability", wire.AppendString(nil, 8, "\x12\x05ab"), wire.ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeVolume(tt.b)
			if !errors.Is(err, tt.want) {
				t.Fatalf("decode %x: %v, want %v", tt.b, err, tt.want)
			}
		})
	}
}

func TestStringField(t *testing.T) {
	b, _ := encodeSnapshot(&Snapshot{ID: "s", Name: "n", SourceVolumeID: "v", SizeBytes: 5})
	for field, want := range map[int]string{snapshotNameField: "n", snapshotSourceField: "v", 10: ""} {
		if got, err := stringField(b, field); err != nil || got != want {
			t.Errorf("stringField(%d) = %q, %v; want %q", field, got, err, want)
		}
	}
	if _, err := stringField([]byte{0x12, 9}, 2); err == nil {
		t.Error("stringField accepted a truncated record")
	}
}

// FuzzDecodeVolume checks that no input panics the decoder and that whatever
// decodes survives a round trip unchanged.
func FuzzDecodeVolume(f *testing.F) {
	for _, v := range []Volume{{}, fullVolume("v", "n"), {ID: "v", CreatedAt: time.Unix(-1, 5)}} {
		b, err := encodeVolume(&v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x62, 0x02, 0x08, 0x01}) // a time with only seconds
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeVolume(b)
		if err != nil {
			return
		}
		again, err := encodeVolume(&v)
		if err != nil {
			t.Fatalf("decoded record does not encode: %v", err)
		}
		w, err := decodeVolume(again)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !reflect.DeepEqual(v, w) {
			t.Fatalf("round trip changed the record:\n%+v\n%+v", v, w)
		}
	})
}

// BenchmarkCodec compares the record encoding with the alternatives it was
// chosen over. gob gets a fresh encoder per record, since each bbolt value
// must decode on its own.
func BenchmarkCodec(b *testing.B) {
	v := fullVolume("pvc-4f2d1c9e-8a7b-4c1d-9e0f-123456789abc", "pvc-4f2d1c9e-8a7b-4c1d-9e0f-123456789abc")
	formats := []struct {
		name string
		enc  func(*Volume) ([]byte, error)
		dec  func([]byte) (Volume, error)
	}{
		{"wire", encodeVolume, decodeVolume},
		{"json", func(v *Volume) ([]byte, error) { return json.Marshal(v) },
			func(b []byte) (v Volume, err error) { return v, json.Unmarshal(b, &v) }},
		{"gob", func(v *Volume) ([]byte, error) {
			var buf bytes.Buffer
			err := gob.NewEncoder(&buf).Encode(v)
			return buf.Bytes(), err
		}, func(b []byte) (v Volume, err error) { return v, gob.NewDecoder(bytes.NewReader(b)).Decode(&v) }},
	}
	for _, f := range formats {
		enc, err := f.enc(&v)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(f.name+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.enc(&v); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(enc)), "bytes/record")
		})
		b.Run(f.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.dec(enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
