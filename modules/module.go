package modules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/modules/internal/meter"
)

// Module is one loaded version (one digest) of a backend module. It is safe
// for concurrent use. After a reload replaced it, calls on it go to the
// module's current version; after its file was removed, they fail with
// abi.Unavailable.
type Module struct {
	name   string
	file   string // the file it was loaded from, e.g. "localdir.tinygo.wasm"
	digest string
	grant  Grant
	// described are OnLoad's attributes for the "module loaded" line.
	described []any
	limits    Limits
	rt        *Runtime
	log       *slog.Logger
	env       *hostcalls.Env
	ops       map[abi.Op]bool
	hasInit   bool
	// setup is replayed on every new instance (see SetInstanceSetup).
	setup atomic.Pointer[instanceSetup]

	wrt       wazero.Runtime
	compiled  wazero.CompiledModule
	metered   bool // compiled with meter's loop counter, not wazero's exit checks
	pool      *pool
	logs      logBucket    // rate of guest output lines, over all instances
	minPages  uint32       // the memory's declared minimum
	mem       memoryBudget // the share of Runtime.mem its instances may hold
	memGauge  prometheus.Gauge
	om        map[abi.Op]opMetrics
	closeOnce sync.Once
}

// Name is the module's name: its file name without ".wasm".
func (m *Module) Name() string { return m.name }

// Digest is the lower-case sha256 hex digest of the module's file.
func (m *Module) Digest() string { return m.digest }

// File is the name of the file the module was loaded from: "<name>.wasm"
// or "<name>.tinygo.wasm", or the absolute path of an external file
// (Config.External).
func (m *Module) File() string { return m.file }

// Describe adds key-value attributes to the module's "module loaded" log
// line. Only OnLoad may call it. An "ops" key replaces the list of the
// operations the module exports with what the caller says it offers.
func (m *Module) Describe(attrs ...any) { m.described = append(m.described, attrs...) }

// Has reports whether the module exports op.
func (m *Module) Has(op abi.Op) bool { return m.ops[op] }

// Limits are the module's effective limits.
func (m *Module) Limits() Limits { return m.limits }

// Grant returns a copy of what the operator granted the module.
func (m *Module) Grant() Grant {
	return Grant{
		HostCalls: slices.Clone(m.grant.HostCalls),
		Roots:     slices.Clone(m.grant.Roots),
		Config:    maps.Clone(m.grant.Config),
	}
}

// instanceSetup is an operation every new instance runs before it serves.
type instanceSetup struct {
	op  abi.Op
	req []byte
}

// SetInstanceSetup makes every instance created from now on run op with
// the encoded request req right after _initialize, before it serves; an
// instance whose setup fails is discarded. The host replays configure this
// way: what a module keeps from it lives in one instance's memory, and the
// pool creates instances long after load (growth, replacement of a
// discarded one).
func (m *Module) SetInstanceSetup(op abi.Op, req []byte) {
	m.setup.Store(&instanceSetup{op: op, req: slices.Clone(req)})
}

// Call runs op with the encoded request req on a pooled instance and returns
// the encoded response. A module's own non-OK answer is an *abi.Error with
// its code and message, and the instance stays pooled. Every other failure
// is an *abi.Error too: Unimplemented (op not exported), Unavailable (no free
// instance in time, or module unloaded), DeadlineExceeded or Canceled (the
// call's deadline or ctx stopped the guest), Internal (trap, garbage return
// code, host-call panic, guest exit); after those the instance is discarded.
// Call does not keep req; the caller owns the returned bytes.
func (m *Module) Call(ctx context.Context, op abi.Op, req []byte) ([]byte, error) {
	if !m.ops[op] {
		return nil, abi.Errorf(abi.Unimplemented, "module %q does not implement %s", m.name, op)
	}
	start := time.Now()
	inst, cur, err := m.take(ctx, string(op))
	if cur != nil {
		return cur.Call(ctx, op, req)
	}
	if err != nil {
		m.observe(op, start, codeOf(err))
		return nil, err
	}
	resp, err, keep := m.run(ctx, inst, op, req)
	m.pool.release(inst, keep && m.keeps(inst, op))
	m.observe(op, start, codeOf(err))
	return resp, err
}

