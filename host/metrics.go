package host

import (
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// MetricsRegisterer is where the daemon registers its metrics.
type MetricsRegisterer = prometheus.Registerer

// metrics counts CSI calls by method and code and times them, says which
// module files were refused, and reports each backend's capacity.
type metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	refused  *prometheus.GaugeVec // module
	capacity *prometheus.GaugeVec // backend

	mu      sync.Mutex
	modules map[string]bool // names with a refused series
}

// pool is a loaded backend's pool folder (its first root).
type pool struct{ backend, dir string }

func newMetrics(reg MetricsRegisterer, pools func() []pool) *metrics {
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
		refused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "wasmcsi", Subsystem: "module", Name: "refused",
			Help: "1 while the module's file in the module folder is refused (a previous version may still serve), 0 once it loads.",
		}, []string{"module"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "wasmcsi", Subsystem: "pool", Name: "available_capacity_bytes",
			Help: "The backend's last GetCapacity answer (what the scheduler sees), by backend.",
		}, []string{"backend"}),
		modules: map[string]bool{},
	}
	reg.MustRegister(m.calls, m.duration, m.refused, m.capacity, &poolCollector{pools: pools})
	return m
}

func (m *metrics) observe(method string, code codes.Code, d time.Duration) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(method, code.String()).Inc()
	m.duration.WithLabelValues(method).Observe(d.Seconds())
}

// loaded records a load or reload: the modules refused (by name; "" is the
// folder itself and has no series) and those serving. A module neither
// refused nor loaded (its file is gone) loses its series.
func (m *metrics) loaded(refused map[string]error, serving []string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := map[string]bool{}
	for _, name := range serving {
		now[name] = true
		m.refused.WithLabelValues(name).Set(0)
	}
	for name := range refused {
		if name == "" {
			continue
		}
		now[name] = true
		m.refused.WithLabelValues(name).Set(1)
	}
	for name := range m.modules {
		if !now[name] {
			m.refused.DeleteLabelValues(name)
		}
	}
	m.modules = now
}

func (m *metrics) availableCapacity(backend string, bytes int64) {
	if m == nil {
		return
	}
	m.capacity.WithLabelValues(backend).Set(float64(bytes))
}

var (
	poolSizeDesc = prometheus.NewDesc("wasmcsi_pool_size_bytes",
		"Size of the filesystem holding the backend's pool folder (its first root).", []string{"backend"}, nil)
	poolFreeDesc = prometheus.NewDesc("wasmcsi_pool_free_bytes",
		"Bytes of that filesystem available to the daemon.", []string{"backend"}, nil)
)

// poolCollector reads each pool folder's filesystem at scrape time: one
// statfs per backend, no module call.
type poolCollector struct{ pools func() []pool }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolSizeDesc
	ch <- poolFreeDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.pools() {
		var st unix.Statfs_t
		if !filepath.IsAbs(p.dir) || unix.Statfs(p.dir, &st) != nil {
			continue
		}
		bs := float64(st.Bsize)
		ch <- prometheus.MustNewConstMetric(poolSizeDesc, prometheus.GaugeValue, float64(st.Blocks)*bs, p.backend)
		ch <- prometheus.MustNewConstMetric(poolFreeDesc, prometheus.GaugeValue, float64(st.Bavail)*bs, p.backend)
	}
}
