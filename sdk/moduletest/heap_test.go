//go:build !wasip1

package moduletest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

// A TinyGo module's heap gets its headroom on the first call (sdk/guest,
// heap_tinygo.go): without it TinyGo keeps the heap a few dozen KiB above
// what the module keeps alive, and a full collection ran every few dozen
// calls (0.2-0.7 ms each, twice the mean cost of a call). The instance's
// linear memory shows it: TinyGo starts the minimal module in 2 pages and
// doubles the memory to fit the headroom.
func TestTinyGoHeapHeadroom(t *testing.T) {
	wasm := moduletest.Build(t, minimal, moduletest.TinyGo)
	dir := t.TempDir()
	data, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "minimal.wasm"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ctx := context.Background()
	rt, err := modules.New(ctx, modules.Config{
		Dir:     dir,
		Limits:  modules.Limits{CallTimeout: 5 * time.Second, MemoryPages: 4096, PoolSize: 1, AcquireTimeout: 5 * time.Second},
		Metrics: reg,
		// The grant only lets the module load; its calls here use no host call.
		HostCalls: catalog.All(),
		Grants:    map[string]modules.Grant{"minimal": {HostCalls: []string{"dir"}, Roots: []string{t.TempDir()}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	if errs := rt.Load(ctx); errs["minimal"] != nil {
		t.Fatal(errs["minimal"])
	}
	m, ok := rt.Module("minimal")
	if !ok {
		t.Fatal("minimal did not load")
	}
	for range 3 {
		if _, err := m.Call(ctx, abi.OpInfo, (&abi.Empty{}).AppendWire(nil)); err != nil {
			t.Fatal(err)
		}
	}
	const want = 512 << 10 // the headroom of 256 KiB fits only once the memory doubled past it
	if got := memoryBytes(t, reg, "minimal"); got < want {
		t.Fatalf("the TinyGo instance holds %.0f bytes of linear memory after its calls, want at least %d: the heap got no headroom", got, want)
	}
}

// memoryBytes reads wasmcsi_module_memory_bytes of module from reg.
func memoryBytes(t *testing.T, reg *prometheus.Registry, module string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "wasmcsi_module_memory_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "module" && l.GetValue() == module {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no wasmcsi_module_memory_bytes for module %q", module)
	return 0
}
