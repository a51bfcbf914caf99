package modules

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules/internal/meter"
)

// The fixtures load metered: their loops count down to refuel instead of
// leaving the guest on every iteration. (TestBadCalls and
// TestCallerContextStopsGuest stop the metered loop module.)
func TestFixturesLoadMetered(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"good": "good", "loop": "loop"}, nil, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	for _, name := range []string{"good", "loop"} {
		if !mustModule(t, r, name).metered {
			t.Errorf("module %s loaded without the meter", name)
		}
	}
}

// A module the meter cannot read loads as before, compiled with wazero's
// own checks, which stop its loops at the same deadline and with the same
// error as refuel does.
func TestUnmeteredModuleStopped(t *testing.T) {
	instrument = func([]byte) ([]byte, error) { return nil, meter.ErrUnsupported }
	t.Cleanup(func() { instrument = meter.Instrument })
	const timeout = 100 * time.Millisecond
	r, errs := startRuntime(t, map[string]string{"good": "good", "loop": "loop"}, nil, func(c *Config) {
		c.Overrides = map[string]Limits{"loop": {CallTimeout: timeout}}
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "loop")
	if m.metered {
		t.Fatal("module loaded metered although the meter refused it")
	}
	start := time.Now()
	_, err := m.Call(context.Background(), abi.OpCreateVolume, nil)
	wantCode(t, err, abi.DeadlineExceeded, `module "loop": create_volume: deadline exceeded (guest time over the call timeout 100ms`)
	if d := time.Since(start); d > timeout+2*time.Second {
		t.Fatalf("call took %s", d)
	}
	if _, err := mustModule(t, r, "good").Call(context.Background(), abi.OpInfo, nil); err != nil {
		t.Fatalf("good module: %v", err)
	}
}

// A guest looping in its own code does not hold up the rest of the
// daemon: the goroutine running it leaves the guest's code at every
// refuel, where the Go runtime can stop it, so a stop-the-world (here a
// collection) waits microseconds, not until the call's deadline.
func TestLoopingGuestLetsTheWorldStop(t *testing.T) {
	const timeout = 3 * time.Second
	r := withTimeout(t, "loop", timeout)
	m := mustModule(t, r, "loop")
	done := make(chan error, 1)
	go func() {
		_, err := m.Call(context.Background(), abi.OpCreateVolume, nil)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the guest is looping by now
	start := time.Now()
	runtime.GC()
	took := time.Since(start)
	select {
	case err := <-done:
		t.Fatalf("the looping call ended before the collection was timed: %v", err)
	default:
	}
	if took > timeout/3 {
		t.Errorf("a collection took %s while a guest looped (its call timeout %s)", took, timeout)
	}
	wantCode(t, <-done, abi.DeadlineExceeded)
}

// A start function runs at instantiation, outside any operation: a finite
// one runs to its end, and one that never returns fails the module's load
// at the call timeout instead of holding the load (and the daemon's start)
// forever.
func TestStartFunctionBounded(t *testing.T) {
	const timeout = 200 * time.Millisecond
	start := time.Now()
	r, errs := startRuntime(t, map[string]string{"start": "start", "startloop": "startloop"}, nil, func(c *Config) {
		c.Limits.CallTimeout = timeout
	})
	if d := time.Since(start); d > timeout+5*time.Second {
		t.Fatalf("loading took %s", d)
	}
	if err := errs["startloop"]; err == nil || !strings.Contains(err.Error(), "deadline exceeded") {
		t.Fatalf("startloop: %v, want its load refused for the deadline", err)
	}
	if _, ok := r.Module("startloop"); ok {
		t.Fatal("startloop is loaded")
	}
	m := mustModule(t, r, "start")
	if !m.metered {
		t.Fatal("start loaded without the meter")
	}
	// create_volume answers OK only once the start function's loop ran to
	// its end.
	if _, err := m.Call(context.Background(), abi.OpCreateVolume, nil); err != nil {
		t.Fatal(err)
	}
}

// A runtime closed under a running call (a forced shutdown) stops a
// metered guest at its next refuel, as wazero's checks stopped an
// unmetered one, not at the end of its call timeout.
func TestCloseStopsMeteredGuest(t *testing.T) {
	const timeout = 5 * time.Second
	dir := t.TempDir()
	writeModule(t, dir, "loop", fixture(t, "loop"))
	cfg := testConfig(dir, nil)
	cfg.Overrides = map[string]Limits{"loop": {CallTimeout: timeout}}
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if errs := r.Load(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "loop")
	done := make(chan error, 1)
	go func() {
		_, err := m.Call(context.Background(), abi.OpCreateVolume, nil)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // looping by now
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = r.Close(ctx) // the call does not end in time: closed by force
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the looping call succeeded")
		}
	case <-time.After(timeout / 2):
		t.Fatalf("the guest still ran %s after the forced close", time.Since(start))
	}
}

// One WASI call can take the host for as long as its arguments say: a
// single fd_write of 350,000 iovecs of 1 MiB each is stopped at the call
// timeout, between two iovecs, not after hours of scanning output.
func TestLongWASICallStopped(t *testing.T) {
	const timeout = 100 * time.Millisecond
	r := withTimeout(t, "iovecs", timeout)
	start := time.Now()
	_, err := mustModule(t, r, "iovecs").Call(context.Background(), abi.OpCreateVolume, nil)
	wantCode(t, err, abi.DeadlineExceeded, "guest time over the call timeout")
	if d := time.Since(start); d > timeout+5*time.Second {
		t.Fatalf("the call took %s", d)
	}
}

// A guest's table is bounded like its memory: table.grow fails past
// MaxTableEntries instead of taking the daemon's heap, and succeeds up to
// it (the fixture's calls answer OK only then).
func TestTableGrowthBounded(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"tablegrow": "tablegrow"}, nil, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "tablegrow")
	for _, op := range []abi.Op{abi.OpCreateVolume, abi.OpDeleteVolume} {
		if _, err := m.Call(context.Background(), op, nil); err != nil {
			t.Errorf("%s: %v", op, err)
		}
	}
}

// withTimeout starts a runtime of the one fixture name, loaded under its
// own name with the call timeout given.
func withTimeout(t *testing.T, name string, timeout time.Duration) *Runtime {
	t.Helper()
	r, errs := startRuntime(t, map[string]string{name: name}, nil, func(c *Config) {
		c.Overrides = map[string]Limits{name: {CallTimeout: timeout}}
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	return r
}
