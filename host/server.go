// Package host serves the Container Storage Interface. It owns the spec's
// rules (required fields, error codes, idempotency, one operation per volume
// at a time), the durable records of volumes and snapshots, the generic node
// steps every block or directory backend shares, and the routing of each
// request to the backend module that owns the volume.
//
// host never runs storage policy itself: placement, parameters and the order
// of privileged steps belong to the modules. It never holds a global lock
// across a call into a module or the kernel.
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/host/keylock"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/hostcalls/node"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/oci"
)

// Version is the daemon's version, set at build time with
// -ldflags "-X github.com/wasmcsi/wasmcsi/host.Version=v1.2.3".
var Version = "dev"

// Server implements every CSI service.
type Server struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	csi.UnimplementedGroupControllerServer
	csi.UnimplementedSnapshotMetadataServer

	cfg      *config.Config
	log      *slog.Logger
	store    *state.Store
	journals *quiesce.Journals
	// snapJournals are the journals of snapshots of their own cut with
	// their source's writes paused (snapshots.go), keyed by snapshot name.
	snapJournals *quiesce.Journals
	rt           *modules.Runtime
	oci          *oci.Puller // nil when no module comes from a registry
	locks        *keylock.Locks
	infos        infoCache
	backends     atomic.Pointer[backendSet]
	// tag is this node's tag in the IDs it makes (owner.go).
	tag     nodeTag
	node    *node.Node
	metrics *metrics
	ready   atomic.Bool
	// settle completes controller operations once their pool changes
	// are durable (settle.go).
	settle *settler
	// unfinishedCopies are the logged clones and restores start-up could
	// not finish, by their source (volKey, snapKey): the source's
	// deletion waits while one stays logged (replay.go). Written before
	// the daemon serves, read-only after.
	unfinishedCopies map[string][]state.Intent
}

// Options are what New needs besides the configuration.
type Options struct {
	Log *slog.Logger
	// HostCalls offered to modules; nil means DefaultHostCalls().
	HostCalls map[string]hostcalls.Func
	// Metrics registers the daemon's metrics when set.
	Metrics MetricsRegisterer
	// NoRecords loads the modules without opening the records, for tools
	// that only describe them next to a running daemon (which holds the
	// records' lock). Such a server cannot serve CSI.
	NoRecords bool
}

// New opens the records, starts the module runtime and loads every module.
// A module that fails to load is logged and left out; the daemon serves the
// others.
func New(ctx context.Context, cfg *config.Config, opt Options) (*Server, error) {
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	var store *state.Store
	if !opt.NoRecords {
		var err error
		if store, err = state.Open(filepath.Join(cfg.StateDir, "wasmcsi.db")); err != nil {
			return nil, fmt.Errorf("open records: %w", err)
		}
	}
	s, err := newServer(ctx, cfg, opt, log, store)
	if err != nil && store != nil {
		store.Close()
	}
	return s, err
}

// recoverJournals opens the pause journals in dir and resumes the writes
// an attempt of what (a snapshot kind) the daemon died in left paused.
func recoverJournals(ctx context.Context, log *slog.Logger, dir, what string) (*quiesce.Journals, error) {
	j, err := quiesce.OpenJournals(dir, log)
	if err != nil {
		return nil, err
	}
	if n, err := j.Recover(ctx); err != nil {
		log.Error("resume writes paused by an interrupted "+what, "err", err, "resumed", n)
	}
	return j, nil
}

