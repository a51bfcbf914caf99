package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

func openStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkDB runs bbolt's consistency check over the whole file.
func checkDB(t *testing.T, s *Store) {
	t.Helper()
	err := s.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bbolt check: %v", err)
	}
}

var created = time.Unix(1_700_000_000, 123_456_789).UTC()

func fullVolume(id, name string) Volume {
	return Volume{
		ID: id, Name: name, Backend: "loop", LocalID: "lv-" + id,
		CapacityBytes: 1 << 30,
		Parameters:    map[string]string{"fsType": "ext4", "pool": "fast"},
		Context:       map[string]string{"loop.wasmcsi.io/file": "/pool/" + id},
		Capabilities: []Capability{
			{FsType: "xfs", MountFlags: []string{"noatime", ""}, AccessMode: 1},
			{Block: true, AccessMode: 5},
		},
		SourceSnapshotID: "snap-1",
		Topology:         []map[string]string{{"zone": "a"}, {}},
		CreatedAt:        created,
		Published: map[string]PublishedNode{
			"node-1": {ReadOnly: true, Context: map[string]string{"dev": "/dev/sda"}, Capability: &Capability{Block: true, AccessMode: 7}},
			"node-2": {},
		},
		MutableParameters: map[string]string{"prealloc": "true"},
	}
}

func wantCode(t *testing.T, err error, code abi.Code, target error) {
	t.Helper()
	if abi.CodeOf(err) != code {
		t.Fatalf("error %v has code %v, want %v", err, abi.CodeOf(err), code)
	}
	if target != nil && !errors.Is(err, target) {
		t.Fatalf("error %v is not %v", err, target)
	}
}

