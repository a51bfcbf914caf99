package oci

//go:generate wat2wasm testdata/v1.wat -o testdata/v1.wasm
//go:generate wat2wasm testdata/v2.wat -o testdata/v2.wasm
//go:generate wat2wasm testdata/v3file.wat -o testdata/v3file.wasm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/wasmcsi/wasmcsi/modules/oci/ocitest"
	"github.com/wasmcsi/wasmcsi/modules/wattest"
)

// TestFixturesMatchWat rebuilds every testdata/*.wat with wat2wasm and
// checks that the committed .wasm is what it produces.
func TestFixturesMatchWat(t *testing.T) {
	wattest.CheckFixtures(t, "registry_test.go", "./modules/oci")
}

// testRegistry is a real registry of the tests.
type testRegistry struct {
	*ocitest.Registry
}

func startRegistry(t *testing.T) *testRegistry {
	return &testRegistry{ocitest.Start(t)}
}

func (r *testRegistry) stop() { r.Stop() }

func (r *testRegistry) ref(repoTag string) string { return r.Ref(repoTag) }

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newKey(t *testing.T) (*ecdsa.PrivateKey, *ecdsa.PublicKey) {
	t.Helper()
	priv, pub, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := ParsePrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k, p
}

func (r *testRegistry) push(t *testing.T, ref, fixtureName string, key *ecdsa.PrivateKey) string {
	t.Helper()
	d, err := Push(context.Background(), ref, fixture(t, fixtureName), PushOptions{Key: key, PlainHTTP: true,
		Annotations: map[string]string{AnnotationModule: "m", AnnotationHostCalls: ""}})
	if err != nil {
		t.Fatalf("push %s: %v", fixtureName, err)
	}
	return d.String()
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// puller is a Puller of the tests, with its log and metrics.
type puller struct {
	*Puller
	log *logBuffer
	reg *prometheus.Registry
}

func newPuller(t *testing.T, r *testRegistry, cache string, srcs ...Source) *puller {
	t.Helper()
	lb := &logBuffer{}
	reg := prometheus.NewRegistry()
	p, err := New(Options{Dir: cache, Sources: srcs, PlainHTTP: []string{r.Addr}, Timeout: 10 * time.Second,
		Log: slog.New(slog.NewTextHandler(lb, nil)), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &puller{Puller: p, log: lb, reg: reg}
}

func (p *puller) failures(module, reason string) float64 {
	return counter(p.verifyFailures.WithLabelValues(module, reason))
}

func (p *puller) pullFailuresOf(module string) float64 {
	return counter(p.pullFailures.WithLabelValues(module))
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
