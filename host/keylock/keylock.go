// Package keylock gives per-key try-locks for CSI's rule of one operation per
// volume at a time: a request whose volume, name or snapshot is busy answers
// ABORTED at once and the CO retries, instead of queueing behind slow work.
//
// TryLock takes every key it is given or none, so a CreateVolume can hold its
// name and its source volume together without a lock order and without
// deadlock. Keys are spread over shards, each with its own mutex, so there is
// no single hot mutex.
//
// keylock must never block a caller on a held key and never hold a shard
// mutex beyond the few map operations of one call. It knows nothing about
// what keys mean; callers choose prefixes ("vol/", "name/") to keep kinds
// apart.
package keylock

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/cpu"
)

// shardCount is a power of two well above the number of operations a node
// runs at once, so that two live keys rarely share a shard mutex.
const shardCount = 64

// Locks is a set of held keys. The zero value is not usable; call New.
type Locks struct {
	seed   maphash.Seed
	shards [shardCount]shard
}

type shard struct {
	mu   sync.Mutex
	held map[string]struct{}
	_    cpu.CacheLinePad // keep neighbouring shards' mutexes off one cache line
}

// New returns an empty set of locks.
func New() *Locks {
	l := &Locks{seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].held = make(map[string]struct{})
	}
	return l
}

func (l *Locks) shardOf(key string) int {
	return int(maphash.String(l.seed, key) & (shardCount - 1))
}

// TryLock takes all keys, or none if any of them is held, without waiting.
// On success it returns ok and the function that releases them; calling that
// function again does nothing. A key repeated in one call counts once;
// TryLock with no keys succeeds.
func (l *Locks) TryLock(keys ...string) (unlock func(), ok bool) {
	switch len(keys) {
	case 0:
		return func() {}, true
	case 1:
		return l.tryOne(keys[0])
	}
	return l.tryMany(slices.Clone(keys)) // the caller may reuse its slice; unlock needs ours
}

func (l *Locks) tryMany(keys []string) (func(), bool) {
	idx := make([]int, 2*len(keys))
	idx, order := idx[:len(keys)], idx[len(keys):]
	for i, k := range keys {
		idx[i] = l.shardOf(k)
	}
	// Lock the shards involved in ascending order: two calls that share
	// shards then cannot deadlock, and the check and the take are atomic.
	copy(order, idx)
	slices.Sort(order)
	order = slices.Compact(order)
	l.lockShards(order)
	for i, k := range keys {
		if _, busy := l.shards[idx[i]].held[k]; busy {
			l.unlockShards(order)
			return nil, false
		}
	}
	for i, k := range keys {
		l.shards[idx[i]].held[k] = struct{}{}
	}
	l.unlockShards(order)

	var done atomic.Bool
	return func() {
		if done.Swap(true) {
			return
		}
		l.lockShards(order)
		for i, k := range keys {
			delete(l.shards[idx[i]].held, k)
		}
		l.unlockShards(order)
	}, true
}

func (l *Locks) tryOne(key string) (func(), bool) {
	s := &l.shards[l.shardOf(key)]
	s.mu.Lock()
	if _, busy := s.held[key]; busy {
		s.mu.Unlock()
		return nil, false
	}
	s.held[key] = struct{}{}
	s.mu.Unlock()

	var done atomic.Bool
	return func() {
		if done.Swap(true) {
			return
		}
		s.mu.Lock()
		delete(s.held, key)
		s.mu.Unlock()
	}, true
}

func (l *Locks) lockShards(order []int) {
	for _, i := range order {
		l.shards[i].mu.Lock()
	}
}

func (l *Locks) unlockShards(order []int) {
	for _, i := range order {
		l.shards[i].mu.Unlock()
	}
}

// Held reports whether key is held now. The answer may be stale by the time
// it is read; it is meant for tests and diagnostics, not for deciding
// whether to call TryLock.
func (l *Locks) Held(key string) bool {
	s := &l.shards[l.shardOf(key)]
	s.mu.Lock()
	_, busy := s.held[key]
	s.mu.Unlock()
	return busy
}
