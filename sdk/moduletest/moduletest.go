// Package moduletest runs a built backend module (.wasm) the way the daemon
// does — same runtime, limits, grants and codec — against a fake host or
// the daemon's real host calls, so a policy author tests the artifact they
// ship, with either toolchain, and tests module logic natively against the
// same fake or real host (hostcall.SetHost). Its API is in its own types
// and those of abi and sdk/hostcall; it runs the daemon's runtime inside,
// which is why it is a module of its own that only an author's tests
// require. It is for tests only.
package moduletest

import (
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules"
	mt "github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Toolchain builds modules.
type Toolchain string

const (
	Go     Toolchain = "go"
	TinyGo Toolchain = "tinygo"
)

// Toolchains are both toolchains, for table tests that run once per build.
var Toolchains = []Toolchain{Go, TinyGo}

// EnvModuleDir names a folder of prebuilt modules ("<name>.wasm" and
// "<name>.tinygo.wasm"); where it is set, Build returns the prebuilt module
// instead of compiling.
const EnvModuleDir = mt.EnvModuleDir

// TinyGoPath returns the tinygo command: $WASMCSI_TINYGO, else tinygo on
// PATH, else "".
func TinyGoPath() string { return mt.TinyGoPath() }

// Build builds the module package pkg (an import path, or a folder starting
// with "./") with tc and returns the .wasm file's path; builds are cached
// per test process. Without a TinyGo the TinyGo build skips the test with
// the reason, or fails it when WASMCSI_REQUIRE_TINYGO=1.
func Build(t testing.TB, pkg string, tc Toolchain) string {
	t.Helper()
	return mt.Build(t, pkg, mt.Toolchain(tc))
}

// Grant is what the operator grants a module in the daemon's configuration
// (modules.<name> there): the host-call families it may import, the roots
// its host calls are confined to, and its own configuration for configure.
type Grant struct {
	HostCalls []string
	Roots     []string
	Config    map[string]string
}

// Limits bound the module's calls as the daemon's limits do; zero fields
// take the defaults of Options.Limits.
type Limits struct {
	// CallTimeout is the guest time a call may take (default 5 s).
	CallTimeout time.Duration
	// MemoryPages caps an instance's memory in 64 KiB pages (default 4096).
	MemoryPages uint32
	// PoolSize is the number of instances, the module's concurrency
	// (default 2).
	PoolSize int
}

// Options configure Load.
type Options struct {
	// Name is the module's name (default "module").
	Name string
	// Grant is what the operator grants the module.
	Grant Grant
	// Host answers the module's imports: a FakeHost's Host(), RealCalls(),
	// or a mix (Host.With).
	Host Host
	// Limits default to 5 s per call, 4096 pages, a pool of 2.
	Limits Limits
}

// Module is a loaded module.
type Module struct {
	m *mt.Module
	// Info is the module's decoded backend_info.
	Info abi.BackendInfo
}

// Load loads wasm into a fresh runtime, as the daemon does: it checks the
// module's imports against the grant and the host, runs its configure
// (when it has one) with the grant's config and roots on every instance,
// and decodes its backend_info. The runtime is closed when the test ends.
// A refusal fails the test; TryLoad returns it.
func Load(t testing.TB, wasm string, opt Options) *Module {
	t.Helper()
	m, err := TryLoad(t, wasm, opt)
	if err != nil {
		t.Fatalf("load %s: %v", wasm, err)
	}
	return m
}

// TryLoad is Load returning the refusal, worded as the daemon logs it
// ("module \"name\": import wasmcsi.dir_create needs grant \"dir\""), so
// a test can check that a module is refused without a grant.
func TryLoad(t testing.TB, wasm string, opt Options) (*Module, error) {
	t.Helper()
	m, err := mt.TryLoad(t, wasm, mt.Options{
		Name:      opt.Name,
		Grant:     modules.Grant{HostCalls: opt.Grant.HostCalls, Roots: opt.Grant.Roots, Config: opt.Grant.Config},
		HostCalls: opt.Host.funcs,
		Limits:    limits(opt.Limits),
	})
	if err != nil {
		return nil, err
	}
	return &Module{m: m, Info: m.Info}, nil
}

func limits(l Limits) modules.Limits {
	if l == (Limits{}) {
		return modules.Limits{}
	}
	out := modules.Limits{CallTimeout: l.CallTimeout, MemoryPages: l.MemoryPages, PoolSize: l.PoolSize, AcquireTimeout: 5 * time.Second}
	if out.CallTimeout == 0 {
		out.CallTimeout = 5 * time.Second
	}
	if out.MemoryPages == 0 {
		out.MemoryPages = 4096
	}
	if out.PoolSize == 0 {
		out.PoolSize = 2
	}
	return out
}

// Call runs op with req and decodes the answer into resp. A module's error
// comes back as an *abi.Error with its code.
func (m *Module) Call(op abi.Op, req, resp abi.Message) error { return m.m.Call(op, req, resp) }

// CallRaw runs op with an encoded request and returns the encoded answer,
// for requests a typed Call cannot make (one that does not decode is
// INVALID_ARGUMENT).
func (m *Module) CallRaw(op abi.Op, req []byte) ([]byte, error) {
	return m.m.CallRaw(op, req)
}

// Has reports whether the module exports op.
func (m *Module) Has(op abi.Op) bool { return m.m.Has(op) }