func newServer(ctx context.Context, cfg *config.Config, opt Options, log *slog.Logger, store *state.Store) (*Server, error) {
	s := &Server{cfg: cfg, log: log, store: store, locks: keylock.New(), tag: newNodeTag(cfg.NodeID), settle: newSettler(log)}
	s.metrics = newMetrics(opt.Metrics, s.pools)
	s.node = node.New(log, catalog.DeviceOwners())
	s.node.SetResizeDir(filepath.Join(cfg.StateDir, "resizing"))
	if store != nil {
		// Before anything else: writers hang on what a group snapshot the
		// daemon died in left paused (and its guardian did not resume).
		var err error
		if s.journals, err = recoverJournals(ctx, log, filepath.Join(cfg.StateDir, "quiesce"), "group snapshot"); err != nil {
			return nil, err
		}
		if s.snapJournals, err = recoverJournals(ctx, log, filepath.Join(cfg.StateDir, "quiesce-snapshots"), "snapshot"); err != nil {
			return nil, err
		}
	}

	calls := opt.HostCalls
	if calls == nil {
		var err error
		if calls, err = DefaultHostCalls(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("host calls: %w", err)
		}
	}
	grants, disabled := map[string]modules.Grant{}, map[string]bool{}
	for name, m := range cfg.Modules {
		if m.Disabled {
			disabled[name] = true
			log.Info("module disabled by configuration: not loaded", "module", name)
			continue
		}
		grants[name] = modules.Grant{HostCalls: m.HostCalls, Roots: m.Roots, Config: m.Config}
		if err := createPools(m); err != nil {
			return nil, fmt.Errorf("module %s: %w", name, err)
		}
	}
	pins, overrides := map[string]string{}, map[string]modules.Limits{}
	for name, m := range cfg.Modules {
		if m.SHA256 != "" && !m.Disabled {
			pins[name] = m.SHA256
		}
		if m.Limits != nil {
			overrides[name] = runtimeLimits(*m.Limits)
		}
	}
	if cfg.CacheDir != "" {
		if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
			return nil, fmt.Errorf("cache dir: %w", err)
		}
	}
	puller, err := newPuller(cfg, opt, log)
	if err != nil {
		return nil, fmt.Errorf("oci modules: %w", err)
	}
	s.oci = puller
	var external func() map[string]string
	if puller != nil {
		external = puller.Files
	}
	externalOnly := map[string]bool{}
	for name, m := range cfg.Modules {
		if m.Source != "" {
			externalOnly[name] = true
		}
	}
	rt, err := modules.New(ctx, modules.Config{
		Dir:          cfg.ModuleDir,
		External:     external,
		ExternalOnly: externalOnly,
		CacheDir:     cfg.CacheDir,
		PreferTinyGo: cfg.PreferTinyGo,
		Pins:         pins,
		Disabled:     disabled,
		MemoryBudget: int64(cfg.MemoryBudgetPages) << 16,
		Limits:       runtimeLimits(cfg.Limits),
		Overrides:    overrides,
		Grants:       grants,
		HostCalls:    calls,
		OnLoad:       s.onLoad,
		Log:          log,
		Metrics:      opt.Metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("module runtime: %w", err)
	}
	s.rt = rt
	s.Reload(ctx)
	if s.journals != nil && cfg.Role != config.RoleNode {
		s.undoInterruptedGroups(ctx)
		s.undoInterruptedSnapshots(ctx)
		s.finishInterrupted(ctx)
		for _, f := range s.sweepOwned(ctx) {
			s.log.Warn("reconcile", "kind", f.Kind, "path", f.Path, "detail", f.Detail, "cleaned", cfg.Reconcile.Clean)
		}
	}
	return s, nil
}

// Reload resolves the OCI modules' references again and rescans the
// module folder: new and changed modules are compiled, checked and swapped
// in; removed ones stop serving. Volumes of a module that is gone answer
// FAILED_PRECONDITION until it returns.
func (s *Server) Reload(ctx context.Context) {
	if s.oci != nil {
		s.oci.Sync(ctx, true)
	}
	s.reloadModules(ctx)
}

func (s *Server) reloadModules(ctx context.Context) {
	refused := s.rt.Reload(ctx) // the runtime logs each refused module with its reason
	if s.oci != nil {
		// A registry version the runtime refused goes back to the one
		// before it, on disk too; one not loaded at all loads it now.
		again := false
		for name, err := range refused {
			if _, loaded := s.rt.Module(name); s.oci.Revert(name, err) && !loaded {
				again = true
			}
		}
		if again {
			refused = s.rt.Reload(ctx)
		}
	}
	s.refreshBackends()
	names := s.backends.Load().names
	s.metrics.loaded(refused, names)
	s.log.Info("backends loaded", "backends", names)
	if w := s.checkPublishAgreement(s.backends.Load()); w != "" {
		s.log.Warn(w)
	}
	s.ready.Store(len(names) > 0)
}

// pools lists the loaded backends' pool folders: each one's first root
// when it is a path.
func (s *Server) pools() []pool {
	var ps []pool
	set := s.backends.Load()
	if set == nil {
		return nil
	}
	for _, name := range set.names {
		if m, ok := s.cfg.Modules[name]; ok && len(m.Roots) > 0 && filepath.IsAbs(m.Roots[0]) {
			ps = append(ps, pool{backend: name, dir: m.Roots[0]})
		}
	}
	return ps
}

