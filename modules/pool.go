package modules

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// errRetired is returned by acquire once the pool's module version was
// replaced or unloaded.
var errRetired = errors.New("module version retired")

// errBusy is returned by acquire when no instance became free in time.
var errBusy = errors.New("no free instance")

// pool holds up to size initialized instances of one module version. The
// first instance is created by the load; the others lazily, when every live
// instance is busy. An instance serves one call at a time: a Go or TinyGo
// guest corrupts itself when entered from two goroutines.
type pool struct {
	wait    time.Duration
	create  func(context.Context) (*instance, error)
	destroy func(*instance)
	onEmpty func() // runs once, when the retired pool has no instance left

	idle   chan *instance // initialized instances not serving a call
	slots  chan struct{}  // one token per live instance (idle or busy)
	gone   chan struct{}  // closed by retire
	mu     sync.Mutex     // guards closed and live, and orders release against retire
	closed bool
	live   int

	drained   chan struct{} // closed once retired and empty
	drainOnce sync.Once
}

func newPool(size int, wait time.Duration, create func(context.Context) (*instance, error), destroy func(*instance), onEmpty func()) *pool {
	return &pool{
		wait:    wait,
		create:  create,
		destroy: destroy,
		onEmpty: onEmpty,
		idle:    make(chan *instance, size),
		slots:   make(chan struct{}, size),
		gone:    make(chan struct{}),
		drained: make(chan struct{}),
	}
}

// acquire returns an idle instance, or creates one while the pool is below
// its size, or waits up to the pool's wait time (or until ctx ends) for
// either. It fails with errBusy (wrapping ctx's error when ctx ended),
// errRetired or the creation error.
func (p *pool) acquire(ctx context.Context) (*instance, error) {
	select {
	case inst := <-p.idle:
		return inst, nil
	default:
	}
	select {
	case inst := <-p.idle:
		return inst, nil
	case p.slots <- struct{}{}:
		return p.grow(ctx)
	case <-p.gone:
		return nil, errRetired
	default:
	}
	t := time.NewTimer(p.wait)
	defer t.Stop()
	select {
	case inst := <-p.idle:
		return inst, nil
	case p.slots <- struct{}{}:
		return p.grow(ctx)
	case <-p.gone:
		return nil, errRetired
	case <-t.C:
		return nil, fmt.Errorf("%w within %s", errBusy, p.wait)
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", errBusy, ctx.Err())
	}
}

// grow creates an instance for the slot the caller took.
func (p *pool) grow(ctx context.Context) (*instance, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.slots
		return nil, errRetired
	}
	p.live++
	p.mu.Unlock()
	inst, err := p.create(ctx)
	if err != nil {
		p.drop()
		return nil, err
	}
	return inst, nil
}

// release returns inst to the pool after a call. An instance that must not
// be reused (keep false), or that belongs to a retired pool, is destroyed.
func (p *pool) release(inst *instance, keep bool) {
	p.mu.Lock()
	if keep && !p.closed {
		p.idle <- inst // never blocks: at most size instances are live
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.destroy(inst)
	p.drop()
}

// shed closes one idle instance, if there is one, so that its memory
// serves another call; the pool creates instances again as calls need them.
func (p *pool) shed() bool {
	select {
	case inst := <-p.idle:
		p.destroy(inst)
		p.drop()
		return true
	default:
		return false
	}
}

// drop forgets one live instance.
func (p *pool) drop() {
	<-p.slots
	p.mu.Lock()
	p.live--
	empty := p.closed && p.live == 0
	p.mu.Unlock()
	if empty {
		p.finish()
	}
}

// retire stops the pool from handing out new instances: idle ones are
// destroyed now, busy ones when their call ends.
func (p *pool) retire() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.gone)
	p.mu.Unlock()
	for {
		select {
		case inst := <-p.idle:
			p.destroy(inst)
			p.drop()
			continue
		default:
		}
		break
	}
	p.mu.Lock()
	empty := p.live == 0
	p.mu.Unlock()
	if empty {
		p.finish()
	}
}

func (p *pool) finish() {
	p.drainOnce.Do(func() {
		close(p.drained)
		if p.onEmpty != nil {
			p.onEmpty()
		}
	})
}

// size reports the live instances (idle or busy).
func (p *pool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live
}
