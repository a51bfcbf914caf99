// Package modules is the WebAssembly runtime of wasmcsi: it discovers the
// backend modules in the module folder, verifies them (pinned sha256, ABI
// version, export and import signatures, grants), compiles each digest once
// (with an optional on-disk compilation cache), keeps a bounded pool of
// initialized instances per module, runs operations under a deadline, a
// memory cap and a daemon-wide memory budget, bounds what guests log,
// discards any instance after any error, and hot-reloads the folder by
// swapping whole module versions atomically.
//
// It must never give a module anything the operator did not grant: no WASI
// filesystem, network, environment, arguments or real clocks, and no host call
// outside the module's granted families. It must never let a module's trap,
// loop, memory flood or a panicking host call take down the daemon or another
// module, and never reuse an instance after an error. It knows nothing of CSI
// or of the wire messages: the host decodes what crosses the boundary.
package modules

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tetratelabs/wazero"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Defaults for a zero field of Limits.
const (
	DefaultCallTimeout     = 60 * time.Second
	DefaultMemoryPages     = 2048 // 128 MiB
	DefaultPoolSize        = 4
	DefaultAcquireTimeout  = 5 * time.Second
	DefaultIdleMemoryPages = 512 // 32 MiB
)

// MaxModuleSize bounds the size of a module file the runtime reads.
const MaxModuleSize = 64 << 20

// MaxTableEntries bounds the entries of all tables of one instance
// together: 8 MiB of Go heap, which wazero keeps outside the linear memory
// and its limits. A module whose tables declare more at least is refused;
// table.grow past the bound fails (meter.LimitTables). It also bounds a
// module's element segments (segments and entries together) and its
// globals, of which wazero keeps a structure each per instance. Modules
// the SDK builds declare one table of about 6,000 entries, never grow it,
// and have fewer elements and globals.
const MaxTableEntries = 1 << 20

// Limits bound what one module may use. A zero field means the default
// (DefaultCallTimeout, ...), both in Config.Limits and in Config.Overrides.
type Limits struct {
	// CallTimeout is the guest time one operation (and _initialize) may
	// use; time spent in host calls is not counted (see RATIONALE.md).
	CallTimeout time.Duration
	// MemoryPages caps each instance's linear memory, in 64 KiB pages. A
	// module whose declared minimum or maximum exceeds it is refused.
	MemoryPages uint32
	// PoolSize is the most instances of the module alive at once, which is
	// also the most calls it serves concurrently.
	PoolSize int
	// AcquireTimeout is how long a call waits for a free instance before it
	// fails with abi.Unavailable.
	AcquireTimeout time.Duration
	// IdleMemoryPages is the most memory an instance keeps in the pool: one
	// whose memory grew past it (and past its size when new) is closed after
	// its call, so idle instances do not hold what a flood left them.
	IdleMemoryPages uint32
}

// Grant is what the operator allows one module.
type Grant struct {
	// HostCalls are the host-call families the module may import ("loop",
	// "mount", ...).
	HostCalls []string
	// Roots are handed to its host calls as hostcalls.Env.Roots, as given.
	Roots []string
	// Config is the module's own configuration; the runtime only carries it
	// (the host's OnLoad hook passes it to the configure operation).
	Config map[string]string
}

// Config configures a Runtime.
type Config struct {
	// Dir is the module folder: every "<name>.wasm" in it is a module named
	// <name>. Names are lower-case letters, digits, '-' and '_' (at most 63);
	// hidden files are ignored.
	Dir string
	// CacheDir holds wazero's compilation cache; "" keeps compiled code only
	// in memory.
	CacheDir string
	// Pins maps a module name to the lower-case sha256 hex digest its file
	// must have; a mismatch refuses the module.
	Pins map[string]string
	// Disabled names modules whose files are left unloaded.
	Disabled map[string]bool
	// MemoryBudget is the linear memory, in bytes, all instances of all
	// modules may hold together (0: DefaultMemoryBudget); one module's
	// instances may hold at most half of it. A grow past it fails, and the
	// call that needed it answers abi.ResourceExhausted.
	MemoryBudget int64
	// Limits are the defaults for every module; Overrides replace them per
	// module name, field by field (zero fields keep the default).
	Limits    Limits
	Overrides map[string]Limits
	// Grants are by module name. A module without a grant may use only the
	// core imports and WASI.
	Grants map[string]Grant
	// HostCalls is every host call the daemon offers, by import name.
	HostCalls map[string]hostcalls.Func
	// External, when set, is asked at every Load and Reload for modules
	// that live outside the folder: module name to the absolute path of its
	// current file (the OCI puller's verified cache). Such a module is
	// checked, loaded and swapped like a folder file; a folder file of the
	// same name is ignored.
	External func() map[string]string
	// ExternalOnly names the modules that come only from External (the
	// config gives them a registry source): a folder file of such a name
	// never loads, also while External has no verified file for it yet.
	ExternalOnly map[string]bool
	// PreferTinyGo serves "<name>.tinygo.wasm" rather than "<name>.wasm"
	// when the folder holds both.
	PreferTinyGo bool
	// OnLoad runs once per loaded module version, after its first instance
	// is initialized and before it serves: the host decodes backend_info and
	// runs configure here. An error refuses the module.
	OnLoad func(ctx context.Context, m *Module) error
	// Log receives the runtime's and the guests' log lines; nil discards.
	Log *slog.Logger
	// Metrics, when set, receives the runtime's collectors.
	Metrics prometheus.Registerer
}

