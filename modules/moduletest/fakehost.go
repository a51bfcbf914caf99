package moduletest

import (
	"context"
	"sync"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// FakeHost answers host calls from handlers a test installs and records
// every call, for tests that check what a module asks of the host without
// touching the system. The same FakeHost serves a built module (Funcs) and
// native module logic (Native).
type FakeHost struct {
	mu       sync.Mutex
	handlers map[string]fakeHandler
	calls    []string
}

type fakeHandler struct {
	family string
	fn     func(req []byte) ([]byte, error)
}

// Handle installs the answer to one host call. family is the grant the call
// belongs to ("dir" for "dir_create").
func (f *FakeHost) Handle(family, name string, fn func(req []byte) ([]byte, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.handlers == nil {
		f.handlers = map[string]fakeHandler{}
	}
	f.handlers[name] = fakeHandler{family: family, fn: fn}
}

// HandleTyped installs a typed answer.
func HandleTyped[Req any, Resp any, PReq interface {
	*Req
	abi.Message
}, PResp interface {
	*Resp
	abi.Message
}](f *FakeHost, family, name string, fn func(PReq) (PResp, error)) {
	f.Handle(family, name, func(raw []byte) ([]byte, error) {
		req := PReq(new(Req))
		if err := req.UnmarshalWire(raw); err != nil {
			return nil, abi.Errorf(abi.InvalidArgument, "%v", err)
		}
		resp, err := fn(req)
		if err != nil || resp == nil {
			return nil, err
		}
		return resp.AppendWire(nil), nil
	})
}

// Calls returns the names of the host calls made so far, in order.
func (f *FakeHost) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *FakeHost) answer(name string, req []byte) ([]byte, error) {
	f.mu.Lock()
	h, ok := f.handlers[name]
	f.calls = append(f.calls, name)
	f.mu.Unlock()
	if !ok {
		return nil, abi.Errorf(abi.Unimplemented, "fake host has no handler for %s", name)
	}
	return h.fn(req)
}

// Funcs exposes the handlers as host calls for Load.
func (f *FakeHost) Funcs() map[string]hostcalls.Func {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]hostcalls.Func{}
	for name, h := range f.handlers {
		name := name
		out[name] = hostcalls.Func{Name: name, Family: h.family, Call: func(_ context.Context, _ *hostcalls.Env, req []byte) ([]byte, error) {
			return f.answer(name, req)
		}}
	}
	return out
}

// Native returns the fake as the host of native builds (hostcall.SetHost).
func (f *FakeHost) Native() hostcall.Host { return f.answer }

// RealHost answers native host calls with the daemon's real
// implementations in funcs (usually hostcalls/catalog.All()), confined to
// roots like a granted module.
func RealHost(funcs map[string]hostcalls.Func, roots []string) hostcall.Host {
	env := &hostcalls.Env{Module: "native", Roots: roots}
	return func(name string, req []byte) ([]byte, error) {
		fn, ok := funcs[name]
		if !ok {
			return nil, abi.Errorf(abi.Unimplemented, "no host call %s", name)
		}
		return fn.Call(context.Background(), env, req)
	}
}
