package modules

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestReload(t *testing.T) {
	g := newGate()
	dir := t.TempDir()
	writeModule(t, dir, "good", fixture(t, "good"))
	cfg := testConfig(dir, g)
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.open(); _ = r.Close(context.Background()) })
	if errs := r.Load(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	v1 := mustModule(t, r, "good")

	// A call in flight on v1 while v2 replaces it.
	inflight := blockedCalls(t, v1, g, 1)

	t.Run("unchanged file keeps its version", func(t *testing.T) {
		if errs := r.Reload(context.Background()); len(errs) != 0 {
			t.Fatal(errs)
		}
		if m := mustModule(t, r, "good"); m != v1 {
			t.Fatal("reload of an unchanged file replaced the module")
		}
	})

	writeModule(t, dir, "good", withCustomSection(fixture(t, "good"), "v2"))
	if errs := r.Reload(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	v2 := mustModule(t, r, "good")
	t.Run("new digest serves", func(t *testing.T) {
		if v2 == v1 || v2.Digest() == v1.Digest() {
			t.Fatalf("module not replaced: digest %s", v2.Digest())
		}
		if resp, err := v2.Call(context.Background(), abi.OpCreateVolume, []byte("v2")); err != nil || string(resp) != "v2" {
			t.Fatalf("call on v2: %q, %v", resp, err)
		}
		// A caller still holding v1 is served by v2.
		before := v2.pool.size()
		if resp, err := v1.Call(context.Background(), abi.OpCreateVolume, []byte("stale")); err != nil || string(resp) != "stale" {
			t.Fatalf("call on stale v1: %q, %v", resp, err)
		}
		if v1.pool.size() != 1 || v2.pool.size() < before {
			t.Fatalf("stale call took an instance of the retired version")
		}
	})
	t.Run("in-flight call on the old version finishes", func(t *testing.T) {
		select {
		case <-v1.pool.drained:
			t.Fatal("old version drained while a call runs on it")
		default:
		}
		g.open()
		if err := <-inflight; err != nil {
			t.Fatalf("in-flight call: %v", err)
		}
		select {
		case <-v1.pool.drained:
		case <-time.After(5 * time.Second):
			t.Fatal("old version did not drain")
		}
		if v1.pool.size() != 0 {
			t.Fatalf("old version keeps %d instances", v1.pool.size())
		}
	})
	t.Run("bad replacement keeps the previous version", func(t *testing.T) {
		writeModule(t, dir, "good", fixture(t, "badversion"))
		errs := r.Reload(context.Background())
		if err := errs["good"]; err == nil || !strings.Contains(err.Error(), "returned 2") {
			t.Fatalf("errors %v, want the version mismatch", errs)
		}
		if m := mustModule(t, r, "good"); m != v2 {
			t.Fatal("a refused file replaced the serving version")
		}
		if _, err := v2.Call(context.Background(), abi.OpCreateVolume, []byte("x")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("added and removed files", func(t *testing.T) {
		writeModule(t, dir, "other", fixture(t, "garbage"))
		if err := os.Remove(filepath.Join(dir, "good.wasm")); err != nil {
			t.Fatal(err)
		}
		if errs := r.Reload(context.Background()); len(errs) != 0 {
			t.Fatal(errs)
		}
		if _, ok := r.Module("good"); ok {
			t.Fatal("removed module still loaded")
		}
		mustModule(t, r, "other")
		_, err := v2.Call(context.Background(), abi.OpCreateVolume, []byte("x"))
		wantCode(t, err, abi.Unavailable, `module "good" is not loaded`)
		select {
		case <-v2.pool.drained:
		case <-time.After(5 * time.Second):
			t.Fatal("removed module did not drain")
		}
	})
}

// TestReloadSwapsUnderLoad reloads repeatedly while goroutines call the
// module: no call may fail.
func TestReloadSwapsUnderLoad(t *testing.T) {
	dir := t.TempDir()
	writeModule(t, dir, "good", fixture(t, "good"))
	r, err := New(context.Background(), testConfig(dir, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	if errs := r.Load(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	stop := make(chan struct{})
	failed := make(chan error, 4)
	for w := 0; w < 3; w++ {
		go func() {
			for {
				select {
				case <-stop:
					failed <- nil
					return
				default:
				}
				m := mustModule(t, r, "good")
				if resp, err := m.Call(context.Background(), abi.OpCreateVolume, []byte("x")); err != nil || string(resp) != "x" {
					failed <- err
					return
				}
			}
		}()
	}
	digests := map[string]bool{}
	for i := 0; i < 8; i++ {
		writeModule(t, dir, "good", withCustomSection(fixture(t, "good"), strings.Repeat("v", i+1)))
		if errs := r.Reload(context.Background()); len(errs) != 0 {
			t.Fatal(errs)
		}
		digests[mustModule(t, r, "good").Digest()] = true
	}
	close(stop)
	for w := 0; w < 3; w++ {
		if err := <-failed; err != nil {
			t.Fatalf("call during reload: %v", err)
		}
	}
	if len(digests) != 8 {
		t.Fatalf("%d distinct digests served, want 8", len(digests))
	}
}

func TestCloseWaitsThenForces(t *testing.T) {
	g := newGate()
	dir := t.TempDir()
	writeModule(t, dir, "good", fixture(t, "good"))
	r, err := New(context.Background(), testConfig(dir, g))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.open)
	if errs := r.Load(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	inflight := blockedCalls(t, m, g, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = r.Close(ctx)
	if err == nil || !strings.Contains(err.Error(), `module "good": calls still running at close`) {
		t.Fatalf("Close: %v, want the running call reported", err)
	}
	g.open()
	if err := <-inflight; abi.CodeOf(err) != abi.Internal {
		t.Fatalf("call cut off by Close: %v, want INTERNAL", err)
	}
	if len(r.Modules()) != 0 {
		t.Fatal("modules left after Close")
	}
	if errs := r.Reload(context.Background()); errs[""] == nil {
		t.Fatal("Reload after Close did not fail")
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
