package host_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// syncBuffer is a log sink the daemon's goroutines may write concurrently.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// dmthin granted as the default configuration grants it, on a kernel
// without device-mapper, is refused at every start with the reason, and
// touches nothing first: no pool files created, no loop device attached.
// (It used to create its 4 GiB data and 64 MiB metadata files and attach
// both as loop devices before its pool open failed.)
func TestModuleForMissingKernelFeatureTouchesNothing(t *testing.T) {
	requireRoot(t)
	if dm.Available() == nil {
		t.Skip("this kernel has device-mapper, so dmthin loads here; the refusal is tested where it has not")
	}
	wasm := moduletest.Build(t, "../examples/dmthin", moduletest.Go)
	cfg, dir := testConfig(t)
	cfg.DefaultBackend = ""
	cfg.WatchModules = false
	pool := filepath.Join(dir, "pools", "dmthin")
	for _, d := range []string{cfg.ModuleDir, pool} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.ModuleDir, "dmthin.wasm"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Modules = map[string]config.Module{"dmthin": {
		HostCalls: []string{"dm", "file", "loop"},
		Roots:     []string{pool, "wasmcsi-t-nodm-", "/dev/mapper/wasmcsi-t-nodm-"},
		Config: map[string]string{"pool": "wasmcsi-t-nodm-thin", "data_device": "data.img", "metadata_device": "meta.img",
			"data_size": "4Gi", "metadata_size": "64Mi"},
	}}
	calls, err := host.DefaultHostCalls(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	for start := 1; start <= 2; start++ {
		var logBuf syncBuffer
		log := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		srv, err := host.New(context.Background(), cfg, host.Options{Log: log, HostCalls: calls})
		if err != nil {
			t.Fatal(err)
		}
		backends := srv.Backends()
		srv.Close(context.Background())
		out := logBuf.String()
		if slices.Contains(backends, "dmthin") {
			t.Fatalf("start %d: dmthin loaded without device-mapper", start)
		}
		if !strings.Contains(out, `host call family \"dm\" is not available`) || !strings.Contains(out, "device-mapper is not available") {
			t.Errorf("start %d: the log does not give the reason:\n%s", start, out)
		}
		if strings.Contains(out, "loop device attached") {
			t.Errorf("start %d: a loop device was attached for a refused module:\n%s", start, out)
		}
		entries, err := os.ReadDir(pool)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			t.Errorf("start %d: the refused module left %s in its pool folder", start, e.Name())
		}
	}
}