// Runtime owns every loaded module. Its methods are safe for concurrent use;
// Load, Reload and Close are serialized.
type Runtime struct {
	cfg     Config
	log     *slog.Logger
	cache   wazero.CompilationCache
	metrics *metrics
	mem     memoryBudget // every instance's linear memory

	mu     sync.Mutex // serializes Load, Reload and Close
	closed bool
	set    atomic.Pointer[moduleSet]

	drainMu  sync.Mutex
	draining map[*Module]struct{}

	// unavailable names the modules refused for a host-call family this
	// host lacks and already warned about (under mu).
	unavailable map[string]bool
}

// moduleSet is one immutable generation of loaded modules.
type moduleSet struct {
	byName map[string]*Module
	sorted []*Module
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// New checks cfg and returns a Runtime with no modules loaded; call Load.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Dir == "" {
		return nil, errors.New("modules: Dir is empty")
	}
	if st, err := os.Stat(cfg.Dir); err != nil {
		return nil, fmt.Errorf("modules: module folder: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("modules: module folder %s is not a directory", cfg.Dir)
	}
	if cfg.MemoryBudget < 0 {
		return nil, errors.New("modules: MemoryBudget is negative")
	}
	if err := checkLimits("Limits", cfg.Limits); err != nil {
		return nil, err
	}
	for name, l := range cfg.Overrides {
		if err := checkLimits(fmt.Sprintf("Overrides[%q]", name), l); err != nil {
			return nil, err
		}
	}
	for name, pin := range cfg.Pins {
		if b, err := hex.DecodeString(pin); err != nil || len(b) != sha256.Size || pin != strings.ToLower(pin) {
			return nil, fmt.Errorf("modules: pin of %q is not a lower-case sha256 hex digest", name)
		}
	}
	for name, g := range cfg.Grants {
		for _, fam := range g.HostCalls {
			if fam == "" {
				return nil, fmt.Errorf("modules: grant of %q has an empty host-call family", name)
			}
		}
	}
	for name, f := range cfg.HostCalls {
		switch {
		case f.Call == nil:
			return nil, fmt.Errorf("modules: host call %q has no Call", name)
		case f.Family == "":
			return nil, fmt.Errorf("modules: host call %q has no Family", name)
		case f.Name != "" && f.Name != name:
			return nil, fmt.Errorf("modules: host call registered as %q is named %q", name, f.Name)
		case isCoreImport(name):
			return nil, fmt.Errorf("modules: host call %q shadows a core import", name)
		}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runtime{cfg: cfg, log: log, draining: map[*Module]struct{}{}, unavailable: map[string]bool{}}
	r.mem.limit = cfg.MemoryBudget
	if r.mem.limit == 0 {
		r.mem.limit = DefaultMemoryBudget
	}
	if cfg.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(cfg.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("modules: compilation cache %s: %w", cfg.CacheDir, err)
		}
		r.cache = c
	} else {
		r.cache = wazero.NewCompilationCache()
	}
	if cfg.Metrics != nil {
		m, err := newMetrics(cfg.Metrics)
		if err != nil {
			_ = r.cache.Close(ctx)
			return nil, err
		}
		r.metrics = m
	}
	r.set.Store(&moduleSet{byName: map[string]*Module{}})
	return r, nil
}

func checkLimits(what string, l Limits) error {
	switch {
	case l.CallTimeout < 0:
		return fmt.Errorf("modules: %s.CallTimeout is negative", what)
	case l.AcquireTimeout < 0:
		return fmt.Errorf("modules: %s.AcquireTimeout is negative", what)
	case l.PoolSize < 0:
		return fmt.Errorf("modules: %s.PoolSize is negative", what)
	case l.MemoryPages > 65536:
		return fmt.Errorf("modules: %s.MemoryPages %d is over 65536", what, l.MemoryPages)
	case l.IdleMemoryPages > 65536:
		return fmt.Errorf("modules: %s.IdleMemoryPages %d is over 65536", what, l.IdleMemoryPages)
	}
	return nil
}

