package modules

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

func TestCallGood(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
		c.Limits.PoolSize = 1
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	large := bytes.Repeat([]byte("0123456789"), 100)
	le32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	tests := []struct {
		name    string
		op      abi.Op
		req     []byte
		want    []byte
		code    abi.Code
		message string
	}{
		{name: "info", op: abi.OpInfo, want: []byte("good")},
		{name: "echo", op: abi.OpCreateVolume, req: []byte("hello"), want: []byte("hello")},
		{name: "echo empty", op: abi.OpCreateVolume},
		{name: "echo 64 KiB", op: abi.OpCreateVolume, req: bytes.Repeat([]byte{7}, 64512), want: bytes.Repeat([]byte{7}, 64512)},
		{name: "request over the guest's buffer", op: abi.OpCreateVolume, req: make([]byte, 64513), code: abi.ResourceExhausted, message: "request too large"},
		{name: "host call, result fits", op: abi.OpDeleteVolume, req: []byte("tiny"), want: []byte("tiny")},
		{name: "host call, result via result_read", op: abi.OpDeleteVolume, req: large, want: large},
		{name: "host call env", op: abi.OpDeleteVolume, req: []byte("env"), want: []byte("good|/srv/pool-a")},
		{name: "host call abi error keeps its code", op: abi.OpDeleteVolume, req: []byte("notfound"), code: abi.NotFound, message: "no such thing"},
		{name: "host call plain error is internal", op: abi.OpDeleteVolume, req: []byte("plain"), code: abi.Internal, message: "plain failure"},
		{name: "module error", op: abi.OpGetCapacity, code: abi.NotFound, message: "no such pool"},
		{name: "no preopened directory", op: abi.OpNodeInfo, want: le32(8)},
		{name: "initialized once", op: abi.OpVolumeHealth, want: le32(1)},
		{name: "unimplemented", op: abi.OpNodeStage, code: abi.Unimplemented, message: `module "good" does not implement node_stage`},
	}
	first := idle(m)
	if len(first) != 1 {
		t.Fatalf("%d idle instances after load, want 1", len(first))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := m.Call(context.Background(), tt.op, tt.req)
			if tt.code != abi.OK {
				wantCode(t, err, tt.code)
				if err.(*abi.Error).Message != tt.message && !strings.Contains(err.Error(), tt.message) {
					t.Fatalf("message %q, want %q", err.(*abi.Error).Message, tt.message)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(resp, tt.want) {
				t.Fatalf("response %q, want %q", trim(resp), trim(tt.want))
			}
			// Answers, errors included, never cost the instance.
			if now := idle(m); len(now) != 1 || now[0] != first[0] {
				t.Fatalf("instance replaced after a normal answer")
			}
		})
	}
}

// TestHostCallsShareTheCallersMemo: a host call runs under the caller's
// context, so what it puts in the caller's memo (hostcalls.Memo) is there
// for the caller's next step once the call returns: the host relies on it
// to reuse a loop device's description after node_stage.
func TestHostCallsShareTheCallersMemo(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	ctx := hostcalls.WithMemo(context.Background())
	if _, err := m.Call(ctx, abi.OpDeleteVolume, []byte("memo")); err != nil {
		t.Fatal(err)
	}
	if v, ok := hostcalls.MemoOf(ctx).Load("test_echo"); !ok || v != "seen" {
		t.Fatalf("caller's memo after the call = %v, %v; want the host call's mark", v, ok)
	}
}

func trim(b []byte) []byte {
	if len(b) > 32 {
		return append(b[:32:32], "..."...)
	}
	return b
}

func TestHostCallPanicFailsOnlyItsCall(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) { c.Limits.PoolSize = 1 })
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	before := idle(m)[0]
	_, err := m.Call(context.Background(), abi.OpDeleteVolume, []byte("panic"))
	wantCode(t, err, abi.Internal, `module "good": delete_volume: host call test_echo panicked: host call exploded`)
	if n := m.pool.size(); n != 0 {
		t.Fatalf("%d instances live after the panic, want 0 (discarded)", n)
	}
	resp, err := m.Call(context.Background(), abi.OpDeleteVolume, []byte("after"))
	if err != nil || string(resp) != "after" {
		t.Fatalf("call after the panic: %q, %v", resp, err)
	}
	if idle(m)[0] == before {
		t.Fatal("the panicked instance was reused")
	}
}

