package modules

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

func TestNewRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	noop := func(context.Context, *hostcalls.Env, []byte) ([]byte, error) { return nil, nil }
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{}, "Dir is empty"},
		{"missing dir", Config{Dir: dir + "/nope"}, "module folder"},
		{"negative timeout", Config{Dir: dir, Limits: Limits{CallTimeout: -1}}, "Limits.CallTimeout is negative"},
		{"negative pool", Config{Dir: dir, Overrides: map[string]Limits{"x": {PoolSize: -1}}}, `Overrides["x"].PoolSize is negative`},
		{"too many pages", Config{Dir: dir, Limits: Limits{MemoryPages: 65537}}, "MemoryPages 65537 is over 65536"},
		{"short pin", Config{Dir: dir, Pins: map[string]string{"x": "abcd"}}, `pin of "x"`},
		{"upper-case pin", Config{Dir: dir, Pins: map[string]string{"x": strings.Repeat("AB", 32)}}, `pin of "x"`},
		{"empty family grant", Config{Dir: dir, Grants: map[string]Grant{"x": {HostCalls: []string{""}}}}, "empty host-call family"},
		{"host call without Call", Config{Dir: dir, HostCalls: map[string]hostcalls.Func{"a_b": {Family: "a"}}}, `"a_b" has no Call`},
		{"host call without family", Config{Dir: dir, HostCalls: map[string]hostcalls.Func{"a_b": {Call: noop}}}, "has no Family"},
		{"host call misnamed", Config{Dir: dir, HostCalls: map[string]hostcalls.Func{"a_b": {Name: "a_c", Family: "a", Call: noop}}}, `registered as "a_b" is named "a_c"`},
		{"host call shadows core", Config{Dir: dir, HostCalls: map[string]hostcalls.Func{"log": {Family: "a", Call: noop}}}, "shadows a core import"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(context.Background(), tt.cfg)
			if err == nil {
				_ = r.Close(context.Background())
				t.Fatalf("New accepted the config; want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

// TestLoadRefusesBadModules loads every fixture into one runtime: each bad
// module is refused with an error naming its problem, the others load.
func TestLoadRefusesBadModules(t *testing.T) {
	files := map[string]string{}
	for _, fx := range []string{"good", "trap", "loop", "flood", "garbage", "badversion", "noinfo",
		"ungranted", "unknownimport", "badsig", "badcore", "nomemory", "hugemax", "bigmin", "bigtable"} {
		files[fx] = fx
	}
	r, errs := startRuntime(t, files, nil, nil)

	refused := []struct {
		module string
		want   []string
	}{
		{"badversion", []string{`module "badversion": wasmcsi_abi_version returned 2, this host speaks ABI version 1`}},
		{"noinfo", []string{`module "noinfo": missing required export backend_info () -> i32`}},
		{"ungranted", []string{`module "ungranted": import wasmcsi.test_echo needs grant "test"`}},
		{"unknownimport", []string{
			`import env.abort: unknown import module "env"`,
			`import wasmcsi.frobnicate is not a host call this daemon offers`,
			`import wasmcsi_meter.refuel: unknown import module "wasmcsi_meter"`,
		}},
		{"badsig", []string{`module "badsig": export create_volume has signature (i32) -> i32, needs () -> i32`}},
		{"badcore", []string{`module "badcore": import wasmcsi.request_read has signature (i32) -> i32, needs (i32 i32) -> i32`}},
		{"nomemory", []string{`module "nomemory": missing export memory`}},
		{"bigmin", []string{`module "bigmin": compile:`, "min 100 pages", "over limit of 64 pages"}},
		{"bigtable", []string{`module "bigtable": tables too large: the module's tables need 1048577 entries at least, the limit is 1048576`}},
	}
	for _, tt := range refused {
		t.Run(tt.module, func(t *testing.T) {
			err := errs[tt.module]
			if err == nil {
				t.Fatalf("module %q was not refused", tt.module)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if _, ok := r.Module(tt.module); ok {
				t.Errorf("refused module %q is loaded", tt.module)
			}
		})
	}
	if len(errs) != len(refused) {
		t.Errorf("got %d errors, want %d: %v", len(errs), len(refused), errs)
	}
	var names []string
	for _, m := range r.Modules() {
		names = append(names, m.Name())
	}
	if got, want := strings.Join(names, ","), "flood,garbage,good,hugemax,loop,trap"; got != want {
		t.Errorf("loaded %s, want %s", got, want)
	}
}

func TestLoadIgnoresAndRefusesFileNames(t *testing.T) {
	dir := t.TempDir()
	good := fixture(t, "good")
	writeModule(t, dir, "good", good)
	writeModule(t, dir, "Bad Name", good)
	writeModule(t, dir, ".hidden", good)
	cfg := testConfig(dir, nil)
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	errs := r.Load(context.Background())
	if err := errs["Bad Name.wasm"]; err == nil || !strings.Contains(err.Error(), "name must match") {
		t.Errorf("Bad Name.wasm: error %v, want a name error", err)
	}
	if len(errs) != 1 || len(r.Modules()) != 1 {
		t.Errorf("errors %v, modules %d; want one error and only good loaded", errs, len(r.Modules()))
	}
}

func TestPins(t *testing.T) {
	sum := sha256.Sum256(fixture(t, "good"))
	digest := hex.EncodeToString(sum[:])
	other := strings.Repeat("0", 64)

	t.Run("match", func(t *testing.T) {
		r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
			c.Pins = map[string]string{"good": digest}
		})
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		if got := mustModule(t, r, "good").Digest(); got != digest {
			t.Fatalf("digest %s, want %s", got, digest)
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
			c.Pins = map[string]string{"good": other}
		})
		want := `module "good": sha256 ` + digest + " does not match pin " + other
		if err := errs["good"]; err == nil || err.Error() != want {
			t.Fatalf("error %v, want %q", err, want)
		}
		if _, ok := r.Module("good"); ok {
			t.Fatal("module with a mismatched pin is loaded")
		}
	})
	t.Run("pinned but missing", func(t *testing.T) {
		_, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
			c.Pins = map[string]string{"good": digest, "gone": other}
		})
		if err := errs["gone"]; err == nil || !strings.Contains(err.Error(), "pinned but gone.wasm is not in the module folder") {
			t.Fatalf("error %v, want a missing-file error", err)
		}
		if errs["good"] != nil {
			t.Fatal(errs["good"])
		}
	})
}

