package modules

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/wasmcsi/wasmcsi/abi"
)

// sample returns the value of the metric family name with exactly labels.
func sample(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metric
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, errs := startRuntime(t, map[string]string{"good": "good", "trap": "trap"}, nil, func(c *Config) {
		c.Metrics = reg
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	good, trap := mustModule(t, r, "good"), mustModule(t, r, "trap")
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := good.Call(ctx, abi.OpCreateVolume, []byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = good.Call(ctx, abi.OpGetCapacity, nil)
	_, _ = trap.Call(ctx, abi.OpCreateVolume, nil)

	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"wasmcsi_module_calls_total", map[string]string{"module": "good", "op": "create_volume", "code": "OK"}, 2},
		{"wasmcsi_module_calls_total", map[string]string{"module": "good", "op": "get_capacity", "code": "NOT_FOUND"}, 1},
		{"wasmcsi_module_calls_total", map[string]string{"module": "trap", "op": "create_volume", "code": "INTERNAL"}, 1},
		{"wasmcsi_module_call_duration_seconds", map[string]string{"module": "good", "op": "create_volume"}, 2},
		{"wasmcsi_module_instances", map[string]string{"module": "good"}, 1},
		{"wasmcsi_module_instances", map[string]string{"module": "trap"}, 0},
		{"wasmcsi_module_discarded_instances_total", map[string]string{"module": "trap"}, 1},
	}
	for _, tt := range tests {
		got, ok := sample(t, reg, tt.name, tt.labels)
		if !ok || got != tt.want {
			t.Errorf("%s%v = %v (found %v), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}
	if _, err := New(ctx, Config{Dir: t.TempDir(), Metrics: reg}); err == nil {
		t.Error("a second runtime registered the same collectors")
	}
}
