package moduletest

import (
	"maps"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	mt "github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// Host is a set of host calls that answers a built module's imports
// (Options.Host): a FakeHost's, the daemon's real ones, or a mix. The zero
// Host has none.
type Host struct {
	funcs map[string]hostcalls.Func
}

// RealCalls is every host call the daemon offers, as it runs them: confined
// to the grant's roots, touching the real system (directories need no
// privileges; loop devices, mounts, device-mapper and iSCSI need root).
func RealCalls() Host { return Host{funcs: catalog.All()} }

// With returns h with o's calls added; where both answer a call, o's wins.
func (h Host) With(o Host) Host {
	out := Host{funcs: maps.Clone(h.funcs)}
	if out.funcs == nil {
		out.funcs = map[string]hostcalls.Func{}
	}
	maps.Copy(out.funcs, o.funcs)
	return out
}

// Names lists the host calls h answers ("dir_create", ...).
func (h Host) Names() []string {
	var names []string
	for n := range h.funcs {
		names = append(names, n)
	}
	return names
}

// RealHost answers native host calls (hostcall.SetHost) with the daemon's
// real implementations, confined to roots like a granted module.
func RealHost(roots []string) hostcall.Host { return mt.RealHost(catalog.All(), roots) }

// FakeHost answers host calls from handlers a test installs and records
// every call, for tests that check what a module asks of the host without
// touching the system. The same FakeHost serves a built module (Host) and
// native module logic (Native). Its zero value is ready; it is safe for
// concurrent use.
type FakeHost struct {
	f mt.FakeHost
}

// Handle installs the answer to one host call. family is the grant the call
// belongs to ("dir" for "dir_create").
func (f *FakeHost) Handle(family, name string, fn func(req []byte) ([]byte, error)) {
	f.f.Handle(family, name, fn)
}

// HandleTyped installs a typed answer.
func HandleTyped[Req any, Resp any, PReq interface {
	*Req
	abi.Message
}, PResp interface {
	*Resp
	abi.Message
}](f *FakeHost, family, name string, fn func(PReq) (PResp, error)) {
	mt.HandleTyped(&f.f, family, name, fn)
}

// Calls returns the names of the host calls made so far, in order.
func (f *FakeHost) Calls() []string { return f.f.Calls() }

// Host exposes the handlers as host calls for Load.
func (f *FakeHost) Host() Host { return Host{funcs: f.f.Funcs()} }

// Native returns the fake as the host of native builds (hostcall.SetHost).
func (f *FakeHost) Native() hostcall.Host { return f.f.Native() }
