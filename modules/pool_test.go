package modules

import (
	"context"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// blockedCalls starts n delete_volume calls that wait at g, and returns a
// channel that yields each call's error once g opens.
func blockedCalls(t *testing.T, m *Module, g *gate, n int) <-chan error {
	t.Helper()
	done := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			resp, err := m.Call(context.Background(), abi.OpDeleteVolume, []byte("block"))
			if err == nil && string(resp) != "released" {
				t.Errorf("blocked call answered %q", resp)
			}
			done <- err
		}()
	}
	g.waitEntered(t, n)
	return done
}

func TestPoolBoundsAndAcquireTimeout(t *testing.T) {
	const wait = 300 * time.Millisecond
	g := newGate()
	r, errs := startRuntime(t, map[string]string{"good": "good"}, g, func(c *Config) {
		c.Limits.PoolSize = 2
		c.Limits.AcquireTimeout = wait
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	if n := m.pool.size(); n != 1 {
		t.Fatalf("%d instances after load, want the 1 eager instance", n)
	}
	done := blockedCalls(t, m, g, 2)
	if n := m.pool.size(); n != 2 {
		t.Fatalf("%d instances with 2 calls running, want 2", n)
	}

	t.Run("acquire timeout", func(t *testing.T) {
		start := time.Now()
		_, err := m.Call(context.Background(), abi.OpCreateVolume, []byte("x"))
		wantCode(t, err, abi.Unavailable, `module "good" busy: no free instance within 300ms`)
		if d := time.Since(start); d < wait || d > wait+2*time.Second {
			t.Fatalf("busy after %s, want about %s", d, wait)
		}
	})
	t.Run("caller gives up first", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := m.Call(ctx, abi.OpCreateVolume, []byte("x"))
		wantCode(t, err, abi.Unavailable, `module "good" busy`, "deadline exceeded")
		if d := time.Since(start); d >= wait {
			t.Fatalf("waited %s, past the caller's deadline", d)
		}
	})
	if n := m.pool.size(); n != 2 {
		t.Fatalf("%d instances, want the bound of 2", n)
	}

	t.Run("waiter gets a released instance", func(t *testing.T) {
		got := make(chan error, 1)
		go func() {
			ctx := context.Background()
			_, err := m.Call(ctx, abi.OpCreateVolume, []byte("x"))
			got <- err
		}()
		time.Sleep(wait / 6)
		g.open()
		for i := 0; i < 2; i++ {
			if err := <-done; err != nil {
				t.Fatalf("blocked call: %v", err)
			}
		}
		if err := <-got; err != nil {
			// The waiter may have started before the instances freed and
			// timed out only if opening the gate took longer than wait.
			t.Fatalf("waiting call: %v", err)
		}
	})
}

// TestPoolRetire exercises the pool on its own: retire closes idle
// instances at once and busy ones at release, refuses new ones, and reports
// drained exactly when the last instance is gone.
func TestPoolRetire(t *testing.T) {
	created, destroyed := 0, 0
	p := newPool(3, 50*time.Millisecond,
		func(context.Context) (*instance, error) { created++; return &instance{}, nil },
		func(*instance) { destroyed++ },
		nil)
	ctx := context.Background()
	a, err := p.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := p.acquire(ctx)
	p.release(b, true)
	if created != 2 || p.size() != 2 {
		t.Fatalf("created %d, live %d; want 2, 2", created, p.size())
	}
	c, _ := p.acquire(ctx)
	if c != b {
		t.Fatal("acquire created an instance while one was idle")
	}
	p.release(c, false) // discarded
	if destroyed != 1 || p.size() != 1 {
		t.Fatalf("destroyed %d, live %d; want 1, 1", destroyed, p.size())
	}
	p.retire()
	select {
	case <-p.drained:
		t.Fatal("drained while an instance is busy")
	default:
	}
	if _, err := p.acquire(ctx); err != errRetired {
		t.Fatalf("acquire on a retired pool: %v, want errRetired", err)
	}
	p.release(a, true)
	select {
	case <-p.drained:
	default:
		t.Fatal("not drained after the last release")
	}
	if destroyed != 2 || p.size() != 0 {
		t.Fatalf("destroyed %d, live %d; want 2, 0", destroyed, p.size())
	}
}

// A reservation holds its instance between its calls: a call from
// elsewhere finds the pool busy until Release, and the reservation's own
// calls never wait for an instance.
func TestReservation(t *testing.T) {
	const wait = 200 * time.Millisecond
	r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
		c.Limits.PoolSize = 1
		c.Limits.AcquireTimeout = wait
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	ctx := context.Background()
	res, err := m.Reserve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reserve(ctx); abi.CodeOf(err) != abi.Unavailable {
		t.Fatalf("a second reservation of a pool of 1: %v, want UNAVAILABLE", err)
	}
	for i := 0; i < 3; i++ {
		if _, err := res.Call(ctx, abi.OpNodeInfo, nil); err != nil {
			t.Fatalf("call %d on the reservation: %v", i, err)
		}
		_, err := m.Call(ctx, abi.OpNodeInfo, nil)
		wantCode(t, err, abi.Unavailable, "busy")
	}
	res.Release()
	res.Release() // idempotent
	if _, err := m.Call(ctx, abi.OpNodeInfo, nil); err != nil {
		t.Fatalf("a call after Release: %v", err)
	}
	if _, err := res.Call(ctx, abi.OpNodeInfo, nil); err != nil {
		t.Fatalf("the reservation's call after Release (from the pool): %v", err)
	}
	if n := m.pool.size(); n != 1 {
		t.Fatalf("%d instances, want 1", n)
	}
}
