package state

import (
	"bytes"
	"encoding/hex"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The on-disk format of records is a promise to every daemon that ever
// wrote one: records encoded by this codec are pinned in
// testdata/records.golden (one "name hex" line each), and any codec that
// replaces it must read them back equal and write the same bytes. Every
// field of every record kind is set, so every field number is pinned.
// WASMCSI_UPDATE_GOLDEN=1 rewrites the file: only ever to add a record.

func goldenRecords() map[string]func() (enc []byte, check func([]byte) (any, any, error), err error) {
	at := time.Unix(1_700_000_000, 123_456_789).UTC()
	vol := Volume{
		ID: "v-1", Name: "pvc-1", Backend: "loop", LocalID: "lv-1",
		CapacityBytes: 1 << 30,
		Parameters:    map[string]string{"fsType": "ext4", "pool": "fast", "": ""},
		Context:       map[string]string{"loop.wasmcsi.io/file": "/pool/v-1"},
		Capabilities: []Capability{
			{FsType: "xfs", MountFlags: []string{"noatime", ""}, AccessMode: 1},
			{Block: true, AccessMode: 5},
		},
		SourceSnapshotID: "snap-1", SourceVolumeID: "v-0",
		Topology:  []map[string]string{{"zone": "a", "rack": "r1"}, {}},
		CreatedAt: at,
		Published: map[string]PublishedNode{
			"node-1": {ReadOnly: true, Context: map[string]string{"dev": "/dev/sda"}, Capability: &Capability{Block: true, AccessMode: 7}},
			"node-2": {},
		},
		MutableParameters: map[string]string{"prealloc": "true"},
	}
	snap := Snapshot{ID: "s-1", Name: "snap", Backend: "loop", LocalID: "ls-1", SourceVolumeID: "v-1",
		SizeBytes: 1 << 40, Context: map[string]string{"k": "v"}, CreatedAt: at, ReadyToUse: true,
		GroupID: "g-1", Topology: []map[string]string{{"zone": "a"}, {"zone": "b"}}}
	group := Group{ID: "g-1", Name: "grp", SnapshotIDs: []string{"s-1", "", "s-3"}, CreatedAt: at,
		SourceVolumeIDs: []string{"v-1", "v-2"}, Parameters: map[string]string{"k": "v"}}
	stage := Stage{VolumeID: "v-1", StagingPath: "/staging/v-1", Backend: "loop", Device: "/dev/loop3",
		Directory: "/d", FsType: "ext4", MountFlags: []string{"noatime"}, Block: true,
		Context: map[string]string{"loop": "/dev/loop3"}, AccessMode: 7, StagedAt: at,
		VolumeContext: map[string]string{"path": "/p"}, BackendFlags: []string{"nouuid"},
		DeviceFile: "2049:12", Unstaging: true, LostReported: true}
	pub := Publish{VolumeID: "v-1", TargetPath: "/pods/x/mount", StagingPath: "/staging/v-1", ReadOnly: true,
		Block: true, MountFlags: []string{"ro", "bind"}, Backend: "loop", Device: "/dev/loop4", FsType: "xfs",
		Context: map[string]string{"k": "v"}, AccessMode: 5, PublishedAt: at}
	eph := Ephemeral{COVolumeID: "csi-inline-1", Phase: EphemeralPublished, Backend: "localdir", Name: "ephemeral-csi-inline-1",
		Parameters: map[string]string{"size": "1Gi"}, RequiredBytes: 1 << 30,
		Capability: Capability{FsType: "ext4", MountFlags: []string{"noatime"}, AccessMode: 1}, ReadOnly: true,
		TargetPath: "/pods/y/mount", StagingPath: "/staging/e-1", VolumeID: "v-2", CapacityBytes: 2 << 30,
		Context: map[string]string{"k": "v"}, CreatedAt: at}
	old := Volume{ID: "v-old", CreatedAt: time.Unix(-5, 7).UTC(), CapacityBytes: -1,
		Published: map[string]PublishedNode{"n": {Context: map[string]string{"k": "v"}}}} // no Capability: written before it was kept

	snapDeleting := Snapshot{ID: "s-2", Name: "snap-2", Backend: "dir", LocalID: "s-2", SourceVolumeID: "v-1", Deleting: true}
	deleting := Volume{ID: "v-2", Name: "pvc-2", Backend: "dir", LocalID: "pvc-2", Deleting: true}
	intent := Intent{Key: "volume/pvc-3", Op: "create_volume", Backend: "dir", Request: []byte{0x0a, 0x05, 'p', 'v', 'c', '-', '3'},
		SourceSnapshotID: "s-1", SourceVolumeID: "v-1", CreatedAt: at}

	entry := func(v any, enc func() ([]byte, error), dec func([]byte) (any, error)) func() ([]byte, func([]byte) (any, any, error), error) {
		return func() ([]byte, func([]byte) (any, any, error), error) {
			b, err := enc()
			return b, func(in []byte) (any, any, error) { got, err := dec(in); return got, v, err }, err
		}
	}
	return map[string]func() ([]byte, func([]byte) (any, any, error), error){
		"volume":            entry(vol, func() ([]byte, error) { return encode[Volume](&vol) }, func(b []byte) (any, error) { return decode[Volume](b) }),
		"volume-old":        entry(old, func() ([]byte, error) { return encode[Volume](&old) }, func(b []byte) (any, error) { return decode[Volume](b) }),
		"volume-empty":      entry(Volume{}, func() ([]byte, error) { return encode[Volume](&Volume{}) }, func(b []byte) (any, error) { return decode[Volume](b) }),
		"snapshot":          entry(snap, func() ([]byte, error) { return encode[Snapshot](&snap) }, func(b []byte) (any, error) { return decode[Snapshot](b) }),
		"group":             entry(group, func() ([]byte, error) { return encode[Group](&group) }, func(b []byte) (any, error) { return decode[Group](b) }),
		"stage":             entry(stage, func() ([]byte, error) { return encode[Stage](&stage) }, func(b []byte) (any, error) { return decode[Stage](b) }),
		"volume-deleting":   entry(deleting, func() ([]byte, error) { return encode[Volume](&deleting) }, func(b []byte) (any, error) { return decode[Volume](b) }),
		"snapshot-deleting": entry(snapDeleting, func() ([]byte, error) { return encode[Snapshot](&snapDeleting) }, func(b []byte) (any, error) { return decode[Snapshot](b) }),
		"intent":            entry(intent, func() ([]byte, error) { return encode[Intent](&intent) }, func(b []byte) (any, error) { return decode[Intent](b) }),
		"publish":           entry(pub, func() ([]byte, error) { return encode[Publish](&pub) }, func(b []byte) (any, error) { return decode[Publish](b) }),
		"ephemeral":         entry(eph, func() ([]byte, error) { return encode[Ephemeral](&eph) }, func(b []byte) (any, error) { return decode[Ephemeral](b) }),
	}
}

const goldenFile = "testdata/records.golden"

func TestRecordsGolden(t *testing.T) {
	records := goldenRecords()
	if os.Getenv("WASMCSI_UPDATE_GOLDEN") == "1" {
		var lines []string
		for name, rec := range records {
			b, _, err := rec()
			if err != nil {
				t.Fatal(name, err)
			}
			lines = append(lines, name+" "+hex.EncodeToString(b))
		}
		slices.Sort(lines)
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenFile, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(src)), "\n") {
		name, hx, _ := strings.Cut(line, " ")
		want, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rec, ok := records[name]
		if !ok {
			t.Errorf("%s: golden record without a fixture", name)
			continue
		}
		seen[name] = true
		b, check, err := rec()
		if err != nil {
			t.Fatalf("%s: encode: %v", name, err)
		}
		if !bytes.Equal(b, want) {
			t.Errorf("%s: encodes to\n%x\nthe format on disk is\n%x", name, b, want)
		}
		got, fixture, err := check(want)
		if err != nil {
			t.Errorf("%s: the record on disk does not decode: %v", name, err)
		} else if !reflect.DeepEqual(got, fixture) {
			t.Errorf("%s: the record on disk decodes to\n%+v\nwant %+v", name, got, fixture)
		}
	}
	for name := range records {
		if !seen[name] {
			t.Errorf("%s: no golden record (WASMCSI_UPDATE_GOLDEN=1 adds it)", name)
		}
	}
}