func TestVolumeCRUD(t *testing.T) {
	s := openStore(t)
	v := fullVolume("vol-1", "pvc-1")
	if err := s.PutVolume(v); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetVolume("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("GetVolume:\n got %+v\nwant %+v", got, v)
	}
	byName, err := s.VolumeByName("pvc-1")
	if err != nil || !reflect.DeepEqual(byName, v) {
		t.Fatalf("VolumeByName = %+v, %v", byName, err)
	}

	v.CapacityBytes = 2 << 30
	if err := s.PutVolume(v); err != nil {
		t.Fatalf("replace: %v", err)
	}
	if got, _ := s.GetVolume("vol-1"); got.CapacityBytes != 2<<30 {
		t.Fatalf("replace did not stick: %d", got.CapacityBytes)
	}

	if err := s.DeleteVolume("vol-1"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetVolume("vol-1")
	wantCode(t, err, abi.NotFound, ErrNotFound)
	_, err = s.VolumeByName("pvc-1")
	wantCode(t, err, abi.NotFound, ErrNotFound)
	wantCode(t, s.DeleteVolume("vol-1"), abi.NotFound, ErrNotFound)
	checkDB(t, s)
}

func TestNotFound(t *testing.T) {
	s := openStore(t)
	for name, call := range map[string]func() error{
		"GetVolume":      func() error { _, err := s.GetVolume("x"); return err },
		"VolumeByName":   func() error { _, err := s.VolumeByName("x"); return err },
		"DeleteVolume":   func() error { return s.DeleteVolume("x") },
		"GetSnapshot":    func() error { _, err := s.GetSnapshot("x"); return err },
		"SnapshotByName": func() error { _, err := s.SnapshotByName("x"); return err },
		"DeleteSnapshot": func() error { return s.DeleteSnapshot("x") },
		"GetGroup":       func() error { _, err := s.GetGroup("x"); return err },
		"DeleteGroup":    func() error { return s.DeleteGroup("x") },
		"GetStage":       func() error { _, err := s.GetStage("x"); return err },
		"DeleteStage":    func() error { return s.DeleteStage("x") },
		"GetPublish":     func() error { _, err := s.GetPublish("x", "/t"); return err },
		"DeletePublish":  func() error { return s.DeletePublish("x", "/t") },
		"empty ID":       func() error { _, err := s.GetVolume(""); return err },
	} {
		t.Run(name, func(t *testing.T) { wantCode(t, call(), abi.NotFound, ErrNotFound) })
	}
}

func TestInvalidRecords(t *testing.T) {
	s := openStore(t)
	long := string(make([]byte, maxKey+1))
	for name, call := range map[string]func() error{
		"volume without ID":        func() error { return s.PutVolume(Volume{Name: "n"}) },
		"volume name too long":     func() error { return s.PutVolume(Volume{ID: "v", Name: long}) },
		"volume not UTF-8":         func() error { return s.PutVolume(Volume{ID: "v", Context: map[string]string{"k": "\xff"}}) },
		"snapshot without ID":      func() error { return s.PutSnapshot(Snapshot{Name: "n"}) },
		"snapshot source too long": func() error { return s.PutSnapshot(Snapshot{ID: "s", SourceVolumeID: long}) },
		"group without ID":         func() error { return s.PutGroup(Group{}) },
		"group not UTF-8":          func() error { return s.PutGroup(Group{ID: "g", SnapshotIDs: []string{"\xc3"}}) },
		"stage without volume":     func() error { return s.PutStage(Stage{StagingPath: "/s"}) },
		"stage not UTF-8":          func() error { return s.PutStage(Stage{VolumeID: "v", MountFlags: []string{"\xff"}}) },
		"publish without target":   func() error { return putPublish(s, Publish{VolumeID: "v"}) },
		"publish without volume":   func() error { return putPublish(s, Publish{TargetPath: "/t"}) },
	} {
		t.Run(name, func(t *testing.T) { wantCode(t, call(), abi.InvalidArgument, nil) })
	}
	vols, _, err := s.ListVolumes("", 0)
	if err != nil || len(vols) != 0 {
		t.Fatalf("refused puts left records: %v, %v", vols, err)
	}
}

// TestNameIndex walks one name through its life: taken, refused to others,
// renamed away, freed by delete.
func TestNameIndex(t *testing.T) {
	type step struct {
		do       func(s *Store) error
		wantCode abi.Code
		names    map[string]string // name -> volume ID expected ("" = not found)
	}
	put := func(id, name string) func(*Store) error {
		return func(s *Store) error { return s.PutVolume(Volume{ID: id, Name: name}) }
	}
	del := func(id string) func(*Store) error {
		return func(s *Store) error { return s.DeleteVolume(id) }
	}
	rename := func(id, name string) func(*Store) error {
		return func(s *Store) error {
			v, err := s.GetVolume(id)
			if err != nil {
				return err
			}
			v.Name = name
			return s.PutVolume(v)
		}
	}
	steps := []step{
		{do: put("v1", "a"), names: map[string]string{"a": "v1"}},
		{do: put("v2", "a"), wantCode: abi.AlreadyExists, names: map[string]string{"a": "v1"}},
		{do: put("v1", "a"), names: map[string]string{"a": "v1"}}, // same record again: fine
		{do: put("v1", "b"), names: map[string]string{"a": "", "b": "v1"}},
		{do: put("v2", "a"), names: map[string]string{"a": "v2", "b": "v1"}},
		{do: rename("v2", "b"), wantCode: abi.AlreadyExists, names: map[string]string{"a": "v2", "b": "v1"}},
		{do: rename("v2", "c"), names: map[string]string{"a": "", "b": "v1", "c": "v2"}},
		{do: put("v1", ""), names: map[string]string{"b": ""}},
		{do: put("v3", "b"), names: map[string]string{"b": "v3"}},
		{do: del("v2"), names: map[string]string{"c": ""}},
		{do: put("v4", "c"), names: map[string]string{"c": "v4"}},
	}
	s := openStore(t)
	for i, st := range steps {
		err := st.do(s)
		if abi.CodeOf(err) != st.wantCode {
			t.Fatalf("step %d: err = %v, want code %v", i, err, st.wantCode)
		}
		if st.wantCode == abi.AlreadyExists && !errors.Is(err, ErrNameTaken) {
			t.Fatalf("step %d: %v is not ErrNameTaken", i, err)
		}
		for name, id := range st.names {
			v, err := s.VolumeByName(name)
			switch {
			case id == "" && !errors.Is(err, ErrNotFound):
				t.Fatalf("step %d: name %q: got %q, %v; want not found", i, name, v.ID, err)
			case id != "" && (err != nil || v.ID != id):
				t.Fatalf("step %d: name %q: got %q, %v; want %q", i, name, v.ID, err, id)
			}
		}
	}
	checkDB(t, s)
}

// TestInsertRefusesTakenID: an insert whose ID is recorded, under another
// name or none, writes nothing: neither the new name nor a change to the
// recorded volume or snapshot.
func TestInsertRefusesTakenID(t *testing.T) {
	s := openStore(t)
	if err := s.InsertVolume(Volume{ID: "v1", Name: "a", CapacityBytes: 10}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.InsertVolume(Volume{ID: "v1", Name: "b", CapacityBytes: 20}), abi.Internal, ErrIDTaken)
	wantCode(t, s.InsertVolume(Volume{ID: "v1", Name: "a", CapacityBytes: 10}), abi.Internal, ErrIDTaken)
	if v, err := s.VolumeByName("a"); err != nil || v.ID != "v1" || v.CapacityBytes != 10 {
		t.Fatalf("volume a after refused inserts: %+v, %v", v, err)
	}
	if _, err := s.VolumeByName("b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("refused insert recorded name b: %v", err)
	}
	wantCode(t, s.InsertVolume(Volume{ID: "v2", Name: "a"}), abi.AlreadyExists, ErrNameTaken)

	if err := s.InsertSnapshot(Snapshot{ID: "s1", Name: "sa", SourceVolumeID: "v1"}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.InsertSnapshot(Snapshot{ID: "s1", Name: "sb", SourceVolumeID: "v9"}), abi.Internal, ErrIDTaken)
	if sn, err := s.SnapshotByName("sa"); err != nil || sn.ID != "s1" || sn.SourceVolumeID != "v1" {
		t.Fatalf("snapshot sa after a refused insert: %+v, %v", sn, err)
	}
	if _, err := s.SnapshotByName("sb"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("refused insert recorded name sb: %v", err)
	}
	if of, err := snapshotsOf(s, "v9"); err != nil || len(of) != 0 {
		t.Fatalf("refused insert indexed source v9: %v, %v", of, err)
	}
	checkDB(t, s)
}

func TestSnapshots(t *testing.T) {
	s := openStore(t)
	snap := Snapshot{
		ID: "s1", Name: "snap-a", Backend: "lvm", LocalID: "lv-s1", SourceVolumeID: "v1",
		SizeBytes: 4096, Context: map[string]string{"k": "v"}, CreatedAt: created,
		ReadyToUse: true, GroupID: "g1",
	}
	puts := []Snapshot{snap,
		{ID: "s2", Name: "snap-b", SourceVolumeID: "v1"},
		{ID: "s3", Name: "snap-c", SourceVolumeID: "v2"},
		{ID: "s4", Name: "snap-d", SourceVolumeID: "v10"}, // v1 is a string prefix of v10
		{ID: "s5", Name: "snap-e"},
	}
	for _, p := range puts {
		if err := s.PutSnapshot(p); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.GetSnapshot("s1"); err != nil || !reflect.DeepEqual(got, snap) {
		t.Fatalf("GetSnapshot = %+v, %v", got, err)
	}
	if got, err := s.SnapshotByName("snap-c"); err != nil || got.ID != "s3" {
		t.Fatalf("SnapshotByName = %+v, %v", got, err)
	}
	wantCode(t, s.PutSnapshot(Snapshot{ID: "s9", Name: "snap-a"}), abi.AlreadyExists, ErrNameTaken)

	ids := func(snaps []Snapshot) []string {
		var out []string
		for _, s := range snaps {
			out = append(out, s.ID)
		}
		return out
	}
	tests := []struct {
		name   string
		filter SnapshotFilter
		want   []string
	}{
		{"all", SnapshotFilter{}, []string{"s1", "s2", "s3", "s4", "s5"}},
		{"by source", SnapshotFilter{SourceVolumeID: "v1"}, []string{"s1", "s2"}},
		{"by source not a prefix", SnapshotFilter{SourceVolumeID: "v10"}, []string{"s4"}},
		{"by source none", SnapshotFilter{SourceVolumeID: "v3"}, nil},
		{"by ID", SnapshotFilter{SnapshotID: "s3"}, []string{"s3"}},
		{"by ID missing", SnapshotFilter{SnapshotID: "s7"}, nil},
		{"by ID and source", SnapshotFilter{SnapshotID: "s3", SourceVolumeID: "v2"}, []string{"s3"}},
		{"by ID and other source", SnapshotFilter{SnapshotID: "s3", SourceVolumeID: "v1"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, next, err := s.ListSnapshots(tt.filter, "", 0)
			if err != nil || next != "" || !reflect.DeepEqual(ids(got), tt.want) {
				t.Fatalf("ListSnapshots(%+v) = %v, %q, %v; want %v", tt.filter, ids(got), next, err, tt.want)
			}
		})
	}

	// Moving a snapshot to another source and deleting one keep the index right.
	if err := s.PutSnapshot(Snapshot{ID: "s2", Name: "snap-b", SourceVolumeID: "v2"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot("s3"); err != nil {
		t.Fatal(err)
	}
	for vol, want := range map[string][]string{"v1": {"s1"}, "v2": {"s2"}} {
		got, err := snapshotsOf(s, vol)
		if err != nil || !reflect.DeepEqual(ids(got), want) {
			t.Fatalf("snapshotsOf(%s) = %v, %v; want %v", vol, ids(got), err, want)
		}
	}
	// Deleting the source volume keeps its snapshots, as CSI allows.
	if err := s.PutVolume(Volume{ID: "v1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume("v1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := snapshotsOf(s, "v1"); !reflect.DeepEqual(ids(got), []string{"s1"}) {
		t.Fatalf("snapshots of deleted volume: %v", ids(got))
	}
	checkDB(t, s)
}

func TestGroups(t *testing.T) {
	s := openStore(t)
	g := Group{ID: "g1", Name: "grp", SnapshotIDs: []string{"s1", "s2"}, CreatedAt: created}
	if err := s.PutGroup(g); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetGroup("g1"); err != nil || !reflect.DeepEqual(got, g) {
		t.Fatalf("GetGroup = %+v, %v", got, err)
	}
	if err := s.DeleteGroup("g1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetGroup("g1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("group survived delete: %v", err)
	}
}

func TestNodeRecords(t *testing.T) {
	s := openStore(t)
	st := Stage{
		VolumeID: "v1", StagingPath: "/staging/v1", Backend: "loop", Device: "/dev/loop3",
		FsType: "ext4", MountFlags: []string{"noatime"}, Context: map[string]string{"a": "b"},
		AccessMode: 7, StagedAt: created,
	}
	if err := s.PutStage(st); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetStage("v1"); err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("GetStage = %+v, %v", got, err)
	}

	// Volume "a" at "b/x" and volume "ab" at "/x" would share a key if the
	// volume ID were not length-prefixed.
	pubs := []Publish{
		{VolumeID: "a", TargetPath: "b/x", StagingPath: "/staging/a", ReadOnly: true,
			MountFlags: []string{"ro"}, Backend: "loop", Device: "/dev/loop1", FsType: "xfs",
			Context: map[string]string{"k": "v"}, AccessMode: 1, PublishedAt: created},
		{VolumeID: "ab", TargetPath: "/x", Block: true},
		{VolumeID: "a", TargetPath: "/pods/2"},
	}
	for _, p := range pubs {
		if err := putPublish(s, p); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.GetPublish("a", "b/x"); err != nil || !reflect.DeepEqual(got, pubs[0]) {
		t.Fatalf("GetPublish = %+v, %v", got, err)
	}
	if got, err := s.GetPublish("ab", "/x"); err != nil || !got.Block {
		t.Fatalf("GetPublish(ab) = %+v, %v", got, err)
	}
	of, err := s.PublishesOf("a")
	if err != nil || len(of) != 2 || of[0].TargetPath != "/pods/2" || of[1].TargetPath != "b/x" {
		t.Fatalf("PublishesOf(a) = %+v, %v", of, err)
	}
	if err := s.DeletePublish("a", "b/x"); err != nil {
		t.Fatal(err)
	}
	if of, _ := s.PublishesOf("a"); len(of) != 1 {
		t.Fatalf("PublishesOf after delete = %+v", of)
	}
	if err := s.DeleteStage("v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetStage("v1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("stage survived delete: %v", err)
	}
}

// lister adapts every paged listing to one shape for the paging tests.
type lister struct {
	name string
	put  func(s *Store, i int) error // creates record i; keys sort by i
	del  func(s *Store, i int) error
	list func(s *Store, token string, max int) (keys []string, next string, err error)
}

func key(i int) string { return fmt.Sprintf("k%03d", i) }

var listers = []lister{
	{
		name: "volumes",
		put:  func(s *Store, i int) error { return s.PutVolume(Volume{ID: key(i), Name: "n" + key(i)}) },
		del:  func(s *Store, i int) error { return s.DeleteVolume(key(i)) },
		list: func(s *Store, token string, max int) ([]string, string, error) {
			vs, next, err := s.ListVolumes(token, max)
			var keys []string
			for _, v := range vs {
				keys = append(keys, v.ID)
			}
			return keys, next, err
		},
	},
	{
		name: "snapshots",
		put: func(s *Store, i int) error {
			return s.PutSnapshot(Snapshot{ID: key(i), SourceVolumeID: "v" + key(i%2)})
		},
		del: func(s *Store, i int) error { return s.DeleteSnapshot(key(i)) },
		list: func(s *Store, token string, max int) ([]string, string, error) {
			vs, next, err := s.ListSnapshots(SnapshotFilter{}, token, max)
			var keys []string
			for _, v := range vs {
				keys = append(keys, v.ID)
			}
			return keys, next, err
		},
	},
	{
		name: "snapshots by source",
		put: func(s *Store, i int) error {
			// A record of another source between every two keeps the
			// filter honest.
			if err := s.PutSnapshot(Snapshot{ID: key(i) + "-other", SourceVolumeID: "v-other"}); err != nil {
				return err
			}
			return s.PutSnapshot(Snapshot{ID: key(i), SourceVolumeID: "v"})
		},
		del: func(s *Store, i int) error { return s.DeleteSnapshot(key(i)) },
		list: func(s *Store, token string, max int) ([]string, string, error) {
			vs, next, err := s.ListSnapshots(SnapshotFilter{SourceVolumeID: "v"}, token, max)
			var keys []string
			for _, v := range vs {
				keys = append(keys, v.ID)
			}
			return keys, next, err
		},
	},
	{
		name: "stages",
		put:  func(s *Store, i int) error { return s.PutStage(Stage{VolumeID: key(i)}) },
		del:  func(s *Store, i int) error { return s.DeleteStage(key(i)) },
		list: func(s *Store, token string, max int) ([]string, string, error) {
			ss, next, err := s.ListStages(token, max)
			var keys []string
			for _, st := range ss {
				keys = append(keys, st.VolumeID)
			}
			return keys, next, err
		},
	},
	{
		name: "publishes",
		put:  func(s *Store, i int) error { return putPublish(s, Publish{VolumeID: "vol", TargetPath: key(i)}) },
		del:  func(s *Store, i int) error { return s.DeletePublish("vol", key(i)) },
		list: func(s *Store, token string, max int) ([]string, string, error) {
			ps, next, err := s.ListPublishes(token, max)
			var keys []string
			for _, p := range ps {
				keys = append(keys, p.TargetPath)
			}
			return keys, next, err
		},
	},
}

func TestPaging(t *testing.T) {
	for _, l := range listers {
		t.Run(l.name, func(t *testing.T) {
			s := openStore(t)
			if keys, next, err := l.list(s, "", 3); err != nil || len(keys) != 0 || next != "" {
				t.Fatalf("empty listing = %v, %q, %v", keys, next, err)
			}
			const n = 7
			var want []string
			for i := range n {
				if err := l.put(s, i); err != nil {
					t.Fatal(err)
				}
				want = append(want, key(i))
			}

			for _, tc := range []struct {
				max   int
				pages []int
			}{
				{0, []int{n}},
				{1, []int{1, 1, 1, 1, 1, 1, 1}},
				{3, []int{3, 3, 1}},
				{n, []int{n}},
				{n + 5, []int{n}},
			} {
				var got []string
				var sizes []int
				token := ""
				for {
					keys, next, err := l.list(s, token, tc.max)
					if err != nil {
						t.Fatalf("max %d token %q: %v", tc.max, token, err)
					}
					got = append(got, keys...)
					sizes = append(sizes, len(keys))
					if next == "" {
						break
					}
					if len(sizes) > n+1 {
						t.Fatalf("max %d: paging does not end", tc.max)
					}
					token = next
				}
				if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(sizes, tc.pages) {
					t.Fatalf("max %d: got %v in pages %v; want %v in pages %v", tc.max, got, sizes, want, tc.pages)
				}
			}

			// A token survives deletion of the previous page's last entry
			// and of its own entry, and sees an entry added after it.
			page, next, err := l.list(s, "", 3)
			if err != nil || len(page) != 3 {
				t.Fatal(page, err)
			}
			if err := l.del(s, 2); err != nil {
				t.Fatal(err)
			}
			if err := l.del(s, 3); err != nil { // the token's own key
				t.Fatal(err)
			}
			if err := l.put(s, n); err != nil {
				t.Fatal(err)
			}
			rest, next2, err := l.list(s, next, 0)
			if wantRest := []string{key(4), key(5), key(6), key(n)}; err != nil || next2 != "" || !reflect.DeepEqual(rest, wantRest) {
				t.Fatalf("after changes: %v, %q, %v; want %v", rest, next2, err, wantRest)
			}
		})
	}
}

func TestBadToken(t *testing.T) {
	s := openStore(t)
	for i := range 4 {
		for _, l := range listers {
			if err := l.put(s, i); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PutSnapshot(Snapshot{ID: "x" + key(i), SourceVolumeID: "w"}); err != nil {
			t.Fatal(err)
		}
	}
	_, volToken, _ := s.ListVolumes("", 1)
	_, snapToken, _ := s.ListSnapshots(SnapshotFilter{}, "", 1)
	_, srcToken, _ := s.ListSnapshots(SnapshotFilter{SourceVolumeID: "v"}, "", 1)
	if volToken == "" || snapToken == "" || srcToken == "" {
		t.Fatal("listings of 4 with max 1 returned no next token")
	}
	flipped := []byte(volToken)
	flipped[len(flipped)/2] ^= 1
	if string(flipped) == volToken {
		t.Fatal("flip did nothing")
	}

	tests := []struct {
		name string
		list func(token string) error
		tok  string
	}{
		{"garbage", func(tok string) error { _, _, err := s.ListVolumes(tok, 0); return err }, "invalid-token"},
		{"not base64", func(tok string) error { _, _, err := s.ListVolumes(tok, 0); return err }, "%%%%"},
		{"too short", func(tok string) error { _, _, err := s.ListVolumes(tok, 0); return err }, "AAAA"},
		{"a volume name", func(tok string) error { _, _, err := s.ListVolumes(tok, 0); return err }, key(1)},
		{"one bit changed", func(tok string) error { _, _, err := s.ListVolumes(tok, 0); return err }, string(flipped)},
		{"snapshot token for volumes", func(tok string) error { _, _, err := s.ListVolumes(tok, 0); return err }, snapToken},
		{"volume token for snapshots", func(tok string) error {
			_, _, err := s.ListSnapshots(SnapshotFilter{}, tok, 0)
			return err
		}, volToken},
		{"source token for other source", func(tok string) error {
			_, _, err := s.ListSnapshots(SnapshotFilter{SourceVolumeID: "w"}, tok, 0)
			return err
		}, srcToken},
		{"source token unfiltered", func(tok string) error {
			_, _, err := s.ListSnapshots(SnapshotFilter{}, tok, 0)
			return err
		}, srcToken},
		{"any token with snapshot ID", func(tok string) error {
			_, _, err := s.ListSnapshots(SnapshotFilter{SnapshotID: key(1)}, tok, 0)
			return err
		}, snapToken},
		{"volume token for stages", func(tok string) error { _, _, err := s.ListStages(tok, 0); return err }, volToken},
		{"volume token for publishes", func(tok string) error { _, _, err := s.ListPublishes(tok, 0); return err }, volToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.list(tt.tok), abi.Aborted, ErrBadToken) })
	}
	// The genuine tokens do work where they belong.
	if _, _, err := s.ListVolumes(volToken, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ListSnapshots(SnapshotFilter{SourceVolumeID: "v"}, srcToken, 0); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.ListVolumes("", -1)
	wantCode(t, err, abi.InvalidArgument, nil)
}

func TestPersistence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	v := fullVolume("v1", "pvc-1")
	snap := Snapshot{ID: "s1", Name: "sn", SourceVolumeID: "v1", CreatedAt: created}
	st := Stage{VolumeID: "v1", StagingPath: "/st"}
	pub := Publish{VolumeID: "v1", TargetPath: "/t"}
	g := Group{ID: "g1", Name: "gn", SnapshotIDs: []string{"s1"}}
	for _, err := range []error{s.PutVolume(v), s.PutSnapshot(snap), s.PutStage(st), putPublish(s, pub), s.PutGroup(g)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if got, err := s.VolumeByName("pvc-1"); err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("volume after reopen = %+v, %v", got, err)
	}
	if got, err := snapshotsOf(s, "v1"); err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], snap) {
		t.Fatalf("snapshots after reopen = %+v, %v", got, err)
	}
	if got, err := s.SnapshotByName("sn"); err != nil || got.ID != "s1" {
		t.Fatalf("snapshot name after reopen = %+v, %v", got, err)
	}
	if got, err := s.GetStage("v1"); err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("stage after reopen = %+v, %v", got, err)
	}
	if got, err := s.PublishesOf("v1"); err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], pub) {
		t.Fatalf("publishes after reopen = %+v, %v", got, err)
	}
	if got, err := s.GetGroup(g.ID); err != nil || !reflect.DeepEqual(got, g) {
		t.Fatalf("group after reopen = %+v, %v", got, err)
	}
	checkDB(t, s)
}

