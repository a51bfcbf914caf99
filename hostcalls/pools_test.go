package hostcalls_test

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// fakePool counts how often it was opened and closed.
type fakePool struct {
	root   string
	closed atomic.Bool
}

type poolLog struct {
	opened, closed atomic.Int32
}

func (l *poolLog) cache() *hostcalls.Pools[*fakePool] {
	return hostcalls.NewPools(func(root string) (*fakePool, error) {
		l.opened.Add(1)
		return &fakePool{root: root}, nil
	}, func(p *fakePool) error {
		if p.closed.Swap(true) {
			panic("pool closed twice")
		}
		l.closed.Add(1)
		return nil
	})
}

func TestPoolsReuseOnePoolPerRoot(t *testing.T) {
	var log poolLog
	c := log.cache()
	a, b := t.TempDir(), t.TempDir()
	for range 3 {
		for _, root := range []string{a, b} {
			p, release, err := c.Acquire(root)
			if err != nil {
				t.Fatal(err)
			}
			if p.root != root {
				t.Fatalf("Acquire(%s) gave the pool of %s", root, p.root)
			}
			release()
		}
	}
	if got := log.opened.Load(); got != 2 {
		t.Errorf("opened %d pools for two roots, want 2", got)
	}
	if got := log.closed.Load(); got != 0 {
		t.Errorf("closed %d pools that are still current", got)
	}
	if c.Len() != 2 {
		t.Errorf("Len = %d, want 2", c.Len())
	}
}

// A root replaced by another folder (as when another filesystem is mounted
// there) gets a new pool; the old one closes once its last user is done.
func TestPoolsReplacedRootOpensAgain(t *testing.T) {
	var log poolLog
	c := log.cache()
	root := filepath.Join(t.TempDir(), "pool")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	old, releaseOld, err := c.Acquire(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(root, root+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cur, releaseCur, err := c.Acquire(root)
	if err != nil {
		t.Fatal(err)
	}
	if cur == old {
		t.Fatal("a replaced root kept its old pool")
	}
	if old.closed.Load() {
		t.Fatal("the old pool was closed while a call still used it")
	}
	releaseOld()
	if !old.closed.Load() {
		t.Fatal("the old pool was not closed after its last user released it")
	}
	releaseCur()
	if cur.closed.Load() {
		t.Fatal("the current pool was closed")
	}
	if got := log.opened.Load(); got != 2 {
		t.Errorf("opened %d pools, want 2", got)
	}
}

func TestPoolsMissingRoot(t *testing.T) {
	var log poolLog
	c := log.cache()
	_, _, err := c.Acquire(filepath.Join(t.TempDir(), "gone"))
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("Acquire of a missing root: %v, want FAILED_PRECONDITION", err)
	}
	if log.opened.Load() != 0 {
		t.Error("a missing root was opened")
	}
}

func TestPoolsConcurrent(t *testing.T) {
	var log poolLog
	c := log.cache()
	root := t.TempDir()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				p, release, err := c.Acquire(root)
				if err != nil {
					t.Error(err)
					return
				}
				if p.closed.Load() {
					t.Error("Acquire returned a closed pool")
				}
				release()
			}
		}()
	}
	wg.Wait()
	// Racing first acquires may each open one; all but the cached one are
	// closed at once.
	if opened, closed := log.opened.Load(), log.closed.Load(); opened-closed != 1 {
		t.Errorf("opened %d, closed %d: want exactly one pool left open", opened, closed)
	}
}

// An idle pool is closed, so its filesystem can be unmounted, and the next
// call opens it again.
func TestPoolsIdleClosed(t *testing.T) {
	var log poolLog
	c := log.cache()
	root := t.TempDir()
	p, release, err := c.Acquire(root)
	if err != nil {
		t.Fatal(err)
	}
	release()
	deadline := time.Now().Add(20 * hostcalls.PoolIdle)
	for !p.closed.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("an idle pool was still open after %v", 20*hostcalls.PoolIdle)
		}
		time.Sleep(hostcalls.PoolIdle / 10)
	}
	if c.Len() != 0 {
		t.Errorf("Len = %d after the idle pool closed, want 0", c.Len())
	}
	q, release, err := c.Acquire(root)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if q == p || q.closed.Load() {
		t.Fatal("Acquire after the idle close returned the closed pool")
	}
}