// Backends returns the names of the loaded backends.
func (s *Server) Backends() []string { return append([]string(nil), s.backends.Load().names...) }

// Close stops the runtime and closes the records.
func (s *Server) Close(ctx context.Context) error {
	s.settle.close()
	err := s.rt.Close(ctx)
	if s.store != nil {
		err = errors.Join(err, s.store.Close())
	}
	return err
}

// Serve serves CSI on the configured unix socket until ctx ends, then stops
// gracefully. A stale socket file from an earlier run is replaced.
func (s *Server) Serve(ctx context.Context) error {
	path := s.cfg.SocketPath()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := listenPrivate(path, s.cfg.SocketGroup)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	return s.ServeListener(ctx, lis)
}

// listenPrivate listens on a unix socket at path whose mode does not come
// from the umask: 0600, or 0660 owned by group when one is named (a group
// name or number). The socket is bound in a fresh folder only the owner
// can enter, given its mode and group there, and then renamed into place,
// so it is never reachable with a wider mode. (The umask is the process's
// and cannot be changed for one goroutine.)
func listenPrivate(path, group string) (net.Listener, error) {
	gid := -1
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			if g, err = user.LookupGroupId(group); err != nil {
				return nil, fmt.Errorf("socket_group %q: %w", group, err)
			}
		}
		if gid, err = strconv.Atoi(g.Gid); err != nil {
			return nil, fmt.Errorf("socket_group %q: %w", group, err)
		}
	}
	// The socket's mode comes from the umask at bind time: bind under one
	// that leaves it 0600 (0660 with a group) from the moment it appears.
	// (Binding in a private folder and renaming would lengthen the path,
	// which under Nomad's plugin folder already nears the 107 bytes a
	// socket address holds.) The umask is the process's for the bind's
	// few microseconds: a file created meanwhile is at most stricter.
	mask := 0o177
	if gid >= 0 {
		mask = 0o117
	}
	old := unix.Umask(mask)
	lis, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// Serve removes path itself when it stops.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			lis.Close()
			os.Remove(path)
			return nil, fmt.Errorf("socket group: %w", err)
		}
	}
	return lis, nil
}

// ServeListener serves CSI on lis until ctx ends.
func (s *Server) ServeListener(ctx context.Context, lis net.Listener) error {
	// Requests run on a fixed set of worker goroutines: their stacks stay
	// grown, where a fresh goroutine per request regrew its stack on the
	// deep path through wazero into host calls (~7% of CPU).
	g := grpc.NewServer(
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
		grpc.NumStreamWorkers(uint32(4*runtime.GOMAXPROCS(0))),
	)
	s.Register(g)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case <-ctx.Done():
		done := make(chan struct{})
		go func() { g.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			g.Stop()
		}
		return nil
	case err := <-errc:
		return err
	}
}

// Register registers the services this process's role serves on g.
func (s *Server) Register(g *grpc.Server) {
	csi.RegisterIdentityServer(g, s)
	if s.cfg.Role != config.RoleNode {
		csi.RegisterControllerServer(g, s)
		csi.RegisterGroupControllerServer(g, s)
		csi.RegisterSnapshotMetadataServer(g, s)
	}
	if s.cfg.Role != config.RoleController {
		csi.RegisterNodeServer(g, s)
	}
}

// createPools creates the missing pool folders of a module granted the dir
// or file family (its path roots are folders it keeps volumes in).
func createPools(m config.Module) error {
	if !slices.Contains(m.HostCalls, "dir") && !slices.Contains(m.HostCalls, "file") {
		return nil
	}
	for _, r := range m.Roots {
		if filepath.IsAbs(r) && !strings.HasPrefix(r, "/dev/") {
			if err := os.MkdirAll(r, 0o750); err != nil {
				return fmt.Errorf("create pool %s: %w", r, err)
			}
		}
	}
	return nil
}

func runtimeLimits(l config.Limits) modules.Limits {
	return modules.Limits{CallTimeout: l.CallTimeout, MemoryPages: l.MemoryPages, PoolSize: l.PoolSize, AcquireTimeout: l.AcquireTimeout, IdleMemoryPages: l.IdleMemoryPages}
}
