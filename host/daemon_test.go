package host_test

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// daemon is a real wasmcsi server in this process, on its own unix socket,
// records and module folder, serving one or more backend modules.
type daemon struct {
	cfg    *config.Config
	opts   daemonOptions
	srv    *host.Server
	socket string
	conn   *grpc.ClientConn
	// pool is the first module's pool folder; pools has every module's.
	pool  string
	pools map[string]string
	// stop stops the running server; it is safe to call twice.
	stop func()
}

// daemonModule is one backend module the daemon serves.
type daemonModule struct {
	name      string
	wasm      string
	hostcalls []string
	config    map[string]string
	// roots beside the module's pool folder, which is always its first root.
	extraRoots []string
	// limits, when set, override the daemon-wide limits for this module.
	limits *config.Limits
}

type daemonOptions struct {
	// The first module, which is also the default backend.
	backend   string
	wasm      string
	hostcalls []string
	config    map[string]string
	// roots beside the pool folder, which is always the first root.
	extraRoots []string
	role       string
	// nodeID, when set, is the daemon's node_id instead of "test-node".
	nodeID string
	// pool, when set, is the first module's pool folder instead of a new
	// one (a node daemon serving the volumes of a controller daemon).
	pool string
	// more modules served beside the first.
	more []daemonModule
	// limits replace the non-zero fields of the daemon-wide limits.
	limits config.Limits
	// freezeTimeout, when set, bounds how long a group snapshot pauses writes.
	freezeTimeout time.Duration
	// memoryBudgetPages, when set, replaces the daemon's guest memory budget.
	memoryBudgetPages uint32
	// pathRoots, when set, is node.path_roots.
	pathRoots []string
	// hostCalls are offered to modules beside the daemon's own (fakes a
	// test controls; their family must be granted like any other).
	hostCalls []hostcalls.Func
}

func (o daemonOptions) modules() []daemonModule {
	first := daemonModule{name: o.backend, wasm: o.wasm, hostcalls: o.hostcalls, config: o.config, extraRoots: o.extraRoots}
	return append([]daemonModule{first}, o.more...)
}

// testConfig is the default configuration of a test daemon in a temporary
// folder of its own (returned, removed when the test ends): its socket,
// state and modules there, node test-node.
func testConfig(t testing.TB) (*config.Config, string) {
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
	return cfg, dir
}

// startDaemon starts a daemon in a temporary folder; it stops and its
// folder goes away when the test ends.
func startDaemon(t testing.TB, o daemonOptions) *daemon {
	t.Helper()
	cfg, dir := testConfig(t)
	if o.nodeID != "" {
		cfg.NodeID = o.nodeID
	}
	cfg.DefaultBackend = o.backend
	cfg.WatchModules = false
	if o.role != "" {
		cfg.Role = o.role
	}
	if o.limits.CallTimeout > 0 {
		cfg.Limits.CallTimeout = o.limits.CallTimeout
	}
	if o.limits.MemoryPages > 0 {
		cfg.Limits.MemoryPages = o.limits.MemoryPages
	}
	if o.limits.PoolSize > 0 {
		cfg.Limits.PoolSize = o.limits.PoolSize
	}
	if o.limits.AcquireTimeout > 0 {
		cfg.Limits.AcquireTimeout = o.limits.AcquireTimeout
	}
	if o.freezeTimeout > 0 {
		cfg.GroupSnapshot.FreezeTimeout = o.freezeTimeout
	}
	if o.memoryBudgetPages > 0 {
		cfg.MemoryBudgetPages = o.memoryBudgetPages
	}
	cfg.Node.PathRoots = o.pathRoots
	if err := os.MkdirAll(cfg.ModuleDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cfg: cfg, opts: o, pools: map[string]string{}}
	cfg.Modules = map[string]config.Module{}
	for i, m := range o.modules() {
		pool := filepath.Join(dir, "pools", m.name)
		if i == 0 {
			pool = filepath.Join(dir, "pool")
			if o.pool != "" {
				pool = o.pool
			}
			d.pool = pool
		}
		if err := os.MkdirAll(pool, 0o755); err != nil {
			t.Fatal(err)
		}
		d.pools[m.name] = pool
		cfg.Modules[m.name] = config.Module{
			HostCalls: m.hostcalls,
			Roots:     append([]string{pool}, m.extraRoots...),
			Config:    m.config,
			Limits:    m.limits,
		}
		data, err := os.ReadFile(m.wasm)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfg.ModuleDir, m.name+".wasm"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d.start(t)
	t.Cleanup(func() { d.stop() })
	return d
}

// start runs a new server on the daemon's configuration, records and
// socket, and connects a client to it.
func (d *daemon) start(t testing.TB) {
	t.Helper()
	cfg := d.cfg
	calls, err := host.DefaultHostCalls(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range d.opts.hostCalls {
		calls[f.Name] = f
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := host.New(ctx, cfg, host.Options{Log: log, HostCalls: calls})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	want := slices.Sorted(maps.Keys(cfg.Modules))
	if got := srv.Backends(); !slices.Equal(got, want) {
		cancel()
		srv.Close(context.Background())
		t.Fatalf("backends %v did not all load (loaded: %v)", want, got)
	}
	if err := os.Remove(cfg.SocketPath()); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", cfg.SocketPath())
	if err != nil {
		cancel()
		srv.Close(context.Background())
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
		cancel()
		<-done
		srv.Close(context.Background())
		t.Fatal(err)
	}
	stopped := false
	d.srv, d.socket, d.conn = srv, cfg.SocketPath(), conn
	d.stop = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("daemon did not stop")
		}
		srv.Close(context.Background())
	}
}

// restart stops the daemon and starts a new one on the same records,
// modules and socket, as after a crash or an upgrade of the daemon.
func (d *daemon) restart(t testing.TB) {
	t.Helper()
	d.stop()
	d.start(t)
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
