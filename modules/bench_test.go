package modules

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// benchModule loads the good module with deadlines on (the default path:
// every call runs under CallTimeout with WithCloseOnContextDone).
func benchModule(b *testing.B, pool int) *Module {
	b.Helper()
	r, errs := startRuntime(b, map[string]string{"good": "good"}, nil, func(c *Config) {
		c.Limits.PoolSize = pool
		c.Limits.CallTimeout = 10 * time.Second
	})
	if len(errs) != 0 {
		b.Fatal(errs)
	}
	return mustModule(b, r, "good")
}

func benchCall(b *testing.B, m *Module, op abi.Op, req []byte) {
	resp, err := m.Call(context.Background(), op, req)
	if err != nil || !bytes.Equal(resp, req) {
		b.Fatalf("call: %q, %v", resp, err)
	}
}

// BenchmarkCall is one echo call with a 64-byte request.
func BenchmarkCall(b *testing.B) {
	m := benchModule(b, 1)
	req := bytes.Repeat([]byte{'r'}, 64)
	b.ReportAllocs()
	for b.Loop() {
		benchCall(b, m, abi.OpCreateVolume, req)
	}
}

// BenchmarkCallParallel is BenchmarkCall from GOMAXPROCS goroutines over a
// pool of as many instances.
func BenchmarkCallParallel(b *testing.B) {
	m := benchModule(b, 8)
	req := bytes.Repeat([]byte{'r'}, 64)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			benchCall(b, m, abi.OpCreateVolume, req)
		}
	})
}

// BenchmarkCallHostCall is one call that makes one host call (test_echo).
func BenchmarkCallHostCall(b *testing.B) {
	m := benchModule(b, 1)
	req := bytes.Repeat([]byte{'h'}, 64)
	b.ReportAllocs()
	for b.Loop() {
		benchCall(b, m, abi.OpDeleteVolume, req)
	}
}

// BenchmarkGuestClockPauseResume is what every host call adds: the guest
// clock paused and re-armed around it.
func BenchmarkGuestClockPauseResume(b *testing.B) {
	inst := &instance{}
	inst.clock.init(inst)
	inst.clock.start(context.Background(), 10*time.Second)
	defer inst.clock.end()
	for b.Loop() {
		if err := inst.clock.pause(); err != nil {
			b.Fatal(err)
		}
		if err := inst.clock.resume(); err != nil {
			b.Fatal(err)
		}
	}
}
