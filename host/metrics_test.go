package host_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
)

// gauges returns the values of the gauge family name, keyed by the value
// of label.
func gauges(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labelOf(m, label)] = m.GetGauge().GetValue()
		}
	}
	return out
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// What an operator alerts on is exported: a refused module file
// (wasmcsi_module_refused 1 until it loads), each pool's filesystem size
// and free bytes, the last GetCapacity answer; and a failed CSI call is
// logged above Info.
func TestMetricsForAlerts(t *testing.T) {
	wasm := localdirWasm(t)
	cfg, dir := testConfig(t)
	cfg.DefaultBackend = "localdir"
	cfg.WatchModules = false
	pool := filepath.Join(dir, "pool")
	for _, d := range []string{cfg.ModuleDir, pool, filepath.Join(dir, "other")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.ModuleDir, "localdir.wasm"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Granted, but not a WebAssembly module.
	if err := os.WriteFile(filepath.Join(cfg.ModuleDir, "broken.wasm"), []byte("not wasm"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Modules = map[string]config.Module{
		"localdir": {HostCalls: []string{"dir", "mount"}, Roots: []string{pool}, Config: map[string]string{"quota": "off"}},
		"broken":   {HostCalls: []string{"dir"}, Roots: []string{filepath.Join(dir, "other")}},
	}
	var logBuf syncBuffer
	log := slog.New(slog.NewJSONHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := host.New(ctx, cfg, host.Options{Log: log, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())

	refused := gauges(t, reg, "wasmcsi_module_refused", "module")
	if refused["broken"] != 1 || refused["localdir"] != 0 || len(refused) != 2 {
		t.Errorf("wasmcsi_module_refused %v, want broken 1 and localdir 0", refused)
	}
	size := gauges(t, reg, "wasmcsi_pool_size_bytes", "backend")
	free := gauges(t, reg, "wasmcsi_pool_free_bytes", "backend")
	if size["localdir"] <= 0 || free["localdir"] <= 0 || free["localdir"] > size["localdir"] {
		t.Errorf("pool size %v, free %v", size, free)
	}
	if _, ok := size["broken"]; ok {
		t.Error("a refused module's pool is reported")
	}

	// Once the file is gone, its series goes too.
	if err := os.Remove(filepath.Join(cfg.ModuleDir, "broken.wasm")); err != nil {
		t.Fatal(err)
	}
	srv.Reload(ctx)
	if refused := gauges(t, reg, "wasmcsi_module_refused", "module"); len(refused) != 1 || refused["localdir"] != 0 {
		t.Errorf("after removing broken.wasm: wasmcsi_module_refused %v", refused)
	}

	lis, err := net.Listen("unix", filepath.Join(dir, "m.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeListener(ctx, lis)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "m.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cc := csi.NewControllerClient(conn)
	if _, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{}); err != nil {
		t.Fatal(err)
	}
	if c := gauges(t, reg, "wasmcsi_pool_available_capacity_bytes", "backend"); c["localdir"] <= 0 {
		t.Errorf("wasmcsi_pool_available_capacity_bytes %v after GetCapacity", c)
	}
	_, err = cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
	wantCode(t, err, codes.InvalidArgument)
	var found bool
	for _, line := range strings.Split(logBuf.String(), "\n") {
		var rec struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "csi call failed" {
			continue
		}
		found = true
		if rec.Level != "WARN" {
			t.Errorf("failed call logged at %s: %s", rec.Level, line)
		}
	}
	if !found {
		t.Errorf("no 'csi call failed' line:\n%s", logBuf.String())
	}
}
