package oci

//go:generate wat2wasm testdata/v1.wat -o testdata/v1.wasm
//go:generate wat2wasm testdata/v2.wat -o testdata/v2.wasm
//go:generate wat2wasm testdata/v3file.wat -o testdata/v3file.wasm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/wasmcsi/wasmcsi/modules/wattest"
)

// TestFixturesMatchWat rebuilds every testdata/*.wat with wat2wasm and
// checks that the committed .wasm is what it produces.
func TestFixturesMatchWat(t *testing.T) {
	wattest.CheckFixtures(t, "registry_test.go", "./modules/oci")
}

var (
	registryOnce sync.Once
	registryBin  string
	registryErr  error
)

// registryBinary builds cmd/testregistry (the distribution project's
// registry, a module of its own) once per test binary.
func registryBinary(t *testing.T) string {
	t.Helper()
	registryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wasmcsi-testregistry-")
		if err != nil {
			registryErr = err
			return
		}
		registryBin = filepath.Join(dir, "testregistry")
		cmd := exec.Command("go", "build", "-o", registryBin, ".")
		cmd.Dir = filepath.Join("..", "..", "cmd", "testregistry")
		if out, err := cmd.CombinedOutput(); err != nil {
			registryErr = fmt.Errorf("build cmd/testregistry: %v\n%s", err, out)
		}
	})
	if registryErr != nil {
		t.Fatal(registryErr)
	}
	return registryBin
}

// registry is a real registry process on 127.0.0.1 storing in dir; it can
// be stopped and started again on the same address with the same content.
type testRegistry struct {
	t    *testing.T
	addr string
	dir  string
	cmd  *exec.Cmd
	log  logBuffer // the registry's own log, shown when a test fails
}

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := &testRegistry{t: t, addr: addr, dir: t.TempDir()}
	r.start()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("registry log:\n%s", r.log.String())
		}
	})
	return r
}

func (r *testRegistry) start() {
	r.t.Helper()
	cmd := exec.Command(registryBinary(r.t), "-addr", r.addr, "-dir", r.dir)
	cmd.Stderr = &r.log
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
	}()
	select {
	case ok := <-ready:
		if !ok {
			cmd.Process.Kill()
			cmd.Wait()
			r.t.Fatal("test registry did not start")
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		r.t.Fatal("test registry not ready after 30s")
	}
	r.cmd = cmd
}

func (r *testRegistry) stop() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill()
		<-done
	}
	r.cmd = nil
}

// ref is oci://ADDR/REPO:TAG in this registry.
func (r *testRegistry) ref(repoTag string) string { return Scheme + r.addr + "/" + repoTag }

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
	p, err := New(Options{Dir: cache, Sources: srcs, PlainHTTP: []string{r.addr}, Timeout: 10 * time.Second,
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
