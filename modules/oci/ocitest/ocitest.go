// Package ocitest starts a real OCI registry (cmd/testregistry, the CNCF
// distribution project's server, built from its own module) on 127.0.0.1
// for tests. It is for tests only.
package ocitest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// registryBinary builds cmd/testregistry once per test binary.
func registryBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, self, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(self), "..", "..", "..", "cmd", "testregistry")
		dir, err := os.MkdirTemp("", "wasmcsi-testregistry-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "testregistry")
		cmd := exec.Command("go", "build", "-o", binary, ".")
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build cmd/testregistry: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// Registry is a registry process on 127.0.0.1 storing in a folder of the
// test; Stop and Start keep its address and content.
type Registry struct {
	// Addr is host:port.
	Addr string
	t    testing.TB
	dir  string
	cmd  *exec.Cmd
	log  syncBuffer
}

// Start starts a registry; it stops when the test ends, and shows its log
// when the test failed.
func Start(t testing.TB) *Registry {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Registry{Addr: l.Addr().String(), t: t, dir: t.TempDir()}
	l.Close()
	r.Start()
	t.Cleanup(func() {
		r.Stop()
		if t.Failed() {
			t.Logf("registry log:\n%s", r.log.String())
		}
	})
	return r
}

// Start starts a stopped registry again.
func (r *Registry) Start() {
	r.t.Helper()
	cmd := exec.Command(registryBinary(r.t), "-addr", r.Addr, "-dir", r.dir)
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
		if ok {
			r.cmd = cmd
			return
		}
	case <-time.After(30 * time.Second):
	}
	cmd.Process.Kill()
	cmd.Wait()
	r.t.Fatalf("test registry did not start:\n%s", r.log.String())
}

// Stop stops the registry; its address then refuses connections.
func (r *Registry) Stop() {
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

// Ref is oci://ADDR/repoTag.
func (r *Registry) Ref(repoTag string) string { return "oci://" + r.Addr + "/" + repoTag }

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