// TestBadCalls: each misbehaving module fails only its own call, with the
// right code and a message naming the problem, within its deadline; the
// instance is discarded and the module serves the next call afresh.
func TestBadCalls(t *testing.T) {
	const timeout = 100 * time.Millisecond
	r, errs := startRuntime(t, map[string]string{"trap": "trap", "loop": "loop", "flood": "flood", "garbage": "garbage", "hugemax": "hugemax"}, nil,
		func(c *Config) {
			c.Limits.PoolSize = 1
			c.Overrides = map[string]Limits{"loop": {CallTimeout: timeout}}
		})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	tests := []struct {
		module string
		code   abi.Code
		parts  []string
		keep   bool
	}{
		{"trap", abi.Internal, []string{`module "trap": create_volume: trap: wasm error: unreachable`, "stderr: boom: disk on fire"}, false},
		{"loop", abi.DeadlineExceeded, []string{`module "loop": create_volume: deadline exceeded (guest time over the call timeout 100ms; time in host calls not counted)`}, false},
		{"flood", abi.Internal, []string{`module "flood": create_volume: trap: wasm error: unreachable`}, false},
		{"garbage", abi.Internal, []string{`module "garbage": create_volume returned garbage code 999`}, false},
		// The host's limit (64 pages in tests) wins over a declared max of 65536.
		{"hugemax", abi.ResourceExhausted, []string{"\x40\x00\x00\x00"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.module, func(t *testing.T) {
			m := mustModule(t, r, tt.module)
			for round := 0; round < 2; round++ {
				start := time.Now()
				_, err := m.Call(context.Background(), abi.OpCreateVolume, []byte("req"))
				wantCode(t, err, tt.code, tt.parts...)
				if d := time.Since(start); d > timeout+2*time.Second {
					t.Fatalf("call took %s", d)
				}
				if got, want := m.pool.size(), map[bool]int{true: 1, false: 0}[tt.keep]; got != want {
					t.Fatalf("%d live instances after the call, want %d", got, want)
				}
			}
		})
	}
}

func TestCallerContextStopsGuest(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"loop": "loop"}, nil, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "loop")
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := m.Call(ctx, abi.OpCreateVolume, nil)
		wantCode(t, err, abi.Canceled, `module "loop": create_volume: canceled`)
	})
	t.Run("caller deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := m.Call(ctx, abi.OpCreateVolume, nil)
		wantCode(t, err, abi.DeadlineExceeded, "deadline exceeded")
	})
	t.Run("already done", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		n := m.pool.size()
		_, err := m.Call(ctx, abi.OpCreateVolume, nil)
		wantCode(t, err, abi.Canceled)
		if m.pool.size() != n {
			t.Fatal("an instance was created or lost for a call that never ran")
		}
	})
}

