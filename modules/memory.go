package modules

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tetratelabs/wazero/experimental"
)

// DefaultMemoryBudget is the linear memory all instances of a Runtime may
// hold together when Config.MemoryBudget is zero.
const DefaultMemoryBudget = 1 << 30

// pageSize is the size of a WebAssembly page.
const pageSize = 64 << 10

// memoryBudget bounds the linear memory a group of instances holds: every
// instance of a Runtime, or every instance of one module.
type memoryBudget struct {
	limit int64
	used  atomic.Int64
}

// take accounts n more bytes, or reports false and accounts nothing when
// that would pass the limit.
func (b *memoryBudget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *memoryBudget) give(n int64) { b.used.Add(-n) }

// take accounts n more bytes of m's instances against the module's share
// and the daemon's budget, or nothing.
func (m *Module) takeMemory(n int64) bool {
	if !m.mem.take(n) {
		return false
	}
	if !m.rt.mem.take(n) {
		m.mem.give(n)
		return false
	}
	if m.memGauge != nil {
		m.memGauge.Add(float64(n))
	}
	return true
}

// reserveMemory is takeMemory that, when the budget is short, first closes
// idle instances (this module's when its share is short, any module's when
// the daemon's budget is) and tries again: idle memory never starves a call.
func (m *Module) reserveMemory(n int64) bool {
	if m.takeMemory(n) {
		return true
	}
	for m.mem.used.Load()+n > m.mem.limit && m.pool.shed() {
	}
	for _, o := range m.rt.set.Load().sorted {
		for m.rt.mem.used.Load()+n > m.rt.mem.limit && o.pool.shed() {
		}
	}
	return m.takeMemory(n)
}

func (m *Module) giveMemory(n int64) {
	m.mem.give(n)
	m.rt.mem.give(n)
	if m.memGauge != nil {
		m.memGauge.Sub(float64(n))
	}
}

// budgetError describes a grow or an instance the budget refused.
func (m *Module) budgetError(what string) string {
	return fmt.Sprintf("guest memory budget exhausted: %s; this module's instances hold %s of the %s one module may hold, all modules %s of the daemon's %s",
		what, mebibytes(m.mem.used.Load()), mebibytes(m.mem.limit), mebibytes(m.rt.mem.used.Load()), mebibytes(m.rt.mem.limit))
}

func mebibytes(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// guestMemory is one instance's linear memory. wazero allocates it through
// experimental.WithMemoryAllocator, so every byte the guest holds is
// accounted (Module.takeMemory) before the guest can touch it, and a grow
// over the budget fails as memory.grow's -1 instead of growing the daemon.
// On Linux the memory is a reservation of the module's whole cap that grows
// in place (no copy on grow) and is unmapped when the instance is closed, so
// the daemon's RSS falls at once (memory_linux.go).
type guestMemory struct {
	m    *Module
	back *backing

	mu       sync.Mutex
	size     int64 // bytes accounted against the budgets
	refused  int64 // size of the last grow the budget refused in this call, 0 if none
	busy     bool  // a call runs on the instance
	freed    bool  // wazero freed it during a call: release when the call ends
	released bool
}

// newGuestMemory reserves address space for a memory of up to maxBytes and
// accounts its first minBytes, which instantiation allocates.
func (m *Module) newGuestMemory(minBytes, maxBytes int64) (*guestMemory, error) {
	if !m.reserveMemory(minBytes) {
		return nil, fmt.Errorf("%s", m.budgetError("a new instance needs "+mebibytes(minBytes)))
	}
	back, err := newBacking(int(maxBytes))
	if err != nil {
		m.giveMemory(minBytes)
		return nil, fmt.Errorf("reserve %s of address space: %w", mebibytes(maxBytes), err)
	}
	return &guestMemory{m: m, back: back, size: minBytes}, nil
}

// Allocate implements experimental.MemoryAllocator: the instance's one
// memory is g itself.
func (g *guestMemory) Allocate(_, _ uint64) experimental.LinearMemory { return g }

// Reallocate implements experimental.LinearMemory. A nil answer makes
// memory.grow return -1.
func (g *guestMemory) Reallocate(size uint64) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := int64(size)
	if g.released || n > int64(g.back.max()) {
		return nil
	}
	grown := n - g.size
	if grown > 0 && !g.m.reserveMemory(grown) {
		g.refused = n
		return nil
	}
	buf, err := g.back.commit(int(n))
	if err != nil {
		if grown > 0 {
			g.m.giveMemory(grown)
		}
		g.m.log.Error("guest memory could not grow", "to_bytes", n, "err", err)
		return nil
	}
	g.size = max(g.size, n)
	return buf
}

// Free implements experimental.LinearMemory. wazero calls it when the
// instance closes, which may happen on another goroutine while a call still
// runs (Runtime.Close after its context ended): then the memory stays
// mapped until that call returns, so a running guest never touches unmapped
// memory.
func (g *guestMemory) Free() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy {
		g.freed = true
		return
	}
	g.releaseLocked()
}

// release frees the memory now; the instance must not run. It is safe to
// call more than once.
func (g *guestMemory) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked()
}

func (g *guestMemory) releaseLocked() {
	if g.released {
		return
	}
	g.released = true
	g.back.release()
	g.m.giveMemory(g.size)
}

// enter marks the start of a call on the instance.
func (g *guestMemory) enter() {
	g.mu.Lock()
	g.busy, g.refused = true, 0
	g.mu.Unlock()
}

// leave marks its end and reports the size of a grow the budget refused
// during the call (0 if none).
func (g *guestMemory) leave() (refused int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy = false
	if g.freed {
		g.releaseLocked()
	}
	return g.refused
}

// bytes is the memory's current size.
func (g *guestMemory) bytes() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.size
}

// memGaugeFor resolves the module's memory gauge; nil without metrics.
func (m *metrics) memGaugeFor(name string) prometheus.Gauge {
	if m == nil {
		return nil
	}
	return m.memory.WithLabelValues(name)
}
