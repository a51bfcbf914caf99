// Package moduletest runs a built backend module (.wasm) the way the daemon
// does — same runtime, limits, grants and codec — against a fake host or
// the daemon's real host calls, with either toolchain. It is the daemon's
// own test harness, in the daemon's types (modules.Grant, hostcalls.Func,
// the runtime itself); module authors use github.com/wasmcsi/wasmcsi/sdk/moduletest,
// which wraps it in types of its own. It is for tests only.
package moduletest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/modules"
)

// Toolchain builds modules.
type Toolchain string

const (
	Go     Toolchain = "go"
	TinyGo Toolchain = "tinygo"
)

// Toolchains are both toolchains, for table tests that run once per build.
var Toolchains = []Toolchain{Go, TinyGo}

// TinyGoPath returns the tinygo command: $WASMCSI_TINYGO, else tinygo on
// PATH, else "".
func TinyGoPath() string {
	if p := os.Getenv("WASMCSI_TINYGO"); p != "" {
		return p
	}
	if p, err := exec.LookPath("tinygo"); err == nil {
		return p
	}
	return ""
}

var (
	buildMu    sync.Mutex
	buildCache = map[string]string{}
	buildDir   string
)

// EnvModuleDir names a folder of prebuilt modules ("<name>.wasm" and
// "<name>.tinygo.wasm"). Where it is set — the VM tier sets it, since its
// guest has no Go toolchain — Build returns the prebuilt module instead of
// compiling.
const EnvModuleDir = "WASMCSI_MODULE_DIR"