// take acquires an instance for what (an op, or a reservation). After a
// reload retired this version it returns the current one instead, when
// there is one.
func (m *Module) take(ctx context.Context, what string) (*instance, *Module, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, ctxError(m.name, what, err)
	}
	inst, err := m.pool.acquire(ctx)
	if err != nil {
		if errors.Is(err, errRetired) {
			if cur, ok := m.rt.Module(m.name); ok && cur != m {
				return nil, cur, nil
			}
			err = abi.Errorf(abi.Unavailable, "module %q is not loaded", m.name)
		} else if errors.Is(err, errBusy) {
			err = abi.Errorf(abi.Unavailable, "module %q busy: %v", m.name, err)
		}
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		m.pool.release(inst, true)
		return nil, nil, ctxError(m.name, what, err)
	}
	return inst, nil, nil
}

// run calls op on inst and reports whether inst may be used again.
func (m *Module) run(ctx context.Context, inst *instance, op abi.Op, req []byte) (resp []byte, err error, keep bool) {
	ret, err := inst.invoke(ctx, inst.fns[op], string(op), req)
	keep = err == nil
	if err == nil {
		switch code := abi.Code(ret); {
		case !code.Valid():
			keep = false
			err = abi.Errorf(abi.Internal, "module %q: %s returned garbage code %d", m.name, op, int32(ret))
			m.log.Warn("module returned a garbage code; instance discarded", "op", op, "code", int32(ret))
		case code != abi.OK:
			err = &abi.Error{Code: code, Message: string(inst.resp)}
		default:
			resp = inst.resp
		}
	}
	inst.resp = nil
	if !keep && m.rt.metrics != nil {
		m.rt.metrics.discarded.WithLabelValues(m.name).Inc()
	}
	return resp, err, keep
}

// keeps reports whether inst, after a call that left it usable, goes back
// to the pool: not when its memory grew past what an idle one may keep.
func (m *Module) keeps(inst *instance, op abi.Op) bool {
	if !inst.holdsTooMuch() {
		return true
	}
	m.log.Debug("instance closed after its call: its memory grew past what an idle instance may keep",
		"op", op, "memory_bytes", inst.mem.bytes(), "idle_memory_pages", m.limits.IdleMemoryPages)
	return false
}

// Reservation is an instance taken from a module's pool ahead of calls
// that must not wait for one once they begin: a snapshot's cut, while the
// volume's writes are paused. Its calls are Module.Call's on that
// instance, one at a time, on the version it was taken from, as calls in
// flight during a reload are. A call that discards the instance, or a call
// after Release, takes one from the pool as Module.Call does.
type Reservation struct {
	m    *Module
	mu   sync.Mutex
	inst *instance
	done bool
}

// Reserve takes an instance from the pool, waiting as a call would.
func (m *Module) Reserve(ctx context.Context) (*Reservation, error) {
	inst, cur, err := m.take(ctx, "reserve an instance")
	if cur != nil {
		return cur.Reserve(ctx)
	}
	if err != nil {
		return nil, err
	}
	return &Reservation{m: m, inst: inst}, nil
}

// Module is the module version the reservation holds an instance of.
func (r *Reservation) Module() *Module { return r.m }

// Call is Module.Call on the reserved instance.
func (r *Reservation) Call(ctx context.Context, op abi.Op, req []byte) ([]byte, error) {
	r.mu.Lock()
	inst := r.inst
	r.inst = nil
	r.mu.Unlock()
	m := r.m
	if inst == nil || !m.ops[op] {
		if inst != nil {
			r.put(inst)
		}
		return m.Call(ctx, op, req)
	}
	start := time.Now()
	if err := ctx.Err(); err != nil {
		r.put(inst)
		err = ctxError(m.name, string(op), err)
		m.observe(op, start, codeOf(err))
		return nil, err
	}
	resp, err, keep := m.run(ctx, inst, op, req)
	if keep {
		r.put(inst)
	} else {
		m.pool.release(inst, false)
	}
	m.observe(op, start, codeOf(err))
	return resp, err
}