func TestSchemaVersion(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(tx *bolt.Tx) error // run on a fresh bbolt file
		want    abi.Code
	}{
		{"empty file", func(*bolt.Tx) error { return nil }, abi.OK},
		{"current version", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put(keySchema, []byte{SchemaVersion})
		}, abi.OK},
		{"version 1, before the log", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put(keySchema, []byte{1})
		}, abi.OK},
		{"future version", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put(keySchema, []byte{SchemaVersion + 1})
		}, abi.FailedPrecondition},
		{"corrupt version", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put(keySchema, []byte{0x80})
		}, abi.DataLoss},
		{"foreign bbolt file", func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket([]byte("something-else"))
			return err
		}, abi.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(tt.prepare); err != nil {
				t.Fatal(err)
			}
			db.Close()
			s, err := Open(path)
			if s != nil {
				s.Close()
			}
			if abi.CodeOf(err) != tt.want {
				t.Fatalf("Open = %v, want code %v", err, tt.want)
			}
			if tt.want != abi.OK {
				return
			}
			// A file Open accepted carries the current version afterwards.
			db, err = bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.View(func(tx *bolt.Tx) error {
				raw := tx.Bucket(bucketMeta).Get(keySchema)
				if v, _ := binary.Uvarint(raw); v != SchemaVersion {
					t.Errorf("schema version after Open = %d, want %d", v, SchemaVersion)
				}
				return nil
			})
		})
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	s2, err := Open(path)
	if err == nil {
		s2.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, bolterrors.ErrTimeout) || time.Since(start) > 5*time.Second {
		t.Fatalf("second Open: %v after %v", err, time.Since(start))
	}
}

