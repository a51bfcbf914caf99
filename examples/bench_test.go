//go:build linux

// Package examples_test measures what each example backend module costs the
// daemon, built with standard Go and with TinyGo: file size, compile time
// without and with the on-disk compilation cache, instantiate+_initialize
// time, memory per pooled instance, and the cost of one call through the
// real module runtime. It only reads and runs the built modules; it must
// never need root, devices or mounts (those costs belong to
// host/bench_test.go).
package examples_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// memoryPages is the daemon's default per-instance memory cap
// (host/config/default.yaml, limits.memory_pages); it is part of the
// compiled code's configuration, so compile with the same value.
const memoryPages = 4096

// example is one example module and the host-call families its configure
// and backend_info need granted.
type example struct {
	name      string
	hostcalls []string
}

// measured are the example modules this benchmark measures: the ones that
// configure with nothing but a pool folder. An example missing from the
// tree is skipped.
var measured = []example{
	{"localdir", []string{"dir", "mount"}},
	{"loopfile", []string{"file", "loop"}},
}

// runtimeConfig is the wazero configuration modules.Runtime compiles and
// runs every module with (modules/module.go): deadlines that close the
// instance, and the memory cap.
func runtimeConfig() wazero.RuntimeConfig {
	return wazero.NewRuntimeConfig().WithCloseOnContextDone(true).WithMemoryLimitPages(memoryPages)
}

// result is one row of the summary table.
type result struct {
	size                                 int
	cold, cached, instantiate, call, p50 time.Duration
	pages                                uint32
	heapPerInstance                      uint64
}

// BenchmarkToolchains measures every example module with both toolchains
// and prints a side-by-side table at the end (go test -bench Toolchains).
func BenchmarkToolchains(b *testing.B) {
	rows := map[string]*result{}
	var order []string
	for _, ex := range measured {
		for _, tc := range moduletest.Toolchains {
			key := ex.name + "/" + string(tc)
			b.Run(key, func(b *testing.B) {
				if _, err := os.Stat(filepath.Join(ex.name, "main.go")); err != nil {
					b.Skipf("example %s is not in the tree: %v", ex.name, err)
				}
				wasm := moduletest.Build(b, "./"+ex.name, tc)
				data, err := os.ReadFile(wasm)
				if err != nil {
					b.Fatal(err)
				}
				r := &result{size: len(data)}
				rows[key] = r
				order = append(order, key)
				b.Run("compile-cold", func(b *testing.B) { benchCompileCold(b, data, r) })
				b.Run("compile-cached", func(b *testing.B) { benchCompileCached(b, data, r) })
				b.Run("instantiate", func(b *testing.B) { benchInstantiate(b, data, r) })
				b.Run("call", func(b *testing.B) { benchCall(b, ex, wasm, r) })
			})
		}
	}
	printTable(order, rows)
}

// benchCompileCold compiles the module in a fresh runtime with no cache.
func benchCompileCold(b *testing.B, data []byte, r *result) {
	ctx := context.Background()
	for b.Loop() {
		rt := wazero.NewRuntimeWithConfig(ctx, runtimeConfig())
		cm, err := rt.CompileModule(ctx, data)
		if err != nil {
			b.Fatal(err)
		}
		_ = cm.Close(ctx)
		_ = rt.Close(ctx)
	}
	r.cold = b.Elapsed() / time.Duration(b.N)
	// After the loop: its first iteration resets the timer, which drops
	// metrics reported before.
	b.ReportMetric(float64(len(data)), "wasm-bytes")
}

// benchCompileCached compiles the module in a fresh runtime whose fresh
// compilation cache object reads a folder filled beforehand, as a daemon
// restart does.
func benchCompileCached(b *testing.B, data []byte, r *result) {
	ctx := context.Background()
	dir := b.TempDir()
	compile := func() {
		cache, err := wazero.NewCompilationCacheWithDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		rt := wazero.NewRuntimeWithConfig(ctx, runtimeConfig().WithCompilationCache(cache))
		cm, err := rt.CompileModule(ctx, data)
		if err != nil {
			b.Fatal(err)
		}
		_ = cm.Close(ctx)
		_ = rt.Close(ctx)
		_ = cache.Close(ctx)
	}
	compile() // fills the folder
	if files, _ := os.ReadDir(dir); len(files) == 0 {
		b.Fatal("the compilation cache folder stayed empty")
	}
	for b.Loop() {
		compile()
	}
	r.cached = b.Elapsed() / time.Duration(b.N)
}

// stubHost instantiates WASI and a "wasmcsi" host module whose every
// function the module imports answers zeros: enough for _initialize, which
// calls none of them, without the runtime's checks.
func stubHost(b *testing.B, ctx context.Context, rt wazero.Runtime, cm wazero.CompiledModule) {
	b.Helper()
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		b.Fatal(err)
	}
	hb := rt.NewHostModuleBuilder(abi.HostModule)
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != abi.HostModule {
			continue
		}
		results := f.ResultTypes()
		hb.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			for i := range results {
				stack[i] = 0
			}
		}), f.ParamTypes(), results).Export(name)
	}
	if _, err := hb.Instantiate(ctx); err != nil {
		b.Fatal(err)
	}
}

