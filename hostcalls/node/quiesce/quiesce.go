// Package quiesce pauses the writes to a set of filesystems and
// device-mapper devices for a bounded time, so that snapshots cut meanwhile
// hold one point of the write stream (CSI's group snapshots), and makes
// sure they resume whatever happens:
//
//   - Release and every error path thaw (Hold.Thaw is idempotent);
//   - the hold's own timer thaws at its deadline, even while the caller is
//     still busy, and Release then fails;
//   - a guardian child process holds the same list and thaws it when the
//     daemon dies (the pipe it reads from reaches end of file) or when the
//     deadline and a grace period have passed without a word from the
//     daemon;
//   - a durable journal, written before anything is paused, lists what an
//     attempt pauses, and Recover thaws it at the next start, for when the
//     guardian died with the daemon (a container's whole cgroup killed).
//
// Paused writers hang: nothing here may wait on a paused filesystem, and
// the package must never pause anything it cannot name in the journal
// first. It knows nothing about CSI, volumes or backends; the host decides
// what to pause (host/RATIONALE.md, "Group snapshots").
package quiesce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
)

// Kind is how a target is paused.
type Kind string

const (
	// Filesystem is frozen (FIFREEZE) and thawed (FITHAW): Path is a
	// mount point of it, Dev its device number (st_dev), checked before
	// either, so a stale path never freezes or thaws another filesystem.
	Filesystem Kind = "fs"
	// Mapped is a device-mapper device, suspended and resumed by Name.
	// Suspending flushes it and freezes a filesystem mounted on it.
	Mapped Kind = "dm"
)

// Target is one thing to pause.
type Target struct {
	Kind Kind   `json:"kind"`
	Path string `json:"path,omitempty"`
	Dev  uint64 `json:"dev,omitempty"`
	Name string `json:"name,omitempty"`
	// Volume is what the target belongs to, for errors and logs.
	Volume string `json:"volume,omitempty"`
}

func (t Target) String() string {
	if t.Kind == Mapped {
		return "device-mapper device " + t.Name + " of volume " + t.Volume
	}
	return "filesystem at " + t.Path + " of volume " + t.Volume
}

// pause pauses t. A target that someone else has already paused is
// FailedPrecondition: the hold's thaw would end their pause.
func pause(ctx context.Context, t Target) error {
	switch t.Kind {
	case Filesystem:
		return fs.Freeze(t.Path, t.Dev)
	case Mapped:
		m, err := dm.New(t.Name)
		if err != nil {
			return err
		}
		info, err := m.Info(ctx, t.Name)
		if err != nil {
			return err
		}
		if !info.Exists {
			return abi.Errorf(abi.FailedPrecondition, "suspend %s: no such device-mapper device", t.Name)
		}
		if info.Suspended {
			return abi.Errorf(abi.FailedPrecondition, "suspend %s: already suspended by someone else", t.Name)
		}
		return m.Suspend(ctx, t.Name)
	}
	return abi.Errorf(abi.Internal, "quiesce: unknown target kind %s", string(t.Kind))
}

// resume resumes t and reports whether it was paused. A target that is
// gone or not paused is no error.
func resume(ctx context.Context, t Target) (bool, error) {
	switch t.Kind {
	case Filesystem:
		return fs.Thaw(t.Path, t.Dev)
	case Mapped:
		m, err := dm.New(t.Name)
		if err != nil {
			return false, err
		}
		info, err := m.Info(ctx, t.Name)
		if err != nil || !info.Exists || !info.Suspended {
			return false, err
		}
		return true, m.Resume(ctx, t.Name)
	}
	return false, abi.Errorf(abi.Internal, "quiesce: unknown target kind %s", string(t.Kind))
}