func TestOnLoad(t *testing.T) {
	t.Run("sees a working module", func(t *testing.T) {
		var info string
		var grant Grant
		r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
			c.Grants["good"] = Grant{HostCalls: []string{"test"}, Config: map[string]string{"pool": "a"}}
			c.OnLoad = func(ctx context.Context, m *Module) error {
				resp, err := m.Call(ctx, abi.OpInfo, nil)
				info, grant = string(resp), m.Grant()
				return err
			}
		})
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		if info != "good" || grant.Config["pool"] != "a" {
			t.Fatalf("OnLoad saw info %q, grant %+v", info, grant)
		}
		mustModule(t, r, "good")
	})
	t.Run("error refuses the module", func(t *testing.T) {
		var seen *Module
		r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
			c.OnLoad = func(ctx context.Context, m *Module) error {
				seen = m
				return errors.New("configure: pool folder /srv/x does not exist")
			}
		})
		want := `module "good": configure: pool folder /srv/x does not exist`
		if err := errs["good"]; err == nil || err.Error() != want {
			t.Fatalf("error %v, want %q", err, want)
		}
		if _, ok := r.Module("good"); ok {
			t.Fatal("module refused by OnLoad is loaded")
		}
		select {
		case <-seen.pool.drained:
		case <-time.After(5 * time.Second):
			t.Fatal("refused module's instances were not closed")
		}
	})
}

func TestLimitsFor(t *testing.T) {
	r := &Runtime{cfg: Config{
		Limits:    Limits{CallTimeout: time.Second, PoolSize: 3},
		Overrides: map[string]Limits{"slow": {CallTimeout: time.Minute, IdleMemoryPages: 7}},
	}}
	tests := []struct {
		module string
		want   Limits
	}{
		{"any", Limits{CallTimeout: time.Second, MemoryPages: DefaultMemoryPages, PoolSize: 3, AcquireTimeout: DefaultAcquireTimeout, IdleMemoryPages: DefaultIdleMemoryPages}},
		{"slow", Limits{CallTimeout: time.Minute, MemoryPages: DefaultMemoryPages, PoolSize: 3, AcquireTimeout: DefaultAcquireTimeout, IdleMemoryPages: 7}},
	}
	for _, tt := range tests {
		if got := r.limitsFor(tt.module); got != tt.want {
			t.Errorf("limitsFor(%q) = %+v, want %+v", tt.module, got, tt.want)
		}
	}
}

// A module importing a host call the host cannot serve (device-mapper
// calls on a kernel without it) is refused before any of its code runs:
// OnLoad, where the host runs configure, never sees it. Calls it does not
// import do not matter.
func TestUnavailableHostCallRefusesModule(t *testing.T) {
	missing := errors.New("no such kernel feature")
	t.Run("imported", func(t *testing.T) {
		asked, configured := 0, false
		r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
			f := c.HostCalls["test_echo"]
			f.Available = func() error { asked++; return missing }
			c.HostCalls["test_echo"] = f
			c.OnLoad = func(context.Context, *Module) error { configured = true; return nil }
		})
		err := errs["good"]
		if err == nil || !errors.Is(err, missing) || !strings.Contains(err.Error(), `host call family "test" is not available`) {
			t.Fatalf("error %v, want the family's reason", err)
		}
		if configured {
			t.Fatal("OnLoad (configure) ran for a module whose host calls are not available")
		}
		if asked != 1 {
			t.Fatalf("Available asked %d times, want once", asked)
		}
		if _, ok := r.Module("good"); ok {
			t.Fatal("module is loaded")
		}
	})
	t.Run("not imported", func(t *testing.T) {
		r, errs := startRuntime(t, map[string]string{"good": "good"}, nil, func(c *Config) {
			c.HostCalls["other_call"] = hostcalls.Func{Name: "other_call", Family: "other", Available: func() error { return missing },
				Call: func(context.Context, *hostcalls.Env, []byte) ([]byte, error) { return nil, nil }}
			f := c.HostCalls["test_echo"]
			f.Available = func() error { return nil }
			c.HostCalls["test_echo"] = f
		})
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		mustModule(t, r, "good")
	})
}
