package modules

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/sys"

	"github.com/wasmcsi/wasmcsi/abi"
)

// guestBudget is the call timeout of the guest-clock tests: shorter than the
// fake host call's "sleep" (300 ms).
const guestBudget = 100 * time.Millisecond

func clockRuntime(t *testing.T) *Runtime {
	t.Helper()
	r, errs := startRuntime(t, map[string]string{"good": "good", "hostloop": "hostloop"}, nil, func(c *Config) {
		c.Limits.PoolSize = 1
		c.Limits.CallTimeout = guestBudget
		c.Grants["hostloop"] = Grant{HostCalls: []string{"test"}}
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	return r
}

// TestHostCallTimeNotCounted: a host call that works longer than the call
// timeout does not use up the guest's budget; the call succeeds and the
// instance stays pooled, also for a second call on the same instance.
func TestHostCallTimeNotCounted(t *testing.T) {
	m := mustModule(t, clockRuntime(t), "good")
	for round := 0; round < 2; round++ {
		start := time.Now()
		resp, err := m.Call(context.Background(), abi.OpDeleteVolume, []byte("sleep"))
		if err != nil || string(resp) != "slept" {
			t.Fatalf("round %d: %q, %v", round, resp, err)
		}
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Fatalf("round %d: the host call cannot have slept, the call took %s", round, d)
		}
		if m.pool.size() != 1 {
			t.Fatalf("round %d: %d live instances, want 1", round, m.pool.size())
		}
	}
}

// TestGuestTimeResumesAfterHostCall: the guest clock runs on after a host
// call returns, so a guest that loops after a long host call still stops
// one budget of guest time later, and the error names the guest limit.
func TestGuestTimeResumesAfterHostCall(t *testing.T) {
	m := mustModule(t, clockRuntime(t), "hostloop")
	for _, tt := range []struct {
		req      string
		hostTime time.Duration
	}{{"sleep", 300 * time.Millisecond}, {"quick", 0}} {
		t.Run(tt.req, func(t *testing.T) {
			start := time.Now()
			_, err := m.Call(context.Background(), abi.OpCreateVolume, []byte(tt.req))
			d := time.Since(start)
			wantCode(t, err, abi.DeadlineExceeded,
				`module "hostloop": create_volume: deadline exceeded (guest time over the call timeout 100ms; time in host calls not counted)`)
			if min := tt.hostTime + guestBudget; d < min {
				t.Fatalf("stopped after %s, before %s of host time plus the guest budget", d, min)
			}
			if max := tt.hostTime + guestBudget + time.Second; d > max {
				t.Fatalf("stopped after %s, want at most %s", d, max)
			}
			if m.pool.size() != 0 {
				t.Fatal("the stopped instance was kept")
			}
		})
	}
}

// TestCallerContextStopsHostCall: the caller's deadline or cancellation
// still bounds the whole call, also while the guest waits in a host call
// (which gets the caller's context), and the error names the caller.
func TestCallerContextStopsHostCall(t *testing.T) {
	m := mustModule(t, clockRuntime(t), "good")
	m.limits.CallTimeout = 10 * time.Second // only the caller can stop "hang"
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := m.Call(ctx, abi.OpDeleteVolume, []byte("hang"))
		wantCode(t, err, abi.DeadlineExceeded, `module "good": delete_volume: deadline exceeded (the caller's deadline)`)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("call took %s", d)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := m.Call(ctx, abi.OpDeleteVolume, []byte("hang"))
		wantCode(t, err, abi.Canceled, `module "good": delete_volume: canceled by the caller`)
	})
	t.Run("next call", func(t *testing.T) {
		// A cancelable caller's context that ends after the call does not
		// reach the instance's next call.
		ctx, cancel := context.WithCancel(context.Background())
		if resp, err := m.Call(ctx, abi.OpDeleteVolume, []byte("x")); err != nil || string(resp) != "x" {
			t.Fatalf("%q, %v", resp, err)
		}
		cancel()
		if resp, err := m.Call(context.Background(), abi.OpDeleteVolume, []byte("sleep")); err != nil || string(resp) != "slept" {
			t.Fatalf("%q, %v", resp, err)
		}
	})
}

// TestGuestClockRefusesHostCallWhenOver: a host call does not start once
// the guest's budget is spent or the caller's context has ended, and a
// guest whose caller went away during the host call is stopped on return.
func TestGuestClockRefusesHostCallWhenOver(t *testing.T) {
	exitCode := func(err error) uint32 {
		t.Helper()
		var exit *sys.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("%v is not a *sys.ExitError", err)
		}
		return exit.ExitCode()
	}
	inst := &instance{}
	inst.clock.init(inst)

	inst.clock.start(context.Background(), time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	if got := exitCode(inst.clock.pause()); got != sys.ExitCodeDeadlineExceeded {
		t.Fatalf("spent budget: exit code %d", got)
	}
	if !errors.Is(inst.clock.Err(), errGuestTime) {
		t.Fatalf("spent budget: Err %v", inst.clock.Err())
	}
	inst.clock.end()

	ctx, cancel := context.WithCancel(context.Background())
	inst.clock.start(ctx, time.Second)
	select {
	case <-inst.clock.Done():
		t.Fatal("a fresh call's clock is done")
	default:
	}
	if err := inst.clock.pause(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if got := exitCode(inst.clock.resume()); got != sys.ExitCodeContextCanceled {
		t.Fatalf("caller canceled during the host call: exit code %d", got)
	}
	select {
	case <-inst.clock.Done():
	case <-time.After(time.Second):
		t.Fatal("Done did not close for the caller's cancellation")
	}
	inst.clock.end()

	inst.clock.start(ctx, time.Second)
	if got := exitCode(inst.clock.pause()); got != sys.ExitCodeContextCanceled {
		t.Fatalf("caller canceled before the host call: exit code %d", got)
	}
	inst.clock.end()
}

// TestGuestClockCheck: refuel's check stops a guest whose budget is spent
// by reading the time itself, also when the timer has not fired (here it
// never will), and one whose caller went away.
func TestGuestClockCheck(t *testing.T) {
	inst := &instance{}
	inst.clock.init(inst)
	inst.clock.start(context.Background(), time.Millisecond)
	if err := inst.clock.check(); err != nil {
		t.Fatalf("a fresh call's check: %v", err)
	}
	inst.clock.timer.Stop() // the timer's callback cannot close the clock
	time.Sleep(5 * time.Millisecond)
	var exit *sys.ExitError
	if err := inst.clock.check(); !errors.As(err, &exit) || exit.ExitCode() != sys.ExitCodeDeadlineExceeded {
		t.Fatalf("spent budget: check = %v, want the deadline's exit error", err)
	}
	if !errors.Is(inst.clock.Err(), errGuestTime) {
		t.Fatalf("spent budget: Err %v", inst.clock.Err())
	}
	inst.clock.end()

	ctx, cancel := context.WithCancel(context.Background())
	inst.clock.start(ctx, time.Second)
	cancel()
	if err := inst.clock.check(); !errors.As(err, &exit) || exit.ExitCode() != sys.ExitCodeContextCanceled {
		t.Fatalf("caller gone: check = %v, want the cancellation's exit error", err)
	}
	inst.clock.end()
}