// ResumeAll resumes every target that is paused, as cleanup after a crash
// does when it cannot know how far a hold got, and returns how many were.
func ResumeAll(ctx context.Context, targets []Target) (int, error) {
	n := 0
	var errs []error
	for _, t := range targets {
		was, err := resume(ctx, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("resume %s: %w", t, err))
		} else if was {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// Hold is a set of paused targets. Its methods are safe for concurrent use.
type Hold struct {
	log      *slog.Logger
	targets  []Target
	timeout  time.Duration
	deadline time.Time
	guard    *guardian

	// How long starting the guardian and pausing every target took, and
	// when the last target was paused and the first thaw ended.
	guardTook, pauseTook time.Duration
	pausedAt, resumedAt  time.Time

	mu      sync.Mutex
	timer   *time.Timer // thaws at the deadline
	paused  []bool      // by target: paused by the hold and not resumed since
	ended   bool        // the hold thawed (deadline, error path or Release)
	stuck   bool        // a resume failed: the guardian tries once more
	expired bool        // its deadline ended it
	failed  []string
}

// ErrNoGuardian is returned by Pause when this program cannot run a
// guardian because its main function does not call Main.
var ErrNoGuardian = abi.Errorf(abi.FailedPrecondition, "this program cannot start a quiesce guardian (its main does not call quiesce.Main), so it pauses no writes")

// guardGrace is how long after the hold's deadline the guardian waits for
// the daemon before it thaws on its own.
const guardGrace = 2 * time.Second

// Pause starts a guardian for targets and pauses them in order, for at
// most timeout from now. It returns with every target paused, or with
// none (an error, after resuming those it had paused). With no targets it
// returns a hold that does nothing.
func Pause(ctx context.Context, targets []Target, timeout time.Duration, log *slog.Logger) (*Hold, error) {
	h := &Hold{log: log, targets: targets, timeout: timeout, paused: make([]bool, len(targets))}
	if len(targets) == 0 {
		return h, nil
	}
	start := time.Now()
	g, err := startGuardian(targets, timeout+guardGrace)
	if err != nil {
		return nil, err
	}
	h.guard = g
	h.guardTook = time.Since(start)
	start = time.Now()
	h.deadline = start.Add(timeout)
	h.mu.Lock()
	h.timer = time.AfterFunc(timeout, func() {
		h.mu.Lock()
		h.expired = !h.ended
		h.mu.Unlock()
		h.Thaw()
	})
	h.mu.Unlock()
	for i, t := range targets {
		if h.over() {
			break
		}
		err := pause(ctx, t)
		h.mu.Lock()
		h.paused[i] = err == nil
		over := h.ended
		h.mu.Unlock()
		if err != nil || over {
			h.Thaw()
			h.guard.release(h.resumed())
			if err == nil {
				err = h.overrun()
			}
			return nil, fmt.Errorf("pause %s: %w", t, err)
		}
	}
	if h.over() {
		h.Thaw()
		h.guard.release(h.resumed())
		return nil, h.overrun()
	}
	h.pausedAt = time.Now()
	h.pauseTook = h.pausedAt.Sub(start)
	return h, nil
}

// Timing says how long starting the guardian and pausing the targets
// took, and how long they stayed paused after that (until the thaw, or
// until now).
func (h *Hold) Timing() (guardian, pausing, held time.Duration) {
	h.mu.Lock()
	end := h.resumedAt
	h.mu.Unlock()
	if h.pausedAt.IsZero() {
		return h.guardTook, h.pauseTook, 0
	}
	if end.IsZero() {
		end = time.Now()
	}
	return h.guardTook, h.pauseTook, end.Sub(h.pausedAt)
}

// Resumed reports whether every resume so far succeeded: false while a
// target the hold paused may still be paused.
func (h *Hold) Resumed() bool { return h.resumed() }

// resumed reports whether every resume so far succeeded.
func (h *Hold) resumed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.stuck
}

func (h *Hold) over() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

func (h *Hold) overrun() error {
	return abi.Errorf(abi.DeadlineExceeded, "pausing the writes took longer than they may stay paused (%s); resumed them", h.timeout)
}

// Deadline is when the hold thaws on its own; zero for a hold of nothing.
func (h *Hold) Deadline() time.Time { return h.deadline }

// Thaw resumes every target the hold paused and has not resumed yet. It
// is idempotent and safe to call from any path, concurrently too.
func (h *Hold) Thaw() {
	h.mu.Lock()
	h.ended = true
	var todo []int
	for i, p := range h.paused {
		if p {
			todo = append(todo, i)
			h.paused[i] = false
		}
	}
	timer := h.timer
	h.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	for _, i := range todo {
		t := h.targets[i]
		// Never cancelled: a thaw that stops half-way leaves writers hung.
		was, err := resume(context.Background(), t)
		if err != nil {
			h.log.Error("resume writes", "target", t.String(), "err", err)
		}
		if !was || err != nil {
			h.mu.Lock()
			h.failed = append(h.failed, t.String())
			h.stuck = h.stuck || err != nil
			h.mu.Unlock()
		}
	}
	h.mu.Lock()
	if h.resumedAt.IsZero() && len(todo) > 0 {
		h.resumedAt = time.Now()
	}
	h.mu.Unlock()
}

// Release ends the hold: it resumes every target, tells the guardian to
// stand down, and returns nil only if every target stayed paused from the end
// of Pause until now. It fails with DEADLINE_EXCEEDED when the hold's
// deadline passed first, and with ABORTED when a target was resumed behind
// the hold's back (by the guardian, or by someone else), because then a
// snapshot cut meanwhile may hold a later point of the stream than the
// others.
func (h *Hold) Release() error {
	h.mu.Lock()
	expired, ended := h.expired, h.ended
	h.mu.Unlock()
	// Thaw first, then stand the guardian down: a daemon that dies in
	// between leaves a guardian that resumes what is resumed already.
	h.Thaw()
	h.guard.release(h.resumed())
	h.mu.Lock()
	failed := h.failed
	h.mu.Unlock()
	switch {
	case expired:
		return abi.Errorf(abi.DeadlineExceeded, "the snapshot took longer than writes may stay paused (%s): writes resumed, and nothing of it is kept", h.timeout)
	case ended:
		return abi.Errorf(abi.Aborted, "writes were resumed before the snapshots were cut")
	case len(failed) > 0:
		return abi.Errorf(abi.Aborted, "%s was resumed by someone else while the snapshots were cut", failed[0])
	}
	return nil
}