// TestConcurrentWriters races writers that create, rename and delete volumes
// with colliding names, then checks that the name index matches the records
// exactly. Run it with -race.
func TestConcurrentWriters(t *testing.T) {
	s := openStore(t)
	const workers, rounds = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	// Each worker owns its IDs, so what it last did to one is what the
	// store must hold at the end: a refusal of another call in the same
	// batch must not undo it.
	expect := make([]map[string]int64, workers) // ID -> capacity; -1 deleted
	for w := range workers {
		expect[w] = map[string]int64{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				id := fmt.Sprintf("w%d-%d", w, r%7)
				name := fmt.Sprintf("name-%d", r%5) // shared between workers
				var err error
				switch r % 3 {
				case 0, 1:
					err = s.PutVolume(Volume{ID: id, Name: name, CapacityBytes: int64(r)})
					if err == nil {
						expect[w][id] = int64(r)
					}
				case 2:
					err = s.DeleteVolume(id)
					if err == nil {
						expect[w][id] = -1
					}
				}
				if err != nil && !errors.Is(err, ErrNameTaken) && !errors.Is(err, ErrNotFound) {
					errs <- err
					return
				}
				if _, _, err := s.ListVolumes("", 5); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	for _, m := range expect {
		for id, capacity := range m {
			v, err := s.GetVolume(id)
			switch {
			case capacity < 0 && !errors.Is(err, ErrNotFound):
				t.Errorf("deleted %s is back: %+v, %v", id, v, err)
			case capacity >= 0 && (err != nil || v.CapacityBytes != capacity):
				t.Errorf("%s = %+v, %v; want capacity %d", id, v, err, capacity)
			}
		}
	}
	vols, _, err := s.ListVolumes("", 0)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, v := range vols {
		if v.Name == "" {
			continue
		}
		if other, dup := names[v.Name]; dup {
			t.Fatalf("name %q on %s and %s", v.Name, other, v.ID)
		}
		names[v.Name] = v.ID
		if got, err := s.VolumeByName(v.Name); err != nil || got.ID != v.ID {
			t.Fatalf("index for %q = %q, %v; want %q", v.Name, got.ID, err, v.ID)
		}
	}
	var indexed int
	if err := s.db.View(func(tx *bolt.Tx) error {
		indexed = tx.Bucket(bucketVolumeNames).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if indexed != len(names) {
		t.Fatalf("name index has %d entries, records have %d names", indexed, len(names))
	}
	checkDB(t, s)
}

// snapshotsOf lists every snapshot of volumeID, as the host's
// ListSnapshots with a source filter does.
func snapshotsOf(s *Store, volumeID string) ([]Snapshot, error) {
	snaps, _, err := s.ListSnapshots(SnapshotFilter{SourceVolumeID: volumeID}, "", 0)
	return snaps, err
}

// putPublish records p and waits until it is durable, as NodePublishVolume
// does before it answers.
func putPublish(s *Store, p Publish) error {
	wait, err := s.PutPublishAsync(p)
	if err != nil {
		return err
	}
	return wait()
}
