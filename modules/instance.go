package modules

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// instance is one initialized guest instance. It serves one call at a time;
// the fields below mod are that call's state, which host functions reach
// through the call's context (callKey).
type instance struct {
	m     *Module
	mod   api.Module
	fns   map[abi.Op]api.Function
	stack [1]uint64

	op     string // export being called, for logs and errors
	req    []byte // request of the current call (not owned)
	resp   []byte // last response_write of the current call
	result []byte // full result of the last host call
	fault  error  // set by a host function that failed the call

	stdout, stderr *guestOutput
	logs           logBudget // the current call's output accounting

	clock guestClock // the running call's context

	mem       *guestMemory
	idleBytes int64 // the most memory the instance may keep in the pool
	refused   int64 // size of a grow the memory budget refused in the last call
}

// callKey carries the running *instance in the context of an export call
// (the instance's guestClock answers it).
type callKey struct{}

// newInstance instantiates and initializes one instance of m.
func (m *Module) newInstance(ctx context.Context) (*instance, error) {
	inst := &instance{m: m, fns: make(map[abi.Op]api.Function, len(m.ops))}
	inst.clock.init(inst)
	inst.stdout = newGuestOutput(inst, "stdout", slog.LevelInfo, false)
	inst.stderr = newGuestOutput(inst, "stderr", slog.LevelWarn, true)
	// No FS, network, env or args; wazero's default clocks and random
	// source are deterministic fakes.
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithStdout(inst.stdout).
		WithStderr(inst.stderr)
	mem, err := m.newGuestMemory(int64(m.minPages)*pageSize, int64(m.limits.MemoryPages)*pageSize)
	if err != nil {
		return nil, abi.Errorf(abi.ResourceExhausted, "module %q: instantiate: %v", m.name, err)
	}
	inst.mem = mem
	// Instantiation runs the module's start function, if it has one,
	// outside any operation: refuel bounds it by the call timeout.
	ictx, cancel := context.WithTimeout(ctx, m.limits.CallTimeout)
	mod, err := m.wrt.InstantiateModule(experimental.WithMemoryAllocator(ictx, mem), m.compiled, cfg)
	cancel()
	if err != nil {
		mem.release()
		return nil, abi.Errorf(abi.Internal, "module %q: instantiate: %v", m.name, err)
	}
	inst.mod = mod
	for op := range m.ops {
		inst.fns[op] = mod.ExportedFunction(string(op))
	}
	if m.hasInit {
		if _, err := inst.invoke(ctx, mod.ExportedFunction(abi.ExportInitialize), abi.ExportInitialize, nil); err != nil {
			_ = mod.Close(context.Background())
			mem.release()
			return nil, err
		}
	}
	if s := m.setup.Load(); s != nil && inst.fns[s.op] != nil {
		ret, err := inst.invoke(ctx, inst.fns[s.op], string(s.op), s.req)
		if code := abi.Code(ret); err == nil && code != abi.OK {
			err = abi.Errorf(abi.Internal, "module %q: %s of a new instance answered %s: %s", m.name, s.op, code, inst.resp)
		}
		inst.resp = nil
		if err != nil {
			_ = mod.Close(context.Background())
			mem.release()
			return nil, err
		}
	}
	inst.idleBytes = max(mem.bytes(), int64(m.limits.IdleMemoryPages)*pageSize)
	if mt := m.rt.metrics; mt != nil {
		mt.instances.WithLabelValues(m.name).Inc()
	}
	return inst, nil
}

// destroyInstance closes inst; it is never used again.
func (m *Module) destroyInstance(inst *instance) {
	inst.stdout.flush()
	inst.stderr.flush()
	inst.endLogs()
	_ = inst.mod.Close(context.Background())
	inst.mem.release()
	if mt := m.rt.metrics; mt != nil {
		mt.instances.WithLabelValues(m.name).Dec()
	}
}

// holdsTooMuch reports whether inst's memory grew past what an idle
// instance may keep.
func (inst *instance) holdsTooMuch() bool { return inst.mem.bytes() > inst.idleBytes }

