package host_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
)

// A daemon in a process of its own, which a test can kill with SIGKILL at a
// moment of its choosing, as a crash or the OOM killer would: this test
// binary, re-executed to run TestDaemonProcess on the daemon's
// configuration. After the kill, d.start runs the next daemon in the test's
// own process on the same records, modules and pools.

// daemonProcessEnv names the configuration file of a daemon process.
const daemonProcessEnv = "WASMCSI_TEST_DAEMON_CONFIG"

// TestDaemonProcess is the daemon process's side; it does nothing in a
// normal run. It serves until it is killed and prints "ready" on stdout
// once it listens.
func TestDaemonProcess(t *testing.T) {
	path := os.Getenv(daemonProcessEnv)
	if path == "" {
		t.Skip("the daemon half of tests that kill a daemon process")
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "daemon process:", err)
		os.Exit(2)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		fail(err)
	}
	var cfg config.Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		fail(err)
	}
	calls, err := host.DefaultHostCalls(cfg.StateDir)
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := host.New(ctx, &cfg, host.Options{Log: log, HostCalls: calls})
	if err != nil {
		fail(err)
	}
	if err := os.Remove(cfg.SocketPath()); err != nil && !os.IsNotExist(err) {
		fail(err)
	}
	lis, err := net.Listen("unix", cfg.SocketPath())
	if err != nil {
		fail(err)
	}
	fmt.Println("ready")
	fail(fmt.Errorf("serve ended: %v", srv.ServeListener(ctx, lis)))
}

// startProcess runs the daemon in a process of its own and connects a
// client to it; d.kill ends it with SIGKILL.
func (d *daemon) startProcess(t testing.TB) {
	t.Helper()
	cfgFile := filepath.Join(filepath.Dir(d.cfg.StateDir), "daemon.json")
	data, err := json.Marshal(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDaemonProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), daemonProcessEnv+"="+cfgFile)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	t.Cleanup(func() {
		if t.Failed() && stderr.String() != "" {
			t.Logf("daemon process's log:\n%s", stderr.String())
		}
	})
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := false
		for sc.Scan() {
			if !ok && sc.Text() == "ready" {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	go func() { cmd.Wait(); close(exited) }()
	kill := func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	select {
	case ok := <-ready:
		if !ok {
			kill()
			t.Fatalf("daemon process exited before it was ready:\n%s", stderr.String())
		}
	case <-time.After(2 * time.Minute):
		kill()
		t.Fatalf("daemon process not ready after 2 minutes:\n%s", stderr.String())
	}
	conn, err := grpc.NewClient("unix://"+d.cfg.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		kill()
		t.Fatal(err)
	}
	d.srv, d.socket, d.conn = nil, d.cfg.SocketPath(), conn
	d.stop = func() {
		conn.Close()
		kill()
		d.stop = func() {}
	}
}

// kill ends a daemon started by startProcess with SIGKILL and waits for it
// to be gone.
func (d *daemon) kill() { d.stop() }

// lockedBuffer collects a child's stderr while the test may read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