// limitsFor returns the effective limits of module name.
func (r *Runtime) limitsFor(name string) Limits {
	l := r.cfg.Limits
	if o, ok := r.cfg.Overrides[name]; ok {
		if o.CallTimeout != 0 {
			l.CallTimeout = o.CallTimeout
		}
		if o.MemoryPages != 0 {
			l.MemoryPages = o.MemoryPages
		}
		if o.PoolSize != 0 {
			l.PoolSize = o.PoolSize
		}
		if o.AcquireTimeout != 0 {
			l.AcquireTimeout = o.AcquireTimeout
		}
		if o.IdleMemoryPages != 0 {
			l.IdleMemoryPages = o.IdleMemoryPages
		}
	}
	if l.CallTimeout == 0 {
		l.CallTimeout = DefaultCallTimeout
	}
	if l.MemoryPages == 0 {
		l.MemoryPages = DefaultMemoryPages
	}
	if l.PoolSize == 0 {
		l.PoolSize = DefaultPoolSize
	}
	if l.AcquireTimeout == 0 {
		l.AcquireTimeout = DefaultAcquireTimeout
	}
	if l.IdleMemoryPages == 0 {
		l.IdleMemoryPages = DefaultIdleMemoryPages
	}
	return l
}

// Load discovers and loads every module in the folder. A module that fails
// any check is refused with an error (keyed by module name, or by file name
// when the name itself is invalid) that names the problem; the others load.
// A failure to read the folder itself is reported under the key "".
func (r *Runtime) Load(ctx context.Context) map[string]error {
	return r.sync(ctx)
}

// Reload brings the loaded set in line with the folder: a file whose digest
// changed is compiled, checked, warmed (first instance and OnLoad) and then
// swapped in atomically with every other change; a removed file unloads.
// Replaced and removed versions drain: calls already running on them finish,
// later calls on a stale *Module go to its successor. A changed file that
// fails its checks is refused and the previous version keeps serving.
func (r *Runtime) Reload(ctx context.Context) map[string]error {
	return r.sync(ctx)
}

