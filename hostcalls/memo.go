package hostcalls

import (
	"context"
	"sync"
)

// Memo carries what one operation's host calls learned to the later steps
// of the same operation: the host calls a module makes during one call,
// and the host's own checks after that call (a device's claim after the
// node_stage that attached it). It spares describing the same thing again
// a moment later. Only host code writes it, never a module, and a family
// that reads an entry must check it against the kernel before it trusts it:
// an entry says what was true when it was written. It lives as long as the
// operation's context; the host starts one per operation (WithMemo).
type Memo struct {
	mu sync.Mutex
	m  map[any]any
}

type memoKey struct{}

// WithMemo returns ctx carrying a new Memo, or ctx itself when it already
// carries one, so that nested steps of one operation share it.
func WithMemo(ctx context.Context) context.Context {
	if MemoOf(ctx) != nil {
		return ctx
	}
	return context.WithValue(ctx, memoKey{}, &Memo{})
}

// MemoOf returns the Memo ctx carries, or nil. Load and Store of a nil
// Memo remember nothing.
func MemoOf(ctx context.Context) *Memo {
	m, _ := ctx.Value(memoKey{}).(*Memo)
	return m
}

// Load returns the value stored under key. Families key their entries with
// a type of their own, so that no two families' keys collide.
func (m *Memo) Load(key any) (any, bool) {
	if m == nil {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[key]
	return v, ok
}

// Store sets the value under key.
func (m *Memo) Store(key, v any) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = make(map[any]any, 2)
	}
	m.m[key] = v
}

// Delete forgets key.
func (m *Memo) Delete(key any) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
}
