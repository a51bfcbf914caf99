package modules

import (
	"bufio"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// pages encodes a page count as the grow fixture's request.
func pages(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }

// growConfig grants the grow fixtures the test host call (its "block"
// request waits at the gate).
func growConfig(names ...string) func(*Config) {
	return func(c *Config) {
		for _, n := range names {
			c.Grants[n] = Grant{HostCalls: []string{"test"}}
		}
	}
}

// TestMemoryBudget: a grow past a module's share of the daemon's budget
// fails the call with RESOURCE_EXHAUSTED and leaves the others alone; an
// instance that grew past the idle bound is closed after its call; every
// byte comes back to the budget.
func TestMemoryBudget(t *testing.T) {
	g := newGate()
	r, errs := startRuntime(t, map[string]string{"grow": "grow", "other": "grow", "third": "grow"}, g, func(c *Config) {
		growConfig("grow", "other", "third")(c)
		c.MemoryBudget = 64 << 20 // one module may hold 32 MiB
		c.Limits.MemoryPages = 1024
		c.Limits.PoolSize = 2
		c.Limits.IdleMemoryPages = 16
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m, other, third := mustModule(t, r, "grow"), mustModule(t, r, "other"), mustModule(t, r, "third")
	ctx := context.Background()

	// 16 MiB held at the gate; 32 MiB more is past the module's share.
	held := make(chan error, 1)
	go func() {
		_, err := m.Call(ctx, abi.OpDeleteVolume, pages(256))
		held <- err
	}()
	g.waitEntered(t, 1)
	_, err := m.Call(ctx, abi.OpCreateVolume, pages(512))
	wantCode(t, err, abi.ResourceExhausted, "guest memory budget exhausted", "of the 32.0 MiB one module may hold")
	// Another module has its own share: 32 MiB fit beside the flood.
	if _, err := other.Call(ctx, abi.OpCreateVolume, pages(511)); err != nil {
		t.Fatalf("another module beside the flood: %v", err)
	}
	g.open()
	if err := <-held; err != nil {
		t.Fatalf("the held call: %v", err)
	}
	// Both grown instances were closed after their calls: past the idle
	// bound of 16 pages.
	if n := m.pool.size() + other.pool.size(); n != 0 {
		t.Errorf("%d instances kept after growing past the idle bound", n)
	}
	if used := m.mem.used.Load() + other.mem.used.Load(); used != 0 {
		t.Errorf("closed instances still hold %d bytes of the modules' shares", used)
	}
	// The whole share serves one call once the flood is gone.
	if _, err := m.Call(ctx, abi.OpCreateVolume, pages(512)); err != nil {
		t.Fatalf("the module's whole share: %v", err)
	}

	// What is left: the one-page instance of third from the load.
	if used, want := r.mem.used.Load(), int64(m.pool.size()+other.pool.size()+third.pool.size())*pageSize; used != want || third.pool.size() != 1 {
		t.Errorf("the budget holds %d bytes, want %d (one page per idle instance)", used, want)
	}
}

// TestMemoryBudgetShared: while two modules' calls hold all of the daemon's
// budget, a third module's grow fails RESOURCE_EXHAUSTED; once they return,
// the memory their idle instances keep is given to the third.
func TestMemoryBudgetShared(t *testing.T) {
	g := newGate()
	r, errs := startRuntime(t, map[string]string{"a": "grow", "b": "grow", "c": "grow"}, g, func(c *Config) {
		growConfig("a", "b", "c")(c)
		c.MemoryBudget = 64 << 20
		c.Limits.MemoryPages = 1024
		c.Limits.PoolSize = 1
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	ctx := context.Background()
	held := make(chan error, 2)
	// Each module's one instance holds a page already: a and b grown to 511
	// pages and c's page leave one page of the 1024 the budget has.
	for _, name := range []string{"a", "b"} {
		go func() {
			_, err := mustModule(t, r, name).Call(ctx, abi.OpDeleteVolume, pages(511))
			held <- err
		}()
	}
	g.waitEntered(t, 2)
	c := mustModule(t, r, "c")
	_, err := c.Call(ctx, abi.OpCreateVolume, pages(3))
	wantCode(t, err, abi.ResourceExhausted, "guest memory budget exhausted", "all modules 63.9 MiB of the daemon's 64.0 MiB")
	g.open()
	for range 2 {
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Call(ctx, abi.OpCreateVolume, pages(3)); err != nil {
		t.Fatalf("after the others let go: %v", err)
	}
	if n := mustModule(t, r, "a").pool.size() + mustModule(t, r, "b").pool.size(); n != 1 {
		t.Errorf("a and b keep %d idle instances, want 1: one was to be closed to make room for c", n)
	}
}

// rss is this process's resident set size in bytes.
func rss(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status to read the resident set size from: ", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// settledRSS is the resident set size once the Go heap has returned what it
// can, so what it measures is memory still held.
func settledRSS(t *testing.T) int64 {
	runtime.GC()
	debug.FreeOSMemory()
	return rss(t)
}

const mib = 1 << 20

// TestMemoryFloodRSS measures the process's resident set size while a
// module grows every pooled instance to its cap and writes all of it, after
// the calls end, and after the module is unloaded: memory must come back
// when the calls end (the grown instances are closed and their memory
// unmapped), not stay held by idle instances. A second flood under a
// budget smaller than the flood keeps the peak within the budget.
func TestMemoryFloodRSS(t *testing.T) {
	const (
		capPages = 4096 // 256 MiB per instance
		pool     = 4
	)
	t.Run("returns", func(t *testing.T) {
		g := newGate()
		r, errs := startRuntime(t, map[string]string{"grow": "grow"}, g, func(c *Config) {
			growConfig("grow")(c)
			c.MemoryBudget = 2 << 30
			c.Limits.MemoryPages = capPages
			c.Limits.PoolSize = pool
			c.Limits.CallTimeout = 2 * time.Minute
		})
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		m := mustModule(t, r, "grow")
		base := settledRSS(t)
		var wg sync.WaitGroup
		errc := make(chan error, pool)
		for range pool {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := m.Call(context.Background(), abi.OpDeleteVolume, pages(capPages))
				errc <- err
			}()
		}
		// Under load the floods take a while; a call that fails instead
		// of reaching the gate says why.
		for entered := 0; entered < pool; {
			select {
			case <-g.entered:
				entered++
			case err := <-errc:
				t.Fatalf("a flood call ended before the gate: %v", err)
			case <-time.After(2 * time.Minute):
				t.Fatalf("only %d of %d flood calls reached the gate", entered, pool)
			}
		}
		during := rss(t)
		g.open()
		wg.Wait()
		close(errc)
		for err := range errc {
			if err != nil {
				t.Fatal(err)
			}
		}
		after := settledRSS(t)
		dir := r.cfg.Dir
		if err := os.Remove(filepath.Join(dir, "grow.wasm")); err != nil {
			t.Fatal(err)
		}
		if errs := r.Reload(context.Background()); len(errs) != 0 {
			t.Fatal(errs)
		}
		select {
		case <-m.pool.drained:
		case <-time.After(10 * time.Second):
			t.Fatal("the unloaded module's instances were not closed")
		}
		stopped := settledRSS(t)
		t.Logf("RSS: baseline %d MiB, %d instances flooded to %d MiB each %d MiB, after the calls %d MiB, module unloaded %d MiB",
			base/mib, pool, capPages*pageSize/mib, during/mib, after/mib, stopped/mib)
		if during-base < pool*capPages*pageSize*3/4 {
			t.Fatalf("the flood raised RSS by only %d MiB: the test does not measure what it means to", (during-base)/mib)
		}
		if after-base > 64*mib {
			t.Errorf("after the calls RSS is %d MiB above its baseline: idle instances hold the flood", (after-base)/mib)
		}
		if stopped-base > 64*mib {
			t.Errorf("after unloading the module RSS is %d MiB above its baseline", (stopped-base)/mib)
		}
	})

	t.Run("budget", func(t *testing.T) {
		const (
			budget = 512 * mib // one module may hold 256 MiB
			flood  = 3072      // pages: 192 MiB, so one flood at a time fits
		)
		r, errs := startRuntime(t, map[string]string{"grow": "grow"}, nil, func(c *Config) {
			growConfig("grow")(c)
			c.MemoryBudget = budget
			c.Limits.MemoryPages = capPages
			c.Limits.PoolSize = pool
			c.Limits.CallTimeout = 2 * time.Minute
		})
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		m := mustModule(t, r, "grow")
		base := settledRSS(t)
		var peak atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				if v := rss(t); v > peak.Load() {
					peak.Store(v)
				}
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
		var wg sync.WaitGroup
		var ok, exhausted atomic.Int64
		for range 2 * pool {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := m.Call(context.Background(), abi.OpCreateVolume, pages(flood))
				switch abi.CodeOf(err) {
				case abi.OK:
					ok.Add(1)
				case abi.ResourceExhausted:
					exhausted.Add(1)
				default:
					t.Errorf("flood call: %v", err)
				}
			}()
		}
		wg.Wait()
		close(stop)
		<-sampled
		t.Logf("RSS: baseline %d MiB, peak %d MiB during %d floods of %d MiB under a budget of %d MiB (%d MiB per module): %d succeeded, %d RESOURCE_EXHAUSTED",
			base/mib, peak.Load()/mib, 2*pool, flood*pageSize/mib, budget/mib, budget/2/mib, ok.Load(), exhausted.Load())
		if over := peak.Load() - base; over > budget/2+64*mib {
			t.Errorf("peak RSS %d MiB above baseline, over the module's share of %d MiB", over/mib, budget/2/mib)
		}
		if exhausted.Load() == 0 {
			t.Errorf("no flood call was refused by a budget smaller than the floods")
		}
	})
}