// put gives inst back to the reservation, or to the pool after Release.
func (r *Reservation) put(inst *instance) {
	r.mu.Lock()
	if !r.done {
		r.inst = inst
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	r.m.pool.release(inst, r.m.keeps(inst, "release"))
}

// Release gives the instance back to the pool. It is idempotent.
func (r *Reservation) Release() {
	r.mu.Lock()
	inst := r.inst
	r.inst, r.done = nil, true
	r.mu.Unlock()
	if inst != nil {
		r.m.pool.release(inst, r.m.keeps(inst, "release"))
	}
}

// codeOf is abi.CodeOf with Internal for errors that carry no code.
func codeOf(err error) abi.Code {
	if err == nil {
		return abi.OK
	}
	// Declared after the nil check: errors.As makes e escape, and a
	// successful call must not allocate it.
	var e *abi.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return abi.Internal
}

func ctxError(module, what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return abi.Errorf(abi.DeadlineExceeded, "module %q: %s: deadline exceeded", module, what)
	}
	return abi.Errorf(abi.Canceled, "module %q: %s: canceled", module, what)
}

// instrument is meter.Instrument; tests replace it to load modules the way
// one the meter cannot read is loaded.
var instrument = meter.Instrument

// load compiles, checks and warms one module version. It does not publish it.
func (r *Runtime) load(ctx context.Context, name, file string, data []byte, digest string) (*Module, error) {
	start := time.Now()
	lim := r.limitsFor(name)
	grant := r.cfg.Grants[name]
	log := r.log.With("module", name)
	// A module the meter can read is compiled with its loop counter and
	// stopped by refuel; any other keeps wazero's check at every loop
	// header (RATIONALE.md, "Deadlines always on").
	metered, merr := instrument(data)
	if merr != nil {
		log.Warn("module not metered: its loops pay wazero's exit check on every iteration", "err", merr)
	} else {
		data = metered
	}
	// A table's entries live on the Go heap, outside the memory limit:
	// bound them, metered or not.
	data, err := meter.LimitTables(data, MaxTableEntries)
	if errors.Is(err, meter.ErrTables) {
		return nil, fmt.Errorf("module %q: %w", name, err)
	} else if err != nil {
		return nil, fmt.Errorf("module %q: its tables cannot be bounded, so it is not loaded: %w", name, err)
	}
	rc := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(metered == nil).
		WithMemoryLimitPages(lim.MemoryPages).
		WithCompilationCache(r.cache)
	m := &Module{
		name:    name,
		file:    file,
		digest:  digest,
		grant:   grant,
		limits:  lim,
		rt:      r,
		log:     log,
		env:     &hostcalls.Env{Module: name, Roots: slices.Clone(grant.Roots), Log: log},
		wrt:     wazero.NewRuntimeWithConfig(ctx, rc),
		metered: metered != nil,
	}
	fail := func(err error) (*Module, error) {
		m.closeRuntime()
		return nil, fmt.Errorf("module %q: %w", name, err)
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, m.wrt); err != nil {
		return fail(fmt.Errorf("instantiate WASI: %w", err))
	}
	wasi := m.wrt.Module(wasiModule).ExportedFunctionDefinitions()
	cm, err := m.wrt.CompileModule(ctx, data)
	if err != nil {
		return fail(fmt.Errorf("compile: %w", err))
	}
	m.compiled = cm
	compiled := time.Since(start)
	c := validate(cm, grant, r.cfg.HostCalls, wasi, m.metered)
	if len(c.problems) > 0 {
		return fail(errors.New(strings.Join(c.problems, "; ")))
	}
	if err := available(c.hostCalls); err != nil {
		return fail(err)
	}
	m.ops, m.hasInit = c.ops, c.hasInit
	m.minPages = cm.ExportedMemories()[abi.ExportMemory].Min()
	m.mem.limit = r.mem.limit / 2
	m.memGauge = r.metrics.memGaugeFor(name)
	if err := m.instantiateHost(ctx, c.hostCalls); err != nil {
		return fail(fmt.Errorf("instantiate host module: %w", err))
	}
	m.om = r.metrics.forModule(name, c.ops)
	m.pool = newPool(lim.PoolSize, lim.AcquireTimeout, m.newInstance, m.destroyInstance, func() { r.drained(m) })

	// The eager first instance: a bad module fails here, not on the first volume.
	inst, err := m.pool.acquire(ctx)
	if err != nil {
		m.pool.retire()
		return nil, fmt.Errorf("module %q: first instance: %w", name, err)
	}
	v, err := inst.invoke(ctx, inst.mod.ExportedFunction(abi.ExportABIVersion), abi.ExportABIVersion, nil)
	if err == nil && int32(v) != abi.Version {
		err = fmt.Errorf("module %q: %s returned %d, this host speaks ABI version %d", name, abi.ExportABIVersion, int32(v), abi.Version)
	}
	m.pool.release(inst, err == nil)
	if err != nil {
		m.pool.retire()
		return nil, err
	}
	if r.cfg.OnLoad != nil {
		if err := r.cfg.OnLoad(ctx, m); err != nil {
			m.pool.retire()
			return nil, fmt.Errorf("module %q: %w", name, err)
		}
	}
	attrs := []any{"file", file, "digest", digest}
	if !slices.Contains(m.described, any("ops")) {
		ops := make([]string, 0, len(m.ops))
		for _, op := range abi.AllOps {
			if m.ops[op] {
				ops = append(ops, string(op))
			}
		}
		attrs = append(attrs, "ops", ops)
	}
	attrs = append(attrs, m.described...)
	attrs = append(attrs, "compile", compiled, "ready", time.Since(start), "metered", m.metered,
		"pool", lim.PoolSize, "memory_pages", lim.MemoryPages, "call_timeout", lim.CallTimeout)
	log.Info("module loaded", attrs...)
	return m, nil
}

