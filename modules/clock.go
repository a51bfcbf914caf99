package modules

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tetratelabs/wazero/sys"
)

// guestClock is the context of one export call, and the call's guest clock.
// Its Done channel closes when the guest has run for its budget (the call
// timeout) or when the caller's context is done, whichever comes first. The
// clock pauses while a host call runs (see RATIONALE.md, "The call timeout
// counts guest time"). A metered guest's refuel asks check; for a module
// compiled with wazero's own checks, its watcher selects on Done once per
// call and then reads Err, so a closed Done with a DeadlineExceeded Err
// stops the guest however often the timer was re-armed.
//
// Each instance owns one clock and reuses it call after call: the hot path
// allocates nothing (the parent watch of a cancelable caller's context
// excepted) and costs a time.Now and a timer Stop/Reset per host call.
type guestClock struct {
	inst   *instance
	parent context.Context // the caller's context; set for the duration of a call

	mu       sync.Mutex
	done     chan struct{} // closed with err set; replaced by start after that
	err      error
	running  bool          // the guest's time is counting
	deadline time.Time     // while running: when the budget is spent (monotonic)
	left     time.Duration // while paused: budget left
	gen      uint64        // call number, to ignore a late parent watch
	timer    *time.Timer
	unwatch  func() bool // stops the watch of parent, if any
}

// errGuestTime is the clock's Err when the guest spent its budget. It is a
// context.DeadlineExceeded to wazero, which closes the module with
// sys.ExitCodeDeadlineExceeded for it.
var errGuestTime error = guestTimeError{}

type guestTimeError struct{}

func (guestTimeError) Error() string        { return "guest time exceeded" }
func (guestTimeError) Is(target error) bool { return target == context.DeadlineExceeded }

func (c *guestClock) init(inst *instance) {
	c.inst = inst
	c.parent = context.Background()
	c.done = make(chan struct{})
}

// start begins a call under parent with budget of guest time.
func (c *guestClock) start(parent context.Context, budget time.Duration) {
	c.mu.Lock()
	c.gen++
	gen := c.gen
	if c.err != nil {
		// A previous call ran out; its instance normally goes, but a caller's
		// context may have ended just as a call returned.
		c.done, c.err = make(chan struct{}), nil
	}
	c.parent = parent
	c.running = true
	c.deadline = time.Now().Add(budget)
	if c.timer == nil {
		c.timer = time.AfterFunc(budget, c.expire)
	} else {
		c.timer.Reset(budget)
	}
	c.mu.Unlock()
	if parent.Done() != nil {
		c.unwatch = context.AfterFunc(parent, func() { c.parentDone(gen, parent) })
	}
}

// end finishes the call begun by start.
func (c *guestClock) end() {
	if c.unwatch != nil {
		c.unwatch()
		c.unwatch = nil
	}
	c.mu.Lock()
	c.running = false
	c.timer.Stop()
	c.gen++
	c.parent = context.Background()
	c.mu.Unlock()
}

// pause stops the guest clock while a host call runs. When the call is
// over already (budget spent, caller gone) it answers the exit error that
// stops the guest instead, and the host call does not start.
func (c *guestClock) pause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		c.running = false
		c.timer.Stop()
		c.left = time.Until(c.deadline)
		if c.left <= 0 && c.err == nil {
			c.close(errGuestTime)
		}
	}
	return c.exit()
}

// check answers the exit error that stops the guest when its budget is
// spent or the caller's context has ended, whether or not the timer has
// fired yet; a metered guest's refuel asks it every few thousand loop
// iterations (there is no watcher to read Done).
func (c *guestClock) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running && c.err == nil && !time.Now().Before(c.deadline) {
		c.close(errGuestTime)
	}
	return c.exit()
}

// resume restarts the guest clock when a host call returns. When the call
// is over instead (the caller's context ended during the host call), it
// answers the exit error that stops the guest at once: waiting for wazero's
// watcher would let the guest go on with the host call's answer, and
// perhaps finish the call.
func (c *guestClock) resume() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.exit(); err != nil {
		return err
	}
	c.running = true
	c.deadline = time.Now().Add(c.left)
	c.timer.Reset(c.left)
	return nil
}

// exit closes the clock when the caller's context has ended, and answers
// the wazero exit error for a closed clock; c.mu is held.
func (c *guestClock) exit() error {
	if c.err == nil {
		if err := c.parent.Err(); err != nil {
			c.close(err)
		}
	}
	switch {
	case c.err == nil:
		return nil
	case errors.Is(c.err, context.Canceled):
		return sys.NewExitError(sys.ExitCodeContextCanceled)
	default:
		return sys.NewExitError(sys.ExitCodeDeadlineExceeded)
	}
}

// expire runs when the timer fires. A firing that lost a race with pause,
// end or a re-arm finds the clock stopped or the deadline ahead and does
// nothing; the re-armed timer fires again in time.
func (c *guestClock) expire() {
	c.mu.Lock()
	if c.running && c.err == nil && !time.Now().Before(c.deadline) {
		c.close(errGuestTime)
	}
	c.mu.Unlock()
}

func (c *guestClock) parentDone(gen uint64, parent context.Context) {
	c.mu.Lock()
	if gen == c.gen && c.err == nil {
		c.close(parent.Err())
	}
	c.mu.Unlock()
}

// close ends the call's context with err; c.mu is held.
func (c *guestClock) close(err error) {
	c.err = err
	close(c.done)
}

// Deadline is the caller's: the guest clock's end moves with host calls.
func (c *guestClock) Deadline() (time.Time, bool) {
	c.mu.Lock()
	parent := c.parent
	c.mu.Unlock()
	return parent.Deadline()
}

// Done locks because wazero's watcher of the previous call may read it late,
// while start replaces it.
func (c *guestClock) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *guestClock) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *guestClock) Value(key any) any {
	if _, ok := key.(callKey); ok {
		return c.inst
	}
	return c.parent.Value(key)
}
