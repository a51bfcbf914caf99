package hostcalls

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Pools keeps one open pool per root folder for the host calls of a pool
// family, so that a call neither reopens its root nor probes its filesystem
// again (dirpool asks for the quota state with quotactl, for example), and
// so that every call on one root shares the pool's own locks.
//
// A cached pool is used only while its root still names the same folder:
// Acquire stats the root (one syscall) and, when another filesystem was
// mounted there or the folder was replaced, opens the new one and closes
// the old one once the calls using it are done. A pool nobody used for
// PoolIdle is closed, so the daemon does not keep an idle pool's
// filesystem busy (an operator can unmount it) and what a pool learned
// when it was opened (such as whether quotas are enforced) is learnt again
// after a quiet moment.
//
// Pools is safe for concurrent use; its mutex is held only to look up or
// swap an entry, never across a host call.
type Pools[P any] struct {
	open  func(root string) (P, error)
	close func(P) error

	mu sync.Mutex
	m  map[string]*poolEntry[P]
}

type poolEntry[P any] struct {
	root     string
	pool     P
	dev, ino uint64
	refs     int
	stale    bool
	idle     *time.Timer // closes the pool after PoolIdle without users
}

// PoolIdle is how long a pool stays open without a host call using it.
const PoolIdle = 500 * time.Millisecond

// NewPools returns an empty cache that opens pools with open and closes
// replaced ones with close.
func NewPools[P any](open func(root string) (P, error), close func(P) error) *Pools[P] {
	return &Pools[P]{open: open, close: close, m: map[string]*poolEntry[P]{}}
}

// Acquire returns the open pool of root, a clean absolute path, and the
// function that releases it; the caller must call release when its host
// call is done.
func (c *Pools[P]) Acquire(root string) (pool P, release func(), err error) {
	dev, ino, err := identity(root)
	if err != nil {
		var zero P
		code := abi.Internal
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			code = abi.FailedPrecondition
		}
		return zero, nil, abi.Errorf(code, "pool %s: %v", root, err)
	}
	c.mu.Lock()
	e := c.m[root]
	if e != nil && (e.dev != dev || e.ino != ino) {
		c.retire(root, e)
		e = nil
	}
	if e != nil {
		e.refs++
		c.mu.Unlock()
		return e.pool, func() { c.release(e) }, nil
	}
	c.mu.Unlock()

	// Open outside the lock: it may touch the disk. Two callers racing
	// here both open; the second one's pool is closed at once.
	p, err := c.open(root)
	if err != nil {
		var zero P
		return zero, nil, err
	}
	c.mu.Lock()
	if cur := c.m[root]; cur != nil && cur.dev == dev && cur.ino == ino {
		cur.refs++
		c.mu.Unlock()
		c.close(p)
		return cur.pool, func() { c.release(cur) }, nil
	} else if cur != nil {
		c.retire(root, cur)
	}
	e = &poolEntry[P]{root: root, pool: p, dev: dev, ino: ino, refs: 1}
	c.m[root] = e
	c.mu.Unlock()
	return p, func() { c.release(e) }, nil
}

// retire drops e from the cache and closes it if nobody uses it. c.mu is
// held.
func (c *Pools[P]) retire(root string, e *poolEntry[P]) {
	delete(c.m, root)
	e.stale = true
	if e.idle != nil {
		e.idle.Stop()
	}
	if e.refs == 0 {
		c.close(e.pool)
	}
}

func (c *Pools[P]) release(e *poolEntry[P]) {
	c.mu.Lock()
	e.refs--
	closeNow := e.stale && e.refs == 0
	if e.refs == 0 && !e.stale {
		if e.idle == nil {
			e.idle = time.AfterFunc(PoolIdle, func() { c.expire(e) })
		} else {
			e.idle.Reset(PoolIdle)
		}
	}
	c.mu.Unlock()
	if closeNow {
		c.close(e.pool)
	}
}

// expire closes e if it is still cached and nobody took it since its idle
// timer was armed.
func (c *Pools[P]) expire(e *poolEntry[P]) {
	c.mu.Lock()
	if e.refs > 0 || e.stale || c.m[e.root] != e {
		c.mu.Unlock()
		return
	}
	delete(c.m, e.root)
	e.stale = true
	c.mu.Unlock()
	c.close(e.pool)
}

// Len reports how many roots have an open pool (for tests).
func (c *Pools[P]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// identity returns the device and inode numbers of path.
func identity(path string) (dev, ino uint64, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("stat %s: no device and inode numbers", path)
	}
	return uint64(st.Dev), uint64(st.Ino), nil
}

// WithVolume runs fn on the open pool of the granted pool folder that
// holds path, with the volume's name there, checked by valid. what names
// the volume for errors ("file", "directory").
func WithVolume[P, R any](c *Pools[P], env *Env, path, what string, valid func(string) error, fn func(p P, name string) (*R, error)) (*R, error) {
	root, name, err := PoolPath(env, path, what)
	if err == nil {
		err = valid(name)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p, release, err := c.Acquire(root)
	if err != nil {
		return nil, err
	}
	defer release()
	resp, err := fn(p, name)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// WithPair is WithVolume for a copy within one pool: source and target
// lie directly in the same granted pool folder. op names the call for
// errors ("copy", "clone").
func WithPair[P any](c *Pools[P], env *Env, source, target, what, op string, valid func(string) error, fn func(p P, src, dst string) error) error {
	root, src, dst, err := PoolPair(env, source, target, what)
	for _, name := range []string{src, dst} {
		if err == nil {
			err = valid(name)
		}
	}
	if err != nil {
		return fmt.Errorf("%s %s to %s: %w", op, source, target, err)
	}
	p, release, err := c.Acquire(root)
	if err != nil {
		return err
	}
	defer release()
	return fn(p, src, dst)
}

// WithRoot runs fn on the open pool of path, which must be one of the
// granted pool folders itself. op names the call for errors.
func WithRoot[P, R any](c *Pools[P], env *Env, path, op string, fn func(p P) (*R, error)) (*R, error) {
	root, err := Confine(env.Roots, path, true)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, path, err)
	}
	if !IsRoot(env, root) {
		return nil, fmt.Errorf("%s %s: %w", op, path, abi.Errorf(abi.InvalidArgument, "not a granted pool folder"))
	}
	p, release, err := c.Acquire(root)
	if err != nil {
		return nil, err
	}
	defer release()
	return fn(p)
}
