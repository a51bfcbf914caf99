package modules

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wasmcsi/wasmcsi/abi"
)

// metrics are the runtime's Prometheus collectors.
type metrics struct {
	calls     *prometheus.CounterVec   // module, op, code
	duration  *prometheus.HistogramVec // module, op
	instances *prometheus.GaugeVec     // module
	discarded *prometheus.CounterVec   // module
	memory    *prometheus.GaugeVec     // module

	logDroppedLines *prometheus.CounterVec // module
	logDroppedBytes *prometheus.CounterVec // module
}

// opMetrics are the children of one module's op, resolved once at load so a
// successful call touches no label map.
type opMetrics struct {
	ok       prometheus.Counter
	duration prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "calls_total",
			Help: "Module operation calls by module, operation and result code.",
		}, []string{"module", "op", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "call_duration_seconds",
			Help:    "Duration of module operation calls, including waiting for an instance.",
			Buckets: prometheus.ExponentialBuckets(1e-5, 4, 12), // 10 µs .. 42 s
		}, []string{"module", "op"}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "instances",
			Help: "Live initialized instances by module.",
		}, []string{"module"}),
		discarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "discarded_instances_total",
			Help: "Instances discarded after an error, trap or timeout, by module.",
		}, []string{"module"}),
		memory: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "memory_bytes",
			Help: "Linear memory held by the module's instances, counted against the daemon's guest memory budget.",
		}, []string{"module"}),
		logDroppedLines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "log_dropped_lines_total",
			Help: "Lines of guest output (stdout, stderr, log import) not logged for being over a call's or the module's bounds, by module.",
		}, []string{"module"}),
		logDroppedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "log_dropped_bytes_total",
			Help: "Bytes of guest output not logged: dropped lines and the cut ends of over-long lines, by module.",
		}, []string{"module"}),
	}
	var done []prometheus.Collector
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, errors.Join(errors.New("modules: register metrics"), err)
		}
		done = append(done, c)
	}
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.duration, m.instances, m.discarded, m.memory, m.logDroppedLines, m.logDroppedBytes}
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	for _, c := range m.collectors() {
		reg.Unregister(c)
	}
}

// forModule resolves the per-op children of a module; nil without metrics.
func (m *metrics) forModule(name string, ops map[abi.Op]bool) map[abi.Op]opMetrics {
	if m == nil {
		return nil
	}
	om := make(map[abi.Op]opMetrics, len(ops))
	for op := range ops {
		om[op] = opMetrics{
			ok:       m.calls.WithLabelValues(name, string(op), abi.OK.String()),
			duration: m.duration.WithLabelValues(name, string(op)),
		}
	}
	return om
}
