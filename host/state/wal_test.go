package state

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	bolt "go.etcd.io/bbolt"
)

// quietOptions never start a checkpoint by themselves within a test.
func quietOptions() options {
	return options{maxEntries: 1 << 30, maxBytes: 1 << 40, maxDelay: time.Hour, segmentBytes: 1 << 20}
}

// openQuiet opens a store at path that checkpoints only when the test says
// so. The file is created and closed first, which leaves a spare segment:
// the log then starts in a prepared segment and no checkpoint moves it.
func openQuiet(t *testing.T, path string) *Store {
	t.Helper()
	s, err := open(path, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = open(path, quietOptions()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// crash leaves s as a killed process would: nothing checkpointed, files
// closed as the kernel closes them. Close on it does nothing.
func crash(s *Store) {
	s.mu.Lock()
	s.closed = true
	s.room.Broadcast()
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	s.log.close()
	s.db.DB.Close()
}

// freeze moves s's active layer to frozen, as a checkpoint does before it
// writes the layer into bbolt, and leaves it there, so reads merge three
// sources. The store must not checkpoint after it; end it with crash.
func freeze(t *testing.T, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.layers.Load()
	if l.frozen != nil {
		t.Fatal("a layer is frozen already")
	}
	s.publishLayers(&layers{active: &layer{}, frozen: l.active})
}

// segments returns the paths of the log segments of the state file at path.
func segments(t *testing.T, path string) []string {
	t.Helper()
	nums, err := listSegments(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range nums {
		out = append(out, segmentName(path, n))
	}
	return out
}

// recordOffsets returns where the records of a segment's bytes start, and
// where the last one ends.
func recordOffsets(t *testing.T, data []byte) (offs []int, end int) {
	t.Helper()
	for end < len(data) && !allZero(data[end:]) {
		_, n, err := parseRecord(data[end:])
		if err != nil {
			t.Fatalf("record at %d: %v", end, err)
		}
		offs = append(offs, end)
		end += n
	}
	return offs, end
}

// putVolumes puts volumes v0..v(n-1), each in a call of its own, so each
// record goes to disk in a write of its own.
func putVolumes(t *testing.T, s *Store, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := s.PutVolume(Volume{ID: fmt.Sprintf("v%d", i), Name: fmt.Sprintf("n%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
}

// wantVolumes checks that exactly volumes v0..v(n-1) exist, with their
// names indexed.
func wantVolumes(t *testing.T, s *Store, n int) {
	t.Helper()
	vols, _, err := s.ListVolumes("", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, v := range vols {
		got = append(got, v.ID)
		if byName, err := s.VolumeByName(v.Name); err != nil || byName.ID != v.ID {
			t.Errorf("name %q: %q, %v; want %s", v.Name, byName.ID, err, v.ID)
		}
	}
	for i := range n {
		want = append(want, fmt.Sprintf("v%d", i))
	}
	slices.Sort(want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("volumes %v, want %v", got, want)
	}
}

// TestCrashReplaysLog kills a writer whose store never checkpointed, so
// every acknowledged write is only in the log, and checks that Open replays
// them all.
func TestCrashReplaysLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	// A file closed cleanly leaves a spare, so the writer's log starts in
	// a prepared segment and no checkpoint runs to move it.
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	acks := killWriter(t, path, crashQuietEnv+"=1")

	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var inBolt int
	db.View(func(tx *bolt.Tx) error { inBolt = tx.Bucket(bucketVolumes).Stats().KeyN; return nil })
	ckpt, _, err := getCheckpoint(db)
	db.Close()
	if err != nil || ckpt != 0 || inBolt != 0 {
		t.Fatalf("writer checkpointed before the kill (checkpoint %d, %d volumes, %v): this test needs the log alone", ckpt, inBolt, err)
	}
	if len(segments(t, path)) == 0 {
		t.Fatal("no log segment after the kill")
	}

	s, err = Open(path)
	if err != nil {
		t.Fatalf("open after crash: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if ckpt, _, err := getCheckpoint(s.db.DB); err != nil || ckpt == 0 {
		t.Fatalf("checkpoint after replay = %d, %v", ckpt, err)
	}
	checkAcks(t, s, acks)
}

// TestTornTail damages the end of the last segment as a crash during its
// last write can, and checks that the file opens with every earlier record
// and goes on taking writes.
func TestTornTail(t *testing.T) {
	const n = 10 // records; the last is damaged
	garbage := func(k int) []byte {
		b := make([]byte, k)
		for i := range b {
			b[i] = byte(i*151 + 7)
		}
		return b
	}
	tests := []struct {
		name   string
		damage func(data []byte, last, end int) []byte
	}{
		{"cut in the last record", func(d []byte, last, end int) []byte { return d[:(last+end)/2] }},
		{"cut in the last header", func(d []byte, last, _ int) []byte { return d[:last+3] }},
		{"cut after a length", func(d []byte, last, _ int) []byte { return d[:last+4] }},
		{"last record half zero", func(d []byte, last, end int) []byte {
			clear(d[(last+end)/2 : end])
			return d
		}},
		{"last record zero", func(d []byte, last, end int) []byte {
			clear(d[last:end])
			return d
		}},
		{"garbage over the last record", func(d []byte, last, end int) []byte {
			copy(d[last:], garbage(end-last))
			return d
		}},
		{"garbage over the last record and beyond", func(d []byte, last, end int) []byte {
			copy(d[last:], garbage(end-last+300))
			return d
		}},
		{"checksum of the last record", func(d []byte, last, _ int) []byte {
			d[last+5] ^= 0x10
			return d
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s := openQuiet(t, path)
			putVolumes(t, s, 0, n)
			crash(s)
			segs := segments(t, path)
			seg := segs[len(segs)-1]
			data, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			offs, end := recordOffsets(t, data)
			if len(offs) != n {
				t.Fatalf("%d records in the last segment, want %d", len(offs), n)
			}
			if err := os.WriteFile(seg, tt.damage(data, offs[n-1], end), 0o600); err != nil {
				t.Fatal(err)
			}

			s, err = Open(path)
			if err != nil {
				t.Fatalf("open with a torn tail: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			wantVolumes(t, s, n-1)
			// The log goes on after the torn record, and survives
			// another crash.
			putVolumes(t, s, n-1, n+2)
			crash(s)
			if s, err = Open(path); err != nil {
				t.Fatalf("open after the second crash: %v", err)
			}
			wantVolumes(t, s, n+2)
			checkDB(t, s)
		})
	}
}

// rotate moves s's log to the spare segment without a checkpoint, so both
// segments hold records that bbolt does not.
func rotate(t *testing.T, s *Store) {
	t.Helper()
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	if !s.spare {
		if err := s.prepareSpare(nil); err != nil {
			t.Fatal(err)
		}
	}
	cur, _, _ := s.log.current()
	next, err := s.useSpare(cur + 1)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.log.rotate(next)
	s.mu.Unlock()
}

// TestDamagedLogIsDataLoss damages records that were acknowledged before
// later ones, and checks that Open refuses the file with DATA_LOSS and
// leaves the log as it found it.
func TestDamagedLogIsDataLoss(t *testing.T) {
	tests := []struct {
		name   string
		rotate bool                              // records 0-4 in one segment, 5-9 in the next
		damage func(t *testing.T, segs []string) // segments in order
	}{
		{"flipped bit in a middle record", false, func(t *testing.T, segs []string) {
			editSegment(t, segs[0], func(d []byte, offs []int, _ int) { d[offs[4]+recordHeader+3] ^= 1 })
		}},
		{"length of a middle record", false, func(t *testing.T, segs []string) {
			editSegment(t, segs[0], func(d []byte, offs []int, _ int) { d[offs[4]+2] = 0x7f })
		}},
		{"zeroed middle record", false, func(t *testing.T, segs []string) {
			editSegment(t, segs[0], func(d []byte, offs []int, _ int) { clear(d[offs[4]:offs[5]]) })
		}},
		{"last record of an earlier segment", true, func(t *testing.T, segs []string) {
			editSegment(t, segs[0], func(d []byte, offs []int, end int) { d[end-1] ^= 1 })
		}},
		{"earlier segment cut short", true, func(t *testing.T, segs []string) {
			editSegment(t, segs[0], func(d []byte, offs []int, end int) { clear(d[offs[len(offs)-1]:end]) })
		}},
		{"earlier segment missing", true, func(t *testing.T, segs []string) {
			if err := os.Remove(segs[0]); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s := openQuiet(t, path)
			putVolumes(t, s, 0, 5)
			if tt.rotate {
				rotate(t, s)
			}
			putVolumes(t, s, 5, 10)
			crash(s)
			segs := segments(t, path)
			if want := map[bool]int{false: 1, true: 2}[tt.rotate]; len(segs) != want {
				t.Fatalf("%d segments, want %d", len(segs), want)
			}
			tt.damage(t, segs)
			before := snapshotDir(t, path)

			s, err := Open(path)
			if err == nil {
				s.Close()
				t.Fatal("Open accepted a log that lost acknowledged records")
			}
			wantCode(t, err, abi.DataLoss, nil)
			if after := snapshotDir(t, path); !reflect.DeepEqual(after, before) {
				t.Fatalf("failed Open changed the log:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// editSegment rewrites a segment after edit changed its bytes; edit gets
// the offsets of its records and the end of the last.
func editSegment(t *testing.T, seg string, edit func(data []byte, offs []int, end int)) {
	t.Helper()
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	offs, end := recordOffsets(t, data)
	edit(data, offs, end)
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// snapshotDir returns the names and contents of the log files next to path.
func snapshotDir(t *testing.T, path string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if !strings.Contains(e.Name(), ".wal.") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(filepath.Dir(path), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

// TestReadLog checks the end-of-log rule on logs built record by record:
// which damage is a torn last write and which lost acknowledged records.
func TestReadLog(t *testing.T) {
	type rec struct{ seq, first uint64 }
	// writes returns records 1..n, grouped in writes that begin at the
	// given sequence numbers.
	writes := func(n uint64, starts ...uint64) []rec {
		var out []rec
		first := uint64(1)
		for seq := uint64(1); seq <= n; seq++ {
			if slices.Contains(starts, seq) {
				first = seq
			}
			out = append(out, rec{seq, first})
		}
		return out
	}
	build := func(recs []rec) (data []byte, offs []int) {
		for _, r := range recs {
			offs = append(offs, len(data))
			data = appendRecord(data, r.seq, r.first, []change{{bucket: 1, key: []byte(fmt.Sprint("k", r.seq)), val: []byte("v")}})
		}
		offs = append(offs, len(data))
		return append(data, make([]byte, 256)...), offs // the zero tail of a prepared segment
	}
	each := func(n uint64) []uint64 {
		var s []uint64
		for i := uint64(1); i <= n; i++ {
			s = append(s, i)
		}
		return s
	}
	tests := []struct {
		name string
		segs [][]rec
		ckpt uint64
		// damage changes segment i's bytes; offs are its record offsets
		// and the end of the last record.
		damage func(segs [][]byte, offs [][]int)
		want   []uint64 // seqs read; nil with wantLoss
		loss   bool
	}{
		{name: "whole", segs: [][]rec{writes(5, each(5)...)}, want: each(5)},
		{name: "after a checkpoint", segs: [][]rec{writes(5, each(5)...)}, ckpt: 3, want: []uint64{4, 5}},
		{name: "checkpoint covers all", segs: [][]rec{writes(5, each(5)...)}, ckpt: 5, want: nil},
		{name: "two segments", segs: [][]rec{writes(3, 1, 2, 3), {{4, 4}, {5, 5}}}, want: each(5)},
		{name: "log resumes after a gap", segs: [][]rec{{{5, 5}, {6, 6}}}, ckpt: 3, loss: true},
		{name: "record repeated", segs: [][]rec{{{1, 1}, {2, 2}, {2, 2}, {3, 3}}}, loss: true},
		{
			name: "torn last write, first record bad", segs: [][]rec{writes(5, 1, 2, 3)},
			damage: func(s [][]byte, o [][]int) { s[0][o[0][2]+recordHeader] ^= 1 },
			want:   []uint64{1, 2},
		},
		{
			name: "torn last write, first record zero", segs: [][]rec{writes(5, 1, 2, 3)},
			damage: func(s [][]byte, o [][]int) { clear(s[0][o[0][2]:o[0][3]]) },
			want:   []uint64{1, 2},
		},
		{
			name: "torn last write, its length garbage", segs: [][]rec{writes(5, 1, 2, 3)},
			damage: func(s [][]byte, o [][]int) { s[0][o[0][2]+3] = 0xee },
			want:   []uint64{1, 2},
		},
		{
			name: "bad record before a later write", segs: [][]rec{writes(5, 1, 2, 3, 4)},
			damage: func(s [][]byte, o [][]int) { s[0][o[0][2]+recordHeader] ^= 1 },
			loss:   true,
		},
		{
			name: "zeroed record before a later write", segs: [][]rec{writes(5, 1, 2, 3, 4)},
			damage: func(s [][]byte, o [][]int) { clear(s[0][o[0][2]:o[0][3]]) },
			loss:   true,
		},
		{
			name: "garbage length before a later write", segs: [][]rec{writes(5, 1, 2, 3, 4)},
			damage: func(s [][]byte, o [][]int) { s[0][o[0][2]+3] = 0xee },
			loss:   true,
		},
		{
			name: "garbage after the end", segs: [][]rec{writes(3, each(3)...)},
			damage: func(s [][]byte, o [][]int) { copy(s[0][o[0][3]:], "\x05\x00\x00\x00garbage") },
			want:   each(3),
		},
		{
			name: "torn end of an earlier segment", segs: [][]rec{writes(3, each(3)...), {{4, 4}}},
			damage: func(s [][]byte, o [][]int) { s[0][o[0][3]-1] ^= 1 },
			loss:   true,
		},
		{
			name: "torn end before an empty segment", segs: [][]rec{writes(3, each(3)...), {}},
			damage: func(s [][]byte, o [][]int) { s[0][o[0][3]-1] ^= 1 },
			want:   []uint64{1, 2},
		},
		{
			name: "garbage in an empty last segment", segs: [][]rec{writes(3, each(3)...), {}},
			damage: func(s [][]byte, o [][]int) { copy(s[1][10:], "garbage") },
			want:   each(3),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var segs []segmentData
			var datas [][]byte
			var offs [][]int
			for i, recs := range tt.segs {
				d, o := build(recs)
				datas, offs = append(datas, d), append(offs, o)
				segs = append(segs, segmentData{name: fmt.Sprint("seg", i), data: d})
			}
			if tt.damage != nil {
				tt.damage(datas, offs)
			}
			got, err := readLog(segs, tt.ckpt)
			if tt.loss {
				if err == nil {
					t.Fatalf("read %d records, want DATA_LOSS", len(got))
				}
				wantCode(t, err, abi.DataLoss, nil)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for _, r := range got {
				seqs = append(seqs, r.seq)
			}
			if !reflect.DeepEqual(seqs, tt.want) {
				t.Fatalf("read records %v, want %v", seqs, tt.want)
			}
		})
	}
}

// TestPagingAcrossLayers lists records that lie partly in bbolt, partly in
// a frozen layer and partly in the active one: checkpointed, pending,
// checkpointed and then deleted or overwritten, deleted and put again.
func TestPagingAcrossLayers(t *testing.T) {
	for _, l := range listers {
		t.Run(l.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s := openQuiet(t, path)
			do := func(f func(*Store, int) error, keys ...int) {
				t.Helper()
				for _, i := range keys {
					if err := f(s, i); err != nil {
						t.Fatalf("key %d: %v", i, err)
					}
				}
			}
			do(l.put, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
			if err := s.checkpointAll(); err != nil {
				t.Fatal(err)
			}
			do(l.del, 2, 5)      // in bbolt, deleted in the overlay
			do(l.put, 3, 12, 13) // overwritten, new
			do(l.del, 13)        // new and gone again
			freeze(t, s)
			do(l.put, 5, 14) // deleted in the frozen layer, back in the active one
			do(l.del, 7, 12) // in bbolt / in the frozen layer, deleted in the active one
			want := []int{0, 1, 3, 4, 5, 6, 8, 9, 10, 11, 14}
			checkPages(t, s, l, want)

			// The log replays to the same state.
			crash(s)
			s, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			checkPages(t, s, l, want)
		})
	}
}

// checkPages pages through l with several page sizes and checks that the
// pages hold exactly the keys want, in order.
func checkPages(t *testing.T, s *Store, l lister, want []int) {
	t.Helper()
	var wantKeys []string
	for _, i := range want {
		wantKeys = append(wantKeys, key(i))
	}
	for _, max := range []int{0, 1, 2, 3, 5, len(want), len(want) + 1} {
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			keys, next, err := l.list(s, token, max)
			if err != nil {
				t.Fatalf("max %d token %q: %v", max, token, err)
			}
			if max > 0 && len(keys) > max {
				t.Fatalf("max %d: page of %d", max, len(keys))
			}
			got = append(got, keys...)
			if next == "" {
				break
			}
			if pages > len(want) {
				t.Fatalf("max %d: paging does not end", max)
			}
			token = next
		}
		if !reflect.DeepEqual(got, wantKeys) {
			t.Fatalf("max %d: got %v, want %v", max, got, wantKeys)
		}
	}
}

// TestCursorMerge checks the merged cursor and Get against a model, over
// random keys spread across bbolt, a frozen and an active layer, and that a
// layer version stays as it was while newer versions are built from it.
func TestCursorMerge(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "bolt.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	randKey := func() []byte { return []byte(fmt.Sprintf("k%02d", rng.IntN(60))) }
	model := map[string]string{}
	const b = 1 // volumes
	err = db.Update(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucket(allBuckets[b])
		if err != nil {
			return err
		}
		for range 30 {
			k := randKey()
			v := "bolt-" + string(k)
			model[string(k)] = v
			if err := bk.Put(k, []byte(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// fill returns l with n random puts and deletes, applied to model too.
	fill := func(l *layer, name string, n int) *layer {
		tx := &txn{active: l, writable: true}
		for i := range n {
			k := randKey()
			if rng.IntN(3) == 0 {
				tx.set(b, k, nil, true)
				delete(model, string(k))
			} else {
				v := fmt.Sprintf("%s-%d", name, i)
				tx.set(b, k, []byte(v), false)
				model[string(k)] = v
			}
		}
		return tx.active
	}
	frozen := fill(&layer{}, "frozen", 40)
	active := fill(&layer{}, "active", 40)
	snapshot := maps.Clone(model)
	newer := fill(active, "newer", 40) // must leave active as it was

	check := func(active *layer, want map[string]string) {
		t.Helper()
		btx, err := db.Begin(false)
		if err != nil {
			t.Fatal(err)
		}
		defer btx.Rollback()
		tx := &txn{tx: btx, active: active, frozen: frozen}
		bk := tx.Bucket(allBuckets[b])
		keys := slices.Sorted(maps.Keys(want))
		for i := 0; i <= 60; i++ {
			start := []byte(fmt.Sprintf("k%02d", i))
			var got []string
			c := bk.Cursor()
			for k, v := c.Seek(start); k != nil; k, v = c.Next() {
				got = append(got, string(k)+"="+string(v))
			}
			var exp []string
			for _, k := range keys {
				if k >= string(start) {
					exp = append(exp, k+"="+want[k])
				}
			}
			if !slices.Equal(got, exp) {
				t.Fatalf("seek %s:\n got %v\nwant %v", start, got, exp)
			}
			v, ok := want[string(start)]
			if g := bk.Get(start); (g != nil) != ok || string(g) != v {
				t.Fatalf("Get(%s) = %q, want %q (%v)", start, g, v, ok)
			}
		}
	}
	check(active, snapshot)
	check(newer, model)
}

// TestConcurrentCheckpoints races writers and readers against checkpoints
// forced every few writes and segments rotated every few kilobytes, then
// checks the state against what the writers did, before and after a
// reopen. Readers check that each of their calls sees one consistent
// state. Run it with -race.
func TestConcurrentCheckpoints(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := open(path, options{maxEntries: 8, maxBytes: 4 << 10, maxDelay: time.Millisecond, segmentBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	const workers, rounds = 6, 150
	type vol struct {
		name     string
		capacity int64
	}
	vols := make([]map[string]vol, workers)     // what each worker's volumes are; absent: deleted
	snaps := make([]map[string]string, workers) // snapshot ID -> source volume
	var wg sync.WaitGroup
	errs := make(chan error, workers+2)
	done := make(chan struct{})
	for w := range workers {
		vols[w], snaps[w] = map[string]vol{}, map[string]string{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for r := range rounds {
				id := fmt.Sprintf("w%d-v%d", w, rng.IntN(8))
				snap := fmt.Sprintf("w%d-s%d", w, rng.IntN(8))
				name := fmt.Sprintf("name-%d", rng.IntN(12)) // shared between workers
				var err error
				switch rng.IntN(6) {
				case 0, 1, 3: // 3 was a rename; a put with another name is one
					if err = s.PutVolume(Volume{ID: id, Name: name, CapacityBytes: int64(r)}); err == nil {
						vols[w][id] = vol{name, int64(r)}
					}
				case 2:
					if err = s.DeleteVolume(id); err == nil {
						delete(vols[w], id)
					}
				case 4:
					if err = s.PutSnapshot(Snapshot{ID: snap, SourceVolumeID: id}); err == nil {
						snaps[w][snap] = id
					}
				case 5:
					if err = s.DeleteSnapshot(snap); err == nil {
						delete(snaps[w], snap)
					}
				}
				if err != nil && !errors.Is(err, ErrNameTaken) && !errors.Is(err, ErrNotFound) {
					errs <- err
					return
				}
			}
		}()
	}
	var readers sync.WaitGroup
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				page, _, err := s.ListVolumes("", 4)
				for _, v := range page {
					if err != nil {
						break
					}
					var byName Volume
					if byName, err = s.VolumeByName(v.Name); errors.Is(err, ErrNotFound) {
						err = nil // renamed or deleted since the page
					} else if err == nil && byName.Name != v.Name {
						err = fmt.Errorf("VolumeByName(%q) returned volume %s named %q", v.Name, byName.ID, byName.Name)
					}
					if err == nil {
						var of []Snapshot
						of, err = snapshotsOf(s, v.ID)
						for _, sn := range of {
							if sn.SourceVolumeID != v.ID {
								err = fmt.Errorf("snapshotsOf(%s) returned %s of %s", v.ID, sn.ID, sn.SourceVolumeID)
							}
						}
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ckpt, keep, err := getCheckpoint(s.db.DB); err != nil || ckpt == 0 || keep < 3 {
		t.Fatalf("checkpoint %d, segment %d, %v: the test did not exercise checkpoints and rotation", ckpt, keep, err)
	}

	check := func(s *Store) {
		t.Helper()
		want := map[string]vol{}
		for _, m := range vols {
			for id, v := range m {
				want[id] = v
			}
		}
		list, _, err := s.ListVolumes("", 0)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]vol{}
		for _, v := range list {
			got[v.ID] = vol{v.Name, v.CapacityBytes}
			if byName, err := s.VolumeByName(v.Name); err != nil || byName.ID != v.ID {
				t.Errorf("name %q: %q, %v; want %s", v.Name, byName.ID, err, v.ID)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("volumes:\n got %v\nwant %v", got, want)
		}
		wantSnaps := map[string]string{}
		for _, m := range snaps {
			for id, src := range m {
				wantSnaps[id] = src
			}
		}
		gotSnaps := map[string]string{}
		for id := range want {
			of, err := snapshotsOf(s, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, sn := range of {
				gotSnaps[sn.ID] = sn.SourceVolumeID
			}
		}
		all, _, err := s.ListSnapshots(SnapshotFilter{}, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range all {
			if _, ok := want[sn.SourceVolumeID]; !ok {
				gotSnaps[sn.ID] = sn.SourceVolumeID // of a deleted volume
			}
		}
		if !reflect.DeepEqual(gotSnaps, wantSnaps) {
			t.Fatalf("snapshots:\n got %v\nwant %v", gotSnaps, wantSnaps)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	check(s)
	checkDB(t, s)
}

// TestLogFailure breaks the log's file under the store and checks that the
// write fails, later calls fail too, and the next Open has everything that
// was acknowledged before.
func TestLogFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openQuiet(t, path)
	putVolumes(t, s, 0, 3)
	s.log.mu.Lock()
	s.log.segs[len(s.log.segs)-1].f.Close() // every write to it fails now
	s.log.mu.Unlock()

	err := s.PutVolume(Volume{ID: "lost"})
	wantCode(t, err, abi.Internal, nil)
	if !strings.Contains(err.Error(), "state log failed") {
		t.Fatalf("error does not name the log: %v", err)
	}
	wantCode(t, s.PutVolume(Volume{ID: "later"}), abi.Internal, nil)
	wantCode(t, s.DeleteVolume("v0"), abi.Internal, nil)
	_, err = s.GetVolume("v0")
	wantCode(t, err, abi.Internal, nil)
	wantCode(t, s.Close(), abi.Internal, nil)

	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	wantVolumes(t, s, 3)
}

// TestCloseLeavesSpare checks that Close leaves the bbolt file with every
// change and only a spare segment next to it, which the next Open writes
// into from its first record.
func TestCloseLeavesSpare(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	for round := range 3 {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if round > 0 {
			if _, prepared, _ := s.log.current(); prepared == 0 {
				t.Errorf("round %d: the log appends instead of using the spare", round)
			}
		}
		putVolumes(t, s, 0, 3*(round+1))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if want := []string{"state.db", "state.db.wal.spare"}; !slices.Equal(names, want) {
			t.Fatalf("round %d: files %v, want %v", round, names, want)
		}
		spare, err := os.ReadFile(spareName(path))
		if err != nil || !allZero(spare) || len(spare) < 4<<20 {
			t.Fatalf("spare of %d bytes, all zero %v, %v", len(spare), allZero(spare), err)
		}
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		if n := tx.Bucket(bucketVolumes).Stats().KeyN; n != 9 {
			return fmt.Errorf("bbolt holds %d volumes after Close, want 9", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
