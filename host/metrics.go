package host

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// MetricsRegisterer is where the daemon registers its metrics.
type MetricsRegisterer = prometheus.Registerer

// metrics counts CSI calls by method and code and times them.
type metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg MetricsRegisterer) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wasmcsi", Name: "csi_calls_total", Help: "CSI calls by method and gRPC code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "wasmcsi", Name: "csi_call_duration_seconds", Help: "CSI call latency by method.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 4, 10),
		}, []string{"method"}),
	}
	reg.MustRegister(m.calls, m.duration)
	return m
}

func (m *metrics) observe(method string, code codes.Code, d time.Duration) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(method, code.String()).Inc()
	m.duration.WithLabelValues(method).Observe(d.Seconds())
}
