package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
)

func TestHelpListsCommands(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"serve", "--help"}} {
		var out bytes.Buffer
		if err := run(args, &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, want := range []string{"wasmcsi [serve]", "wasmcsi modules", "wasmcsi modules push", "wasmcsi modules keygen", "wasmcsi config", "wasmcsi version", "--config", "--module_dir"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v: help lacks %q:\n%s", args, want, out.String())
			}
		}
	}
}

// buildExample builds examples/<name> with standard Go into dir.
func buildExample(t *testing.T, dir, name string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", filepath.Join(dir, name+".wasm"), "../../examples/"+name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
}

// The embedded configuration, as make run starts it, on a machine without
// device-mapper: dmthin is left out with one warning naming what is
// missing, iscsi is not loaded (the defaults disable it), nothing is
// logged as an error, and localdir's load line says what it offers.
func TestDefaultConfigWithoutDeviceMapperLogsNoError(t *testing.T) {
	if _, err := os.Stat("/dev/mapper/control"); err == nil {
		t.Skip("this kernel has device-mapper: dmthin loads here")
	}
	if testing.Short() {
		t.Skip("-short: builds two example modules")
	}
	dir := t.TempDir()
	mods := filepath.Join(dir, "modules")
	if err := os.Mkdir(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	buildExample(t, mods, "dmthin")
	buildExample(t, mods, "iscsi")
	buildExample(t, mods, "localdir")
	cfg, err := config.Load(nil, []string{
		"WASMCSI_MODULE_DIR=" + mods,
		"WASMCSI_STATE_DIR=" + filepath.Join(dir, "state"),
		"WASMCSI_CACHE_DIR=",
	})
	if err != nil {
		t.Fatal(err)
	}
	// The default grants' relative roots are relative to the working folder.
	t.Chdir(dir)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := host.New(context.Background(), cfg, host.Options{Log: log, NoRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Reload(context.Background()) // a reload does not repeat the warning
	if err := srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var warns, loaded int
	for _, line := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(line, `msg="module loaded" module=localdir`):
			// What an operator reads: the file, the operations the module
			// offers (localdir attaches nothing), access modes by name.
			loaded++
			for _, want := range []string{"file=localdir.wasm", "create_volume", "node_stage", "SINGLE_NODE_WRITER"} {
				if !strings.Contains(line, want) {
					t.Errorf("load line lacks %q: %s", want, line)
				}
			}
			if strings.Contains(line, "controller_publish") {
				t.Errorf("load line lists an operation localdir does not offer: %s", line)
			}
		case strings.Contains(line, "level=ERROR"):
			t.Errorf("the default configuration logs an error: %s", line)
		case strings.Contains(line, "level=WARN") && strings.Contains(line, "module=dmthin"):
			warns++
			if !strings.Contains(line, "device-mapper") {
				t.Errorf("dmthin's warning does not name what is missing: %s", line)
			}
		}
	}
	if loaded != 1 {
		t.Errorf("%d load lines for localdir, want 1", loaded)
	}
	if warns != 1 {
		t.Errorf("%d warnings about dmthin, want 1:\n%s", warns, logs.String())
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}

func TestModulesNewAndCallRefuseBadArguments(t *testing.T) {
	t.Chdir(t.TempDir())
	var out bytes.Buffer
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"modules", "new", "Bad_Name"}, "must match"},
		{[]string{"modules", "new"}, "want one NAME"},
		{[]string{"modules", "call", "x.wasm", "frobnicate"}, `unknown operation "frobnicate"`},
		{[]string{"modules", "call", "x.wasm", "create_volume", `{"Nmae": "typo"}`}, `unknown field "Nmae"`},
		{[]string{"modules", "call", "x.wasm", "create_volume", "--real"}, "--real needs --hostcalls and --root"},
	} {
		err := run(tc.args, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	if err := run([]string{"modules", "new", "ok"}, &out); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"modules", "new", "ok"}, &out); err == nil {
		t.Error("modules new over an existing folder succeeded")
	}
	for _, f := range []string{"go.mod", "main.go", "main_test.go", "module_test.go", "config.yaml", "Makefile", "README.md"} {
		if _, err := os.Stat(filepath.Join("ok", f)); err != nil {
			t.Errorf("modules new did not write %s: %v", f, err)
		}
	}
}

// The description section round-trips, replaces an older one, and keeps
// every other section as it was.
func TestDescriptionSection(t *testing.T) {
	// A module with one custom section "name" (empty payload).
	mod := append([]byte("\x00asm\x01\x00\x00\x00"), 0, 5, 4, 'n', 'a', 'm', 'e')
	if _, found, err := readDescription(mod); err != nil || found {
		t.Fatalf("a module without the section: found %v, %v", found, err)
	}
	d1 := &abi.ModuleDescription{Name: "quota", Version: "0.1.0", ABIVersion: abi.Version, HostCallFamilies: []string{"dir"}}
	d2 := &abi.ModuleDescription{Name: "quota", Version: "0.2.0", DeclaresParameters: true,
		Parameters: []abi.ParameterSpec{{Name: "maxVolumes", Type: abi.ParamInt}}}
	once, err := writeDescription(mod, d1)
	if err != nil {
		t.Fatal(err)
	}
	twice, err := writeDescription(once, d2)
	if err != nil {
		t.Fatal(err)
	}
	got, found, err := readDescription(twice)
	if err != nil || !found || got.Version != "0.2.0" || len(got.Parameters) != 1 || got.Parameters[0].Name != "maxVolumes" {
		t.Fatalf("read back %+v, %v, %v", got, found, err)
	}
	secs, err := sections(twice)
	if err != nil || len(secs) != 2 || !bytes.Equal(secs[0], mod[8:]) {
		t.Errorf("sections %q, %v; want the original and one description", secs, err)
	}
	if _, err := sections([]byte("\x00asm\x01\x00\x00\x00\x00\x7f")); err == nil {
		t.Error("a truncated section was accepted")
	}
}