// invoke calls fn (an export of inst with at most one result) under ctx
// and the module's call timeout of guest time, and returns its i32 result.
// An error is an *abi.Error, and inst must then be discarded.
func (inst *instance) invoke(ctx context.Context, fn api.Function, what string, req []byte) (uint32, error) {
	inst.op, inst.req, inst.resp, inst.result, inst.fault = what, req, nil, nil, nil
	inst.stderr.reset()
	inst.clock.start(ctx, inst.m.limits.CallTimeout)
	inst.mem.enter()
	err := fn.CallWithStack(&inst.clock, inst.stack[:])
	inst.refused = inst.mem.leave()
	inst.clock.end()
	inst.req, inst.result = nil, nil
	inst.stdout.flush()
	inst.stderr.flush()
	inst.endLogs()
	if err == nil && inst.fault == nil {
		return uint32(inst.stack[0]), nil
	}
	return 0, inst.failure(err)
}

// failure turns the error of a failed export call into an *abi.Error.
func (inst *instance) failure(err error) error {
	m := inst.m
	var code abi.Code
	var msg string
	var exit *sys.ExitError
	switch {
	case inst.fault != nil:
		code, msg = abi.Internal, inst.fault.Error()
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded:
		code, msg = abi.DeadlineExceeded, "deadline exceeded (the caller's deadline)"
		if errors.Is(inst.clock.Err(), errGuestTime) {
			msg = fmt.Sprintf("deadline exceeded (guest time over the call timeout %s; time in host calls not counted)", m.limits.CallTimeout)
		}
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeContextCanceled:
		code, msg = abi.Canceled, "canceled by the caller"
	case errors.As(err, &exit):
		code, msg = abi.Internal, fmt.Sprintf("guest exited with code %d", exit.ExitCode())
	default:
		code, msg = abi.Internal, "trap: "+err.Error()
	}
	if code == abi.Internal && inst.refused > 0 {
		// The guest's runtime gives up when a grow fails; the cause is the
		// daemon's budget, not the module.
		code, msg = abi.ResourceExhausted, m.budgetError("an instance could not grow its memory to "+mebibytes(inst.refused))+" ("+msg+")"
	}
	msg = fmt.Sprintf("module %q: %s: %s", m.name, inst.op, msg)
	if code == abi.Internal {
		if tail := inst.stderr.tail(); tail != "" {
			msg += "\nstderr: " + tail
		}
	}
	m.log.Warn("module call failed; instance discarded", "op", inst.op, "code", code, "err", msg)
	return &abi.Error{Code: code, Message: msg}
}

// current returns the instance whose call is running on ctx.
func current(ctx context.Context) *instance {
	inst, _ := ctx.Value(callKey{}).(*instance)
	if inst == nil {
		panic(errors.New("wasmcsi host function called outside an operation"))
	}
	return inst
}

// trap fails the running call: the guest stops and the instance is discarded.
func (inst *instance) trap(format string, args ...any) {
	inst.fault = fmt.Errorf(format, args...)
	panic(inst.fault)
}

// copyOut writes data to the guest at buf when it fits in limit, and returns
// its full length.
func (inst *instance) copyOut(mod api.Module, what string, buf, limit uint32, data []byte) uint32 {
	n := uint32(len(data))
	if n > 0 && n <= limit && !mod.Memory().Write(buf, data) {
		inst.trap("%s: buffer [%d, +%d) is outside the guest's memory", what, buf, n)
	}
	return n
}

func requestRead(ctx context.Context, mod api.Module, stack []uint64) {
	inst := current(ctx)
	stack[0] = api.EncodeU32(inst.copyOut(mod, abi.ImportRequestRead, api.DecodeU32(stack[0]), api.DecodeU32(stack[1]), inst.req))
}

func resultRead(ctx context.Context, mod api.Module, stack []uint64) {
	inst := current(ctx)
	stack[0] = api.EncodeU32(inst.copyOut(mod, abi.ImportResultRead, api.DecodeU32(stack[0]), api.DecodeU32(stack[1]), inst.result))
}

func responseWrite(ctx context.Context, mod api.Module, stack []uint64) {
	inst := current(ctx)
	buf, n := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	b, ok := mod.Memory().Read(buf, n)
	if !ok {
		inst.trap("%s: buffer [%d, +%d) is outside the guest's memory", abi.ImportResponseWrite, buf, n)
	}
	inst.resp = bytes.Clone(b)
}

