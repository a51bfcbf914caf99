package host_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
)

// daemon is a real wasmcsi server in this process, on its own unix socket,
// records and module folder, serving one backend module.
type daemon struct {
	cfg    *config.Config
	srv    *host.Server
	socket string
	conn   *grpc.ClientConn
	pool   string
}

type daemonOptions struct {
	backend   string
	wasm      string
	hostcalls []string
	config    map[string]string
	// roots beside the pool folder, which is always the first root.
	extraRoots []string
	role       string
}

// startDaemon starts a daemon in a temporary folder; it stops and its
// folder goes away when the test ends.
func startDaemon(t testing.TB, o daemonOptions) *daemon {
	t.Helper()
	// Short paths: a unix socket path is limited to 108 bytes.
	dir, err := os.MkdirTemp("", "wcsi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg, err := config.Load(nil, []string{"CSI_ENDPOINT=unix://" + filepath.Join(dir, "csi.sock")})
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.ModuleDir = filepath.Join(dir, "modules")
	cfg.CacheDir = filepath.Join(os.TempDir(), "wasmcsi-test-cache")
	cfg.NodeID = "test-node"
	cfg.DefaultBackend = o.backend
	cfg.WatchModules = false
	if o.role != "" {
		cfg.Role = o.role
	}
	pool := filepath.Join(dir, "pool")
	if err := os.MkdirAll(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Modules = map[string]config.Module{o.backend: {
		HostCalls: o.hostcalls,
		Roots:     append([]string{pool}, o.extraRoots...),
		Config:    o.config,
	}}
	if err := os.MkdirAll(cfg.ModuleDir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(o.wasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.ModuleDir, o.backend+".wasm"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := host.New(ctx, cfg, host.Options{Log: log})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if got := srv.Backends(); len(got) != 1 || got[0] != o.backend {
		cancel()
		srv.Close(context.Background())
		t.Fatalf("backend %s did not load (loaded: %v)", o.backend, got)
	}
	lis, err := net.Listen("unix", cfg.SocketPath())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.ServeListener(ctx, lis); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	conn, err := grpc.NewClient("unix://"+cfg.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{cfg: cfg, srv: srv, socket: cfg.SocketPath(), conn: conn, pool: pool}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("daemon did not stop")
		}
		srv.Close(context.Background())
	})
	return d
}

func (d *daemon) controller() csi.ControllerClient { return csi.NewControllerClient(d.conn) }
func (d *daemon) node() csi.NodeClient             { return csi.NewNodeClient(d.conn) }
func (d *daemon) identity() csi.IdentityClient     { return csi.NewIdentityClient(d.conn) }

// testWriter sends the daemon's log to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: real bind mounts, loop devices and mkfs")
	}
}
