package keylock

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// step is one action in a scripted sequence: lock keys under a handle name,
// or unlock a handle, and the expected outcome.
type step struct {
	lock   []string // keys to TryLock (nil: this step unlocks)
	handle string   // name to keep the unlock func under / to unlock
	wantOK bool
	held   []string // keys that must be held after the step
	free   []string // keys that must be free after the step
}

func TestTryLock(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"one key", []step{
			{lock: []string{"a"}, handle: "1", wantOK: true, held: []string{"a"}, free: []string{"b"}},
			{lock: []string{"a"}, handle: "2", wantOK: false, held: []string{"a"}},
			{handle: "1", free: []string{"a"}},
			{lock: []string{"a"}, handle: "3", wantOK: true, held: []string{"a"}},
		}},
		{"all or none", []step{
			{lock: []string{"b"}, handle: "1", wantOK: true},
			{lock: []string{"a", "b", "c"}, handle: "2", wantOK: false, held: []string{"b"}, free: []string{"a", "c"}},
			{handle: "1", free: []string{"b"}},
			{lock: []string{"a", "b", "c"}, handle: "3", wantOK: true, held: []string{"a", "b", "c"}},
			{lock: []string{"c"}, handle: "4", wantOK: false},
			{handle: "3", free: []string{"a", "b", "c"}},
		}},
		{"disjoint sets coexist", []step{
			{lock: []string{"name/x", "vol/1"}, handle: "1", wantOK: true},
			{lock: []string{"name/y", "vol/2"}, handle: "2", wantOK: true, held: []string{"name/x", "vol/1", "name/y", "vol/2"}},
			{lock: []string{"name/z", "vol/1"}, handle: "3", wantOK: false, free: []string{"name/z"}},
		}},
		{"repeated key counts once", []step{
			{lock: []string{"a", "a"}, handle: "1", wantOK: true, held: []string{"a"}},
			{handle: "1", free: []string{"a"}},
		}},
		{"no keys", []step{
			{lock: []string{}, handle: "1", wantOK: true},
			{handle: "1"},
		}},
		{"second unlock does not free a later holder", []step{
			{lock: []string{"a", "b"}, handle: "1", wantOK: true},
			{handle: "1", free: []string{"a", "b"}},
			{lock: []string{"a"}, handle: "2", wantOK: true},
			{lock: []string{"b"}, handle: "3", wantOK: true},
			{handle: "1", held: []string{"a", "b"}},
		}},
		{"empty string is a key", []step{
			{lock: []string{""}, handle: "1", wantOK: true, held: []string{""}},
			{lock: []string{""}, handle: "2", wantOK: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := New()
			handles := map[string]func(){}
			for i, s := range tt.steps {
				if s.lock != nil {
					unlock, ok := l.TryLock(s.lock...)
					if ok != s.wantOK {
						t.Fatalf("step %d: TryLock(%q) ok = %v, want %v", i, s.lock, ok, s.wantOK)
					}
					if ok != (unlock != nil) {
						t.Fatalf("step %d: TryLock ok = %v but unlock nil = %v", i, ok, unlock == nil)
					}
					if ok {
						handles[s.handle] = unlock
					}
				} else {
					handles[s.handle]()
				}
				for _, k := range s.held {
					if !l.Held(k) {
						t.Errorf("step %d: %q not held", i, k)
					}
				}
				for _, k := range s.free {
					if l.Held(k) {
						t.Errorf("step %d: %q held", i, k)
					}
				}
			}
		})
	}
}

// TestCallerSliceReuse checks that TryLock keeps its own copy of the keys:
// the caller overwriting its slice must not change what unlock releases.
func TestCallerSliceReuse(t *testing.T) {
	l := New()
	keys := []string{"a", "b"}
	unlock, ok := l.TryLock(keys...)
	if !ok {
		t.Fatal("TryLock failed on empty set")
	}
	keys[0], keys[1] = "x", "y"
	unlock()
	for _, k := range []string{"a", "b"} {
		if l.Held(k) {
			t.Errorf("%q still held after unlock", k)
		}
	}
}

// TestMutualExclusion runs goroutines that take random pairs of keys from a
// small set and checks that no key is ever inside two critical sections.
func TestMutualExclusion(t *testing.T) {
	const (
		workers = 8
		keys    = 12 // few keys, so shards and keys collide often
		rounds  = 3000
	)
	l := New()
	var inside [keys]atomic.Int32
	var wins, losses atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				a, b := r.IntN(keys), r.IntN(keys)
				unlock, ok := l.TryLock(strconv.Itoa(a), strconv.Itoa(b))
				if !ok {
					losses.Add(1)
					continue
				}
				wins.Add(1)
				for _, k := range uniq(a, b) {
					if n := inside[k].Add(1); n != 1 {
						t.Errorf("key %d has %d holders", k, n)
					}
				}
				for _, k := range uniq(a, b) {
					inside[k].Add(-1)
				}
				unlock()
			}
		}()
	}
	wg.Wait()
	for k := range keys {
		if l.Held(strconv.Itoa(k)) {
			t.Errorf("key %d held after all workers finished", k)
		}
	}
	if wins.Load() == 0 {
		t.Error("no TryLock ever succeeded")
	}
	t.Logf("%d acquired, %d refused", wins.Load(), losses.Load())
}

func uniq(a, b int) []int {
	if a == b {
		return []int{a}
	}
	return []int{a, b}
}

func BenchmarkTryLock(b *testing.B) {
	b.Run("one key", func(b *testing.B) {
		l := New()
		b.ReportAllocs()
		for b.Loop() {
			unlock, ok := l.TryLock("vol/pvc-0123456789")
			if !ok {
				b.Fatal("held")
			}
			unlock()
		}
	})
	b.Run("two keys", func(b *testing.B) {
		l := New()
		b.ReportAllocs()
		for b.Loop() {
			unlock, ok := l.TryLock("name/pvc-0123456789", "vol/src-0123456789")
			if !ok {
				b.Fatal("held")
			}
			unlock()
		}
	})
	b.Run("parallel distinct keys", func(b *testing.B) {
		l := New()
		var next atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			key := fmt.Sprintf("vol/%d", next.Add(1))
			for pb.Next() {
				unlock, ok := l.TryLock(key)
				if !ok {
					b.Error("held")
					return
				}
				unlock()
			}
		})
	})
}
