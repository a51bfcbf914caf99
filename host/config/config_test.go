package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestDefaults(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.DriverName != "wasmcsi.dev" || c.Role != RoleAll || c.Limits.CallTimeout != 10*time.Second || c.GroupSnapshot.FreezeTimeout != 10*time.Second {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.MemoryBudgetPages != 16384 || c.Limits.IdleMemoryPages != 512 {
		t.Fatalf("memory defaults: budget %d pages, idle %d pages", c.MemoryBudgetPages, c.Limits.IdleMemoryPages)
	}
	if !filepath.IsAbs(c.SocketPath()) || !strings.HasSuffix(c.SocketPath(), "run/csi.sock") {
		t.Fatalf("endpoint not absolute: %s", c.Endpoint)
	}
	ld, ok := c.Modules["localdir"]
	if !ok || len(ld.Roots) != 1 || !filepath.IsAbs(ld.Roots[0]) {
		t.Fatalf("localdir grant: %+v", ld)
	}
}

func TestLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("driver_name: from.file\nrole: controller\nlimits:\n  pool_size: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	Flags(fs)
	if err := fs.Parse([]string{"--config", file, "--role", "node"}); err != nil {
		t.Fatal(err)
	}
	env := []string{"WASMCSI_LIMITS__CALL_TIMEOUT=3s", "WASMCSI_DRIVER_NAME=from.env", "CSI_ENDPOINT=unix:///tmp/x/csi.sock"}
	c, err := Load(fs, env)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ what, got, want string }{
		{"driver from env over file", c.DriverName, "from.env"},
		{"role from flag over file", c.Role, RoleNode},
		{"endpoint from CSI_ENDPOINT", c.Endpoint, "unix:///tmp/x/csi.sock"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %q want %q", tc.what, tc.got, tc.want)
		}
	}
	if c.Limits.PoolSize != 7 || c.Limits.CallTimeout != 3*time.Second {
		t.Errorf("limits: %+v", c.Limits)
	}
}

func TestInvalid(t *testing.T) {
	for _, env := range [][]string{
		{"WASMCSI_ROLE=boss"},
		{"CSI_ENDPOINT=tcp://127.0.0.1:1"},
		{"WASMCSI_LIMITS__POOL_SIZE=0"},
		{"WASMCSI_GROUP_SNAPSHOT__FREEZE_TIMEOUT=0s"},
		{"WASMCSI_LIMITS__IDLE_MEMORY_PAGES=0"},
		{"WASMCSI_MEMORY_BUDGET_PAGES=0"},
	} {
		if _, err := Load(nil, env); err == nil {
			t.Errorf("%v: want error", env)
		}
	}
}

func TestRootsKeepPortalsAndPrefixes(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Modules = map[string]Module{"x": {Roots: []string{"wasmcsi-", "127.0.0.1:3260", "[fd00::1]:3260", "192.0.2.0/24", "fd00::/64", "192.0.2.5:/srv/nfs", "rel/pool", "/abs/pool"}}}
	if err := c.normalize(); err != nil {
		t.Fatal(err)
	}
	got := c.Modules["x"].Roots
	for i, want := range []string{"wasmcsi-", "127.0.0.1:3260", "[fd00::1]:3260", "192.0.2.0/24", "fd00::/64", "192.0.2.5:/srv/nfs"} {
		if got[i] != want {
			t.Errorf("root %q became %q", want, got[i])
		}
	}
	if !filepath.IsAbs(got[6]) || got[7] != "/abs/pool" {
		t.Errorf("path roots: %v", got[6:])
	}
}

// A file that lists modules replaces the embedded list.
func TestFileModulesReplaceDefaults(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("modules:\n  localdir:\n    hostcalls: [dir]\n    roots: [/srv/pool]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	Flags(fs)
	if err := fs.Parse([]string{"--config", file}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(fs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Modules) != 1 || len(c.Modules["localdir"].Roots) != 1 || c.Modules["localdir"].Roots[0] != "/srv/pool" {
		t.Fatalf("modules: %+v", c.Modules)
	}
}

// An OCI source needs oci:// and a key; key paths are made absolute.
func TestOCISources(t *testing.T) {
	for _, tc := range []struct {
		mod  Module
		key  string
		want string // "" when valid
	}{
		{Module{Source: "oci://r.example/m:1"}, "keys/cosign.pub", ""},
		{Module{Source: "oci://r.example/m:1", Key: "own.pub"}, "", ""},
		{Module{Source: "oci://r.example/m:1"}, "", "names the public key"},
		{Module{Source: "r.example/m:1"}, "k.pub", "want oci://"},
	} {
		c, err := Load(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Modules = map[string]Module{"m": tc.mod}
		c.OCI.Key = tc.key
		err = c.normalize()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v, key %q: %v", tc.mod, tc.key, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v, key %q: %v, want %q", tc.mod, tc.key, err, tc.want)
		case err == nil && (!filepath.IsAbs(c.Modules["m"].Key) && c.Modules["m"].Key != "" || !filepath.IsAbs(c.OCI.Key) && c.OCI.Key != ""):
			t.Errorf("key paths not absolute: %q, %q", c.Modules["m"].Key, c.OCI.Key)
		}
	}
	if c, err := Load(nil, []string{"WASMCSI_OCI__INTERVAL=0s"}); err != nil || c.OCI.Interval != 0 {
		t.Errorf("a zero interval without OCI modules: %v", err)
	}
	c, _ := Load(nil, nil)
	c.Modules = map[string]Module{"m": {Source: "oci://r.example/m:1", Key: "k.pub"}}
	c.OCI.Interval = 0
	if err := c.normalize(); err == nil || !strings.Contains(err.Error(), "oci.interval") {
		t.Errorf("OCI modules with a zero interval: %v", err)
	}
}
