package modules

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// gate lets a test hold host calls of the fake registry until it opens.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// waitEntered waits until n calls are held at the gate.
func (g *gate) waitEntered(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d calls reached the gate", i, n)
		}
	}
}

// fakeRegistry is the host-call registry of the tests: one call, test_echo
// (family "test"), whose behaviour depends on its request.
func fakeRegistry(g *gate) map[string]hostcalls.Func {
	return map[string]hostcalls.Func{
		"test_echo": {
			Name:   "test_echo",
			Family: "test",
			Call: func(ctx context.Context, env *hostcalls.Env, req []byte) ([]byte, error) {
				switch string(req) {
				case "panic":
					panic("host call exploded")
				case "notfound":
					return nil, abi.Errorf(abi.NotFound, "no such thing")
				case "plain":
					return nil, errors.New("plain failure")
				case "sleep":
					// Work longer than the tests' guest budgets, stopping
					// early only for the caller's context.
					select {
					case <-time.After(300 * time.Millisecond):
						return []byte("slept"), nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				case "hang":
					<-ctx.Done()
					return nil, ctx.Err()
				case "env":
					return []byte(env.Module + "|" + strings.Join(env.Roots, ",")), nil
				case "memo":
					// Leaves a mark in the caller's memo, if there is one.
					hostcalls.MemoOf(ctx).Store("test_echo", "seen")
					return req, nil
				case "block":
					if g == nil {
						return nil, errors.New("no gate")
					}
					g.entered <- struct{}{}
					select {
					case <-g.release:
						return []byte("released"), nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
				return req, nil
			},
		},
	}
}

// fixture returns the bytes of testdata/<name>.wasm.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withCustomSection appends a custom section to a module: a new digest with
// the same behaviour.
func withCustomSection(wasm []byte, payload string) []byte {
	name := "note"
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, payload...)
	if len(body) > 127 {
		panic("custom section too long for a one-byte size")
	}
	out := append(bytes.Clone(wasm), 0, byte(len(body)))
	return append(out, body...)
}

// writeModule writes data as dir/<name>.wasm.
func writeModule(t testing.TB, dir, name string, data []byte) {
	t.Helper()
	// Write then rename, as an operator's tooling should, so a reload never
	// reads half a file.
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name+".wasm")); err != nil {
		t.Fatal(err)
	}
}

// testConfig is a Config over dir with test-sized limits and the fake registry.
func testConfig(dir string, g *gate) Config {
	return Config{
		Dir: dir,
		Limits: Limits{
			CallTimeout:    5 * time.Second,
			MemoryPages:    64,
			PoolSize:       2,
			AcquireTimeout: 2 * time.Second,
		},
		Grants: map[string]Grant{
			"good": {HostCalls: []string{"test"}, Roots: []string{"/srv/pool-a"}},
		},
		HostCalls: fakeRegistry(g),
	}
}

// startRuntime writes the fixtures (module name -> fixture name) into a new
// folder, builds a Runtime from cfg (Dir is filled in) and loads it. The
// runtime is closed at the end of the test.
func startRuntime(t testing.TB, files map[string]string, g *gate, tune func(*Config)) (*Runtime, map[string]error) {
	t.Helper()
	dir := t.TempDir()
	for name, fx := range files {
		writeModule(t, dir, name, fixture(t, fx))
	}
	cfg := testConfig(dir, g)
	if tune != nil {
		tune(&cfg)
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if g != nil {
			g.open()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("close runtime: %v", err)
		}
	})
	return r, r.Load(context.Background())
}

// mustModule returns the loaded module name or fails the test.
func mustModule(t testing.TB, r *Runtime, name string) *Module {
	t.Helper()
	m, ok := r.Module(name)
	if !ok {
		t.Fatalf("module %q is not loaded", name)
	}
	return m
}

// wantCode checks that err is an *abi.Error with code and a message
// containing every part.
func wantCode(t testing.TB, err error, code abi.Code, parts ...string) {
	t.Helper()
	var ae *abi.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *abi.Error with code %s", err, err, code)
	}
	if ae.Code != code {
		t.Fatalf("code %s, want %s (message %q)", ae.Code, code, ae.Message)
	}
	for _, p := range parts {
		if !strings.Contains(ae.Message, p) {
			t.Fatalf("message %q does not contain %q", ae.Message, p)
		}
	}
}

// idle returns the module's idle instances without taking them.
func idle(m *Module) []*instance {
	var out []*instance
	for {
		select {
		case inst := <-m.pool.idle:
			out = append(out, inst)
			continue
		default:
		}
		break
	}
	for _, inst := range out {
		m.pool.idle <- inst
	}
	return out
}

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
	attrs   []slog.Attr
	parent  *logRecorder
}

func (h *logRecorder) root() *logRecorder {
	if h.parent != nil {
		return h.parent.root()
	}
	return h
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	root := h.root()
	root.mu.Lock()
	root.records = append(root.records, r)
	root.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecorder{parent: h, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

// find returns the first record whose message contains msg, with its
// attributes as strings.
func (h *logRecorder) find(msg string) (map[string]string, bool) {
	root := h.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	for _, r := range root.records {
		if strings.Contains(r.Message, msg) {
			attrs := map[string]string{"level": r.Level.String()}
			r.Attrs(func(a slog.Attr) bool {
				attrs[a.Key] = a.Value.String()
				return true
			})
			return attrs, true
		}
	}
	return nil, false
}