// Build compiles the module package pkg (an import path or a ./relative
// directory) with tc and returns the .wasm path. Builds are shared by every
// test of the process. A test asking for TinyGo where none is installed is
// skipped with the reason, unless WASMCSI_REQUIRE_TINYGO is set (CI), where
// it fails. With EnvModuleDir set, the prebuilt "<last element of pkg>"
// module is used, and a test whose module is not there is skipped.
func Build(t testing.TB, pkg string, tc Toolchain) string {
	t.Helper()
	if dir := os.Getenv(EnvModuleDir); dir != "" {
		name := filepath.Base(pkg)
		file := filepath.Join(dir, name+".wasm")
		if tc == TinyGo {
			file = filepath.Join(dir, name+".tinygo.wasm")
		}
		if _, err := os.Stat(file); err != nil {
			t.Skipf("no prebuilt %s module in %s=%s: %v", tc, EnvModuleDir, dir, err)
		}
		return file
	}
	if strings.HasPrefix(pkg, ".") {
		abs, err := filepath.Abs(pkg)
		if err != nil {
			t.Fatal(err)
		}
		pkg = abs
	}
	key := string(tc) + " " + pkg
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := buildCache[key]; ok {
		return p
	}
	if buildDir == "" {
		// One shared folder, one file per module and toolchain: later runs
		// overwrite their own builds instead of leaving folders behind.
		d := filepath.Join(os.TempDir(), "wasmcsi-moduletest")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	sum := sha256.Sum256([]byte(key))
	final := filepath.Join(buildDir, hex.EncodeToString(sum[:8])+".wasm")
	// Build under a name of this process, then rename: test binaries of
	// several packages build the same module at once.
	out := final + "." + strconv.Itoa(os.Getpid()) + ".tmp"
	defer os.Remove(out)
	var cmd *exec.Cmd
	switch tc {
	case Go:
		cmd = exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	case TinyGo:
		tg := TinyGoPath()
		if tg == "" {
			if os.Getenv("WASMCSI_REQUIRE_TINYGO") != "" {
				t.Fatal("TinyGo required (WASMCSI_REQUIRE_TINYGO) but not found: set WASMCSI_TINYGO or put tinygo on PATH")
			}
			t.Skip("needs TinyGo: set WASMCSI_TINYGO (make tinygo prints it) or put tinygo on PATH")
		}
		cmd = exec.Command(tg, "build", "-target=wasip1", "-buildmode=c-shared", "-scheduler=none", "-no-debug", "-o", out, pkg)
	default:
		t.Fatalf("unknown toolchain %q", tc)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s build %s: %v\n%s", tc, pkg, err, b)
	}
	if err := os.Rename(out, final); err != nil {
		t.Fatal(err)
	}
	buildCache[key] = final
	return final
}

// Options configure Load.
type Options struct {
	// Name is the module's name (default "module").
	Name string
	// Grant is what the operator grants the module.
	Grant modules.Grant
	// HostCalls answer the module's imports: a FakeHost's Funcs, the real
	// ones from hostcalls/catalog, or a mix.
	HostCalls map[string]hostcalls.Func
	// Limits default to 5 s per call, 4096 pages, a pool of 2.
	Limits modules.Limits
}

// Module is a loaded module.
type Module struct {
	rt *modules.Runtime
	m  *modules.Module
	// Info is the module's decoded backend_info.
	Info abi.BackendInfo
}

// Load loads wasm into a fresh runtime, runs its configure (when it has one)
// with the grant's config and roots on every instance, and decodes its
// backend_info. The runtime is closed when the test ends. A refusal fails
// the test.
func Load(t testing.TB, wasm string, opt Options) *Module {
	t.Helper()
	m, err := TryLoad(t, wasm, opt)
	if err != nil {
		t.Fatalf("load %s: %v", wasm, err)
	}
	return m
}

// TryLoad is Load returning the runtime's refusal (as the daemon would log
// it) instead of failing the test; setup errors still fail it.
func TryLoad(t testing.TB, wasm string, opt Options) (*Module, error) {
	t.Helper()
	if opt.Name == "" {
		opt.Name = "module"
	}
	if opt.Limits == (modules.Limits{}) {
		opt.Limits = modules.Limits{CallTimeout: 5 * time.Second, MemoryPages: 4096, PoolSize: 2, AcquireTimeout: 5 * time.Second}
	}
	dir := t.TempDir()
	data, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, opt.Name+".wasm"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	lm := &Module{}
	ctx := context.Background()
	rt, err := modules.New(ctx, modules.Config{
		// A compilation cache shared by every test run: compiling a
		// standard-Go module costs seconds (tens under emulation).
		CacheDir: filepath.Join(os.TempDir(), "wasmcsi-moduletest-cache"),
		Dir:      dir, Limits: opt.Limits, HostCalls: opt.HostCalls,
		Grants: map[string]modules.Grant{opt.Name: opt.Grant},
		OnLoad: func(ctx context.Context, m *modules.Module) error {
			lm.m = m
			// As the daemon does: configure first (backend_info may depend
			// on it) and replay it on every later instance; an SDK module
			// without a Configurer answers UNIMPLEMENTED, which is fine.
			if m.Has(abi.OpConfigure) {
				req := &abi.ConfigureRequest{Config: opt.Grant.Config, Roots: opt.Grant.Roots, NodeID: "moduletest", Role: "all"}
				switch err := lm.Call(abi.OpConfigure, req, &abi.Empty{}); {
				case err == nil:
					m.SetInstanceSetup(abi.OpConfigure, req.AppendWire(nil))
				case abi.CodeOf(err) != abi.Unimplemented:
					return err
				}
			}
			return lm.Call(abi.OpInfo, &abi.Empty{}, &lm.Info)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	if errs := rt.Load(ctx); errs[opt.Name] != nil {
		return nil, errs[opt.Name]
	}
	m, ok := rt.Module(opt.Name)
	if !ok {
		t.Fatalf("module %s did not load", opt.Name)
	}
	lm.rt, lm.m = rt, m
	return lm, nil
}

// Call runs op with req and decodes the answer into resp. A module's error
// comes back as an *abi.Error with its code.
func (m *Module) Call(op abi.Op, req, resp abi.Message) error {
	out, err := m.m.Call(context.Background(), op, req.AppendWire(nil))
	if err != nil {
		return err
	}
	return resp.UnmarshalWire(out)
}

// Has reports whether the module exports op.
func (m *Module) Has(op abi.Op) bool { return m.m.Has(op) }

// Runtime returns the module's runtime (for benchmarks and fault tests).
func (m *Module) Runtime() *modules.Runtime { return m.rt }

// CallRaw runs op with an encoded request and returns the encoded answer.
func (m *Module) CallRaw(op abi.Op, req []byte) ([]byte, error) {
	return m.m.Call(context.Background(), op, req)
}