// TestIsolationUnderConcurrency runs the good module from several goroutines
// while the bad modules fail theirs; run it with -race.
func TestIsolationUnderConcurrency(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"good": "good", "trap": "trap", "loop": "loop", "flood": "flood", "garbage": "garbage"}, nil,
		func(c *Config) {
			c.Limits.PoolSize = 2
			c.Overrides = map[string]Limits{
				"loop":  {CallTimeout: 30 * time.Millisecond},
				"flood": {MemoryPages: 16},
			}
		})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	good := mustModule(t, r, "good")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	goodCalls := make([]int, 4)
	for w := range goodCalls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				op := abi.OpCreateVolume
				if i%2 == 1 {
					op = abi.OpDeleteVolume
				}
				req := fmt.Appendf(nil, "worker %d call %d %s", w, i, strings.Repeat("x", i%40))
				resp, err := good.Call(context.Background(), op, req)
				if err != nil || !bytes.Equal(resp, req) {
					fail("good %s: %q, %v", op, resp, err)
					return
				}
				goodCalls[w]++
			}
		}()
	}
	bad := map[string]abi.Code{"trap": abi.Internal, "loop": abi.DeadlineExceeded, "flood": abi.Internal, "garbage": abi.Internal}
	badCalls := map[string]*int{}
	for name, code := range bad {
		m := mustModule(t, r, name)
		n := new(int)
		badCalls[name] = n
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := m.Call(context.Background(), abi.OpCreateVolume, nil)
				if abi.CodeOf(err) != code {
					fail("%s: %v, want code %s", name, err, code)
					return
				}
				*n++
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	for w, n := range goodCalls {
		if n < 10 {
			t.Errorf("good worker %d made only %d calls", w, n)
		}
	}
	for name, n := range badCalls {
		if *n < 1 {
			t.Errorf("%s made only %d calls", name, *n)
		}
	}
	t.Logf("good calls per worker %v; bad calls trap %d loop %d flood %d garbage %d",
		goodCalls, *badCalls["trap"], *badCalls["loop"], *badCalls["flood"], *badCalls["garbage"])
}

func TestGuestOutputIsLogged(t *testing.T) {
	rec := &logRecorder{}
	r, errs := startRuntime(t, map[string]string{"good": "good", "trap": "trap"}, nil, func(c *Config) {
		c.Log = slog.New(rec)
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if _, err := mustModule(t, r, "good").Call(context.Background(), abi.OpInfo, nil); err != nil {
		t.Fatal(err)
	}
	_, _ = mustModule(t, r, "trap").Call(context.Background(), abi.OpCreateVolume, nil)
	tests := []struct {
		msg   string
		attrs map[string]string
	}{
		{"hello from good", map[string]string{"module": "good", "op": "backend_info", "level": "INFO"}},
		{"boom: disk on fire", map[string]string{"module": "trap", "op": "create_volume", "stream": "stderr", "level": "WARN"}},
		{"module loaded", map[string]string{"module": "good"}},
	}
	for _, tt := range tests {
		attrs, ok := rec.find(tt.msg)
		if !ok {
			t.Errorf("no log line %q", tt.msg)
			continue
		}
		for k, v := range tt.attrs {
			if attrs[k] != v {
				t.Errorf("log line %q: %s=%q, want %q (all: %v)", tt.msg, k, attrs[k], v, attrs)
			}
		}
	}
}

// TestWASIIsSandboxed: random and clocks are wazero's deterministic fakes, the
// same in every instance; no directory is preopened (see TestCallGood).
func TestWASIIsSandboxed(t *testing.T) {
	r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) { c.Limits.PoolSize = 1 })
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	first, err := m.Call(context.Background(), abi.OpStorageHealth, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Discard the instance so the next call runs on a fresh one.
	if _, err := m.Call(context.Background(), abi.OpDeleteVolume, []byte("panic")); abi.CodeOf(err) != abi.Internal {
		t.Fatalf("discarding call: %v", err)
	}
	second, err := m.Call(context.Background(), abi.OpStorageHealth, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 16 || !bytes.Equal(first[:8], second[:8]) {
		t.Fatalf("random bytes differ between fresh instances: %x, %x", first, second)
	}
	clock := time.Unix(0, int64(binary.LittleEndian.Uint64(first[8:])))
	if time.Since(clock) < 24*time.Hour {
		t.Fatalf("guest sees the real wall clock %s", clock)
	}
}

// A successful call's outcome is counted without allocating: codeOf runs
// on every call.
func TestCodeOfOKAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() {
		if codeOf(nil) != abi.OK {
			t.Fatal("codeOf(nil) is not OK")
		}
	}); n != 0 {
		t.Fatalf("codeOf(nil) allocates %v times", n)
	}
	if c := codeOf(abi.Errorf(abi.NotFound, "x")); c != abi.NotFound {
		t.Fatalf("codeOf(NotFound error) = %v", c)
	}
}
