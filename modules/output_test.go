package modules

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wasmcsi/wasmcsi/abi"
)

// lineCounter is a slog.Handler that counts the noisy module's records and
// their bytes, and keeps the first thousand whose message is not empty.
type lineCounter struct {
	mu    *sync.Mutex
	lines *int
	bytes *int
	kept  *[]map[string]string
	attrs []slog.Attr
}

func newLineCounter() *lineCounter {
	return &lineCounter{mu: &sync.Mutex{}, lines: new(int), bytes: new(int), kept: new([]map[string]string)}
}

func (h *lineCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h *lineCounter) Handle(_ context.Context, r slog.Record) error {
	attrs := map[string]string{"msg": r.Message}
	for _, a := range h.attrs {
		attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	if attrs["module"] != "noisy" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.lines++
	*h.bytes += len(r.Message)
	if r.Message != "" && len(*h.kept) < 1000 {
		*h.kept = append(*h.kept, attrs)
	}
	return nil
}

func (h *lineCounter) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *lineCounter) WithGroup(string) slog.Handler { return h }

func (h *lineCounter) counts() (lines, bytes int, kept []map[string]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return *h.lines, *h.bytes, append([]map[string]string(nil), *h.kept...)
}

// TestGuestOutputBounded: a call that writes 1 MiB of newlines to stderr, a
// 64 KiB line to stdout and 1000 lines through the log import logs at most
// callLogLines lines and one summary, counts the rest in the metrics, and
// takes well under a second; repeated calls stay within the module's rate.
// A quiet call of the same module still logs its line.
func TestGuestOutputBounded(t *testing.T) {
	logs := newLineCounter()
	reg := prometheus.NewRegistry()
	r, errs := startRuntime(t, map[string]string{"noisy": "noisy"}, nil, func(c *Config) {
		c.Log = slog.New(logs)
		c.Metrics = reg
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "noisy")
	before, _, _ := logs.counts()
	first := time.Now()
	start := first
	if _, err := m.Call(context.Background(), abi.OpCreateVolume, nil); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	lines, bytes, kept := logs.counts()
	lines -= before
	t.Logf("one flooding call: %d lines, %d bytes of log in %v", lines, bytes, took)
	if lines > callLogLines+1 {
		t.Errorf("one call logged %d lines, want at most %d and a summary", lines, callLogLines)
	}
	if took > 2*time.Second {
		t.Errorf("the flooding call took %v", took)
	}
	// 1 MiB of empty lines, one 64 KiB line and 1000 lines of "spam"; the
	// first callLogLines empty lines are logged.
	wantLines, wantBytes := 1<<20+1+1000-callLogLines, 64<<10+1000*4
	var summary []map[string]string
	for _, k := range kept {
		if strings.Contains(k["msg"], "dropped") {
			summary = append(summary, k)
		}
	}
	if len(summary) != 1 || summary[0]["dropped_lines"] != itoa(wantLines) || summary[0]["dropped_bytes"] != itoa(wantBytes) || summary[0]["op"] != "create_volume" {
		t.Errorf("summary lines %v, want one with dropped_lines=%d dropped_bytes=%d", summary, wantLines, wantBytes)
	}
	if v, _ := sample(t, reg, "wasmcsi_module_log_dropped_lines_total", map[string]string{"module": "noisy"}); v != float64(wantLines) {
		t.Errorf("log_dropped_lines_total = %v, want %d", v, wantLines)
	}
	if v, _ := sample(t, reg, "wasmcsi_module_log_dropped_bytes_total", map[string]string{"module": "noisy"}); v != float64(wantBytes) {
		t.Errorf("log_dropped_bytes_total = %v, want %d", v, wantBytes)
	}

	// Ten more: the module's bucket (moduleLogBurst, then moduleLogRate per
	// second) bounds them together.
	for range 10 {
		if _, err := m.Call(context.Background(), abi.OpCreateVolume, nil); err != nil {
			t.Fatal(err)
		}
	}
	total, _, _ := logs.counts()
	total -= before
	if limit := moduleLogBurst + int(time.Since(first).Seconds()*moduleLogRate) + 1; total > limit {
		t.Errorf("11 flooding calls logged %d lines, over the module's bound of %d", total, limit)
	}
	t.Logf("11 flooding calls: %d lines of log", total)

	// After a pause the module logs again.
	time.Sleep(50 * time.Millisecond)
	if _, err := m.Call(context.Background(), abi.OpDeleteVolume, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, kept := logs.counts(); !containsMsg(kept, "quiet") {
		t.Errorf("a quiet call after the floods was not logged")
	}
}

func containsMsg(recs []map[string]string, msg string) bool {
	for _, r := range recs {
		if r["msg"] == msg {
			return true
		}
	}
	return false
}

func itoa(n int) string { return slog.IntValue(n).String() }