// available refuses a module that imports a host call this host cannot
// serve, before any of the module's code runs: a configure that would set
// up files or loop devices for a missing kernel feature and then fail
// never starts. Each family is asked once.
func available(calls []hostcalls.Func) error {
	asked := map[string]bool{}
	for _, f := range calls {
		if f.Available == nil || asked[f.Family] {
			continue
		}
		asked[f.Family] = true
		if err := f.Available(); err != nil {
			return &UnavailableError{Family: f.Family, Err: err}
		}
	}
	return nil
}

// UnavailableError refuses a module that imports a host-call family this
// host cannot serve (a kernel without device-mapper, no iSCSI initiator):
// the module is fine and granted, the machine lacks what it needs.
type UnavailableError struct {
	Family string
	Err    error // what is missing, as the family's check says
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("host call family %q is not available on this host: %v", e.Family, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// instantiateHost builds the module's "wasmcsi" host module: the core
// imports and the granted host calls it imports, nothing else.
func (m *Module) instantiateHost(ctx context.Context, calls []hostcalls.Func) error {
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	b := m.wrt.NewHostModuleBuilder(abi.HostModule)
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(requestRead), []api.ValueType{i32, i32}, []api.ValueType{i32}).
		WithParameterNames("buf", "limit").Export(abi.ImportRequestRead)
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(responseWrite), []api.ValueType{i32, i32}, nil).
		WithParameterNames("buf", "len").Export(abi.ImportResponseWrite)
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(resultRead), []api.ValueType{i32, i32}, []api.ValueType{i32}).
		WithParameterNames("buf", "limit").Export(abi.ImportResultRead)
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(guestLog), []api.ValueType{i32, i32, i32}, nil).
		WithParameterNames("level", "buf", "len").Export(abi.ImportLog)
	for _, f := range calls {
		b.NewFunctionBuilder().WithGoModuleFunction(hostCall(f), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}).
			WithParameterNames("req", "req_len", "out", "out_limit").Export(f.Name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return err
	}
	if !m.metered {
		return nil
	}
	_, err := m.wrt.NewHostModuleBuilder(meter.Module).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(refuel), nil, []api.ValueType{i32}).Export(meter.Func).
		Instantiate(ctx)
	return err
}

// closeRuntime frees the module's wazero runtime and compiled code; every
// instance still open fails its call.
func (m *Module) closeRuntime() {
	m.closeOnce.Do(func() {
		ctx := context.Background()
		_ = m.wrt.Close(ctx)
		if m.compiled != nil {
			_ = m.compiled.Close(ctx)
		}
	})
}

func (m *Module) observe(op abi.Op, start time.Time, code abi.Code) {
	if m.rt.metrics == nil {
		return
	}
	d := time.Since(start).Seconds()
	if om, ok := m.om[op]; ok {
		om.duration.Observe(d)
		if code == abi.OK {
			om.ok.Inc()
			return
		}
	} else {
		m.rt.metrics.duration.WithLabelValues(m.name, string(op)).Observe(d)
	}
	m.rt.metrics.calls.WithLabelValues(m.name, string(op), code.String()).Inc()
}