func (r *Runtime) sync(ctx context.Context) map[string]error {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := map[string]error{}
	if r.closed {
		errs[""] = errors.New("modules: runtime is closed")
		return errs
	}
	entries, err := os.ReadDir(r.cfg.Dir)
	if err != nil {
		errs[""] = fmt.Errorf("modules: read module folder: %w", err)
		return errs
	}
	cur := r.set.Load().byName
	next := map[string]*Module{}
	seen := map[string]bool{}
	files, ferrs := r.moduleFiles(entries)
	for k, v := range ferrs {
		errs[k] = v
	}
	for name := range r.cfg.ExternalOnly {
		delete(files, name) // an unsigned file must not stand in for it
		delete(errs, name)
	}
	if r.cfg.External != nil {
		for name, path := range r.cfg.External() {
			switch {
			case !nameRE.MatchString(name):
				errs[name] = fmt.Errorf("module %q: name must match %s", name, nameRE)
			case !filepath.IsAbs(path):
				errs[name] = fmt.Errorf("module %q: external file %q is not an absolute path", name, path)
			case r.cfg.Disabled[name]:
			default:
				files[name] = path
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		file := files[name]
		seen[name] = true
		old := cur[name]
		keepOld := func(err error) {
			errs[name] = err
			if old != nil {
				next[name] = old
				r.log.Warn("module refused; previous version keeps serving",
					"module", name, "digest", old.digest, "err", err)
			} else if ue := (*UnavailableError)(nil); errors.As(err, &ue) {
				// Expected on such a machine, and the same at every reload:
				// one warning per module, naming what is missing.
				if !r.unavailable[name] {
					r.log.Warn("module not loaded: this host lacks what it needs", "module", name, "err", err)
				}
				r.unavailable[name] = true
			} else {
				r.log.Error("module refused", "module", name, "err", err)
			}
		}
		path := file
		if !filepath.IsAbs(path) {
			path = filepath.Join(r.cfg.Dir, file)
		}
		data, digest, err := readModule(path)
		if err != nil {
			keepOld(fmt.Errorf("module %q: %w", name, err))
			continue
		}
		if pin, ok := r.cfg.Pins[name]; ok && pin != digest {
			keepOld(fmt.Errorf("module %q: sha256 %s does not match pin %s", name, digest, pin))
			continue
		}
		if old != nil && old.digest == digest {
			next[name] = old
			continue
		}
		m, err := r.load(ctx, name, file, data, digest)
		if err != nil {
			keepOld(err)
			continue
		}
		next[name] = m
		delete(r.unavailable, name)
	}
	for name := range r.cfg.Pins {
		if !seen[name] {
			errs[name] = fmt.Errorf("module %q: pinned but %s.wasm is not in the module folder", name, name)
		}
	}
	r.swap(next)
	for name, old := range cur {
		if next[name] != old {
			r.log.Info("module retired", "module", name, "digest", old.digest)
			r.retire(old)
		}
	}
	return errs
}

// TinyGoSuffix marks a TinyGo build of a module: "<name>.tinygo.wasm" is
// module <name>, served instead of "<name>.wasm" when Config.PreferTinyGo is
// set, and in any case when it is the only build present.
const TinyGoSuffix = ".tinygo.wasm"

// moduleFiles picks one file per module name from the folder's entries.
func (r *Runtime) moduleFiles(entries []os.DirEntry) (map[string]string, map[string]error) {
	files, errs := map[string]string{}, map[string]error{}
	for _, e := range entries {
		file := e.Name()
		if strings.HasPrefix(file, ".") || !strings.HasSuffix(file, ".wasm") {
			continue
		}
		name, tiny := strings.TrimSuffix(file, TinyGoSuffix), strings.HasSuffix(file, TinyGoSuffix)
		if !tiny {
			name = strings.TrimSuffix(file, ".wasm")
		}
		if !nameRE.MatchString(name) {
			errs[file] = fmt.Errorf("module file %q: name must match %s", file, nameRE)
			continue
		}
		if r.cfg.Disabled[name] {
			continue
		}
		if prev, ok := files[name]; ok && strings.HasSuffix(prev, TinyGoSuffix) == r.cfg.PreferTinyGo {
			continue // the preferred build is already chosen
		}
		files[name] = file
	}
	return files, errs
}

// swap publishes next as the loaded set.
func (r *Runtime) swap(next map[string]*Module) {
	s := &moduleSet{byName: next, sorted: make([]*Module, 0, len(next))}
	for _, m := range next {
		s.sorted = append(s.sorted, m)
	}
	sort.Slice(s.sorted, func(i, j int) bool { return s.sorted[i].name < s.sorted[j].name })
	r.set.Store(s)
}

// retire stops m from taking new instances; its wazero runtime closes when
// its last in-flight call ends.
func (r *Runtime) retire(m *Module) {
	r.drainMu.Lock()
	r.draining[m] = struct{}{}
	r.drainMu.Unlock()
	m.pool.retire()
}

func readModule(path string) ([]byte, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, "", fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, "", fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > MaxModuleSize {
		return nil, "", fmt.Errorf("%s is %d bytes, over the %d byte limit", path, st.Size(), MaxModuleSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxModuleSize+1))
	if err != nil {
		return nil, "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxModuleSize {
		return nil, "", fmt.Errorf("%s grew over the %d byte limit while read", path, MaxModuleSize)
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:]), nil
}

// Module returns the loaded module called name.
func (r *Runtime) Module(name string) (*Module, bool) {
	m, ok := r.set.Load().byName[name]
	return m, ok
}

// Modules returns the loaded modules sorted by name.
func (r *Runtime) Modules() []*Module {
	return append([]*Module(nil), r.set.Load().sorted...)
}

// Close unloads every module. It waits until running calls finish or ctx
// ends; then it closes what is left, which fails those calls.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	cur := r.set.Load().sorted
	r.swap(map[string]*Module{})
	for _, m := range cur {
		r.retire(m)
	}
	r.drainMu.Lock()
	pending := make([]*Module, 0, len(r.draining))
	for m := range r.draining {
		pending = append(pending, m)
	}
	r.drainMu.Unlock()
	var errs []error
	for _, m := range pending {
		select {
		case <-m.pool.drained:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("module %q: calls still running at close: %w", m.name, ctx.Err()))
			m.closeRuntime()
		}
	}
	if err := r.cache.Close(context.Background()); err != nil {
		errs = append(errs, fmt.Errorf("modules: close compilation cache: %w", err))
	}
	if r.metrics != nil {
		r.metrics.unregister(r.cfg.Metrics)
	}
	return errors.Join(errs...)
}

// drained is called by a retired module once its last instance is gone.
func (r *Runtime) drained(m *Module) {
	m.closeRuntime()
	r.drainMu.Lock()
	delete(r.draining, m)
	r.drainMu.Unlock()
}