// instantiate makes one initialized instance, as the runtime's pool does
// (no name, no start functions, then _initialize).
func instantiate(ctx context.Context, rt wazero.Runtime, cm wazero.CompiledModule) (api.Module, error) {
	mod, err := rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		return nil, err
	}
	if init := mod.ExportedFunction(abi.ExportInitialize); init != nil {
		if _, err := init.Call(ctx); err != nil {
			_ = mod.Close(ctx)
			return nil, fmt.Errorf("_initialize: %w", err)
		}
	}
	return mod, nil
}

// benchInstantiate times instantiate+_initialize (closing is not timed),
// then keeps a batch of instances open to report the linear memory pages
// of one initialized instance and the Go heap each one costs (wazero
// allocates linear memory on the Go heap).
func benchInstantiate(b *testing.B, data []byte, r *result) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, runtimeConfig())
	b.Cleanup(func() { _ = rt.Close(ctx) })
	cm, err := rt.CompileModule(ctx, data)
	if err != nil {
		b.Fatal(err)
	}
	stubHost(b, ctx, rt, cm)
	for b.Loop() {
		mod, err := instantiate(ctx, rt, cm)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = mod.Close(ctx)
		b.StartTimer()
	}
	r.instantiate = b.Elapsed() / time.Duration(b.N)

	const batch = 16
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	mods := make([]api.Module, 0, batch)
	for range batch {
		mod, err := instantiate(ctx, rt, cm)
		if err != nil {
			b.Fatal(err)
		}
		mods = append(mods, mod)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	r.pages = mods[0].Memory().Size() / 65536
	if after.HeapAlloc > before.HeapAlloc {
		r.heapPerInstance = (after.HeapAlloc - before.HeapAlloc) / batch
	}
	for _, m := range mods {
		if got := m.Memory().Size() / 65536; got != r.pages {
			b.Fatalf("instances differ after _initialize: %d and %d pages", r.pages, got)
		}
		_ = m.Close(ctx)
	}
	b.ReportMetric(float64(r.pages), "pages")
	b.ReportMetric(float64(r.heapPerInstance), "heap-bytes/instance")
}

// benchCall times backend_info (guest code and codec, no host call)
// through the real runtime: a pooled, configured instance, the call
// deadline, the request and response copies.
func benchCall(b *testing.B, ex example, wasm string, r *result) {
	lm := moduletest.Load(b, wasm, moduletest.Options{
		Name:      ex.name,
		Grant:     modules.Grant{HostCalls: ex.hostcalls, Roots: []string{b.TempDir()}},
		HostCalls: catalog.All(),
	})
	if lm.Info.Name != ex.name {
		b.Fatalf("backend_info names %q, want %q", lm.Info.Name, ex.name)
	}
	m, ok := lm.Runtime().Module(ex.name)
	if !ok {
		b.Fatalf("module %s not loaded", ex.name)
	}
	ctx := context.Background()
	req := (&abi.Empty{}).AppendWire(nil)
	times := make([]time.Duration, 0, 1<<16)
	for b.Loop() {
		start := time.Now()
		_, err := m.Call(ctx, abi.OpInfo, req)
		if len(times) < cap(times) {
			times = append(times, time.Since(start))
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(times)
	r.call = b.Elapsed() / time.Duration(b.N)
	r.p50 = times[len(times)/2]
	b.ReportMetric(float64(r.p50.Nanoseconds()), "p50-ns")
}

// printTable prints the side-by-side table docs/PERFORMANCE.md shows. It
// goes to standard output: the testing package drops the log of a
// benchmark that only runs sub-benchmarks unless it fails.
func printTable(order []string, rows map[string]*result) {
	if len(order) == 0 {
		return
	}
	var sb strings.Builder
	w := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "module\tsize\tcompile cold\tcompile cached\tinstantiate+init\tpages\theap/instance\tcall mean\tcall p50\t")
	for _, key := range order {
		r := rows[key]
		fmt.Fprintf(w, "%s\t%.2f MB\t%s\t%s\t%s\t%d\t%.2f MiB\t%s\t%s\t\n", key,
			float64(r.size)/1e6, round(r.cold), round(r.cached), round(r.instantiate),
			r.pages, float64(r.heapPerInstance)/(1<<20), round(r.call), round(r.p50))
	}
	w.Flush()
	fmt.Print("\nBenchmarkToolchains summary (last run of each sub-benchmark):\n", sb.String())
}

// round keeps three significant digits.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= 100*time.Microsecond:
		return d.Round(time.Microsecond)
	case d >= 10*time.Microsecond:
		return d.Round(100 * time.Nanosecond)
	}
	return d.Round(10 * time.Nanosecond)
}