func guestLog(ctx context.Context, mod api.Module, stack []uint64) {
	inst := current(ctx)
	level, buf, n := int32(api.DecodeU32(stack[0])), api.DecodeU32(stack[1]), api.DecodeU32(stack[2])
	b, ok := mod.Memory().Read(buf, n)
	if !ok {
		inst.trap("%s: buffer [%d, +%d) is outside the guest's memory", abi.ImportLog, buf, n)
	}
	cut := 0
	if len(b) > maxLine {
		b, cut = b[:maxLine], len(b)-maxLine
	}
	inst.logLine(slog.Level(level), "", b, cut)
}

// hostCall adapts f to the host-call signature (req, req_len, out,
// out_limit) -> code<<32 | result_len.
func hostCall(f hostcalls.Func) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		inst := current(ctx)
		reqPtr, reqLen := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
		out, outLimit := api.DecodeU32(stack[2]), api.DecodeU32(stack[3])
		view, ok := mod.Memory().Read(reqPtr, reqLen)
		if !ok {
			inst.trap("host call %s: request [%d, +%d) is outside the guest's memory", f.Name, reqPtr, reqLen)
		}
		// Every host call passes here: the guest clock stops while the
		// host works on the guest's behalf, and the host call is bounded by
		// the caller's context instead.
		if exit := inst.clock.pause(); exit != nil {
			panic(exit)
		}
		res, err := inst.runHostCall(inst.clock.parent, f, bytes.Clone(view))
		if exit := inst.clock.resume(); exit != nil {
			panic(exit)
		}
		code := abi.OK
		if err != nil {
			var ae *abi.Error
			switch {
			case errors.As(err, &ae) && ae.Code != abi.OK && ae.Code.Valid():
				code = ae.Code
				if e, direct := err.(*abi.Error); direct {
					res = []byte(e.Message)
				} else {
					res = []byte(err.Error())
				}
			default:
				code, res = abi.Internal, []byte(err.Error())
				inst.m.log.Warn("host call failed", "op", inst.op, "hostcall", f.Name, "err", err)
			}
		}
		inst.result = res
		n := inst.copyOut(mod, f.Name, out, outLimit, res)
		stack[0] = abi.PackResult(code, n)
	}
}

// fuelPerRefuel is how many loop iterations a metered guest runs between
// two refuel calls: often enough that a deadline is seen, and the Go
// scheduler can stop the goroutine, within microseconds of guest time;
// rarely enough that the exit to Go costs nothing measurable.
const fuelPerRefuel = 1 << 14

// refuel is the import meter.Instrument adds to a module: a metered guest
// calls it when its loop counter runs out. It stops the guest when the
// call's guest time is spent or its caller's context has ended, and
// otherwise answers the next count.
func refuel(ctx context.Context, mod api.Module, stack []uint64) {
	inst, _ := ctx.Value(callKey{}).(*instance)
	switch {
	case mod.IsClosed():
		// The module was closed under the call (a forced shutdown): stop
		// as wazero's own checks would.
		panic(sys.NewExitError(0))
	case inst != nil:
		if exit := inst.clock.check(); exit != nil {
			panic(exit)
		}
	case errors.Is(ctx.Err(), context.Canceled):
		// A start function, run by instantiation outside any operation,
		// under the call timeout (newInstance).
		panic(sys.NewExitError(sys.ExitCodeContextCanceled))
	case ctx.Err() != nil:
		panic(sys.NewExitError(sys.ExitCodeDeadlineExceeded))
	}
	stack[0] = fuelPerRefuel
}

// runHostCall runs f and turns a panic into a failure of the whole call: the
// guest is stopped and its instance discarded, the daemon lives on.
func (inst *instance) runHostCall(ctx context.Context, f hostcalls.Func, req []byte) (res []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			inst.m.log.Error("host call panicked", "op", inst.op, "hostcall", f.Name, "panic", p, "stack", string(debug.Stack()))
			inst.fault = fmt.Errorf("host call %s panicked: %v", f.Name, p)
			panic(inst.fault)
		}
	}()
	return f.Call(ctx, inst.m.env, req)
}
