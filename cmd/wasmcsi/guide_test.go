package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestGuideFirstTenMinutes runs the commands of docs/authoring.md's "The
// first ten minutes" verbatim, one at a time, in a temporary folder outside
// the repository that holds the source tree as wasmcsi/, with this tree's
// wasmcsi on PATH, and logs how long each took.
func TestGuideFirstTenMinutes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: scaffolds, builds and tests a module with both toolchains")
	}
	tinygo := os.Getenv("WASMCSI_TINYGO")
	if tinygo == "" {
		tinygo, _ = exec.LookPath("tinygo")
	}
	if tinygo == "" {
		if os.Getenv("WASMCSI_REQUIRE_TINYGO") != "" {
			t.Fatal("TinyGo required (WASMCSI_REQUIRE_TINYGO) but not found: set WASMCSI_TINYGO")
		}
		t.Skip("needs TinyGo for the guide's make tinygo: set WASMCSI_TINYGO (make tinygo prints it)")
	}
	guide, err := os.ReadFile("../../docs/authoring.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## The first ten minutes\n.*?```sh\n(.*?)```").FindSubmatch(guide)
	if m == nil {
		t.Fatal("docs/authoring.md has no commands under \"The first ten minutes\"")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "bin")
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "wasmcsi"), ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build wasmcsi: %v\n%s", err, out)
	}
	work := filepath.Join(tmp, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, filepath.Join(work, "wasmcsi")); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"), "WASMCSI_TINYGO=" + tinygo}
	for _, kv := range os.Environ() {
		// The surrounding test run's settings must not leak in.
		if k, _, _ := strings.Cut(kv, "="); k != "PATH" && k != "GOFLAGS" && k != "GOWORK" && !strings.HasPrefix(k, "WASMCSI_") {
			env = append(env, kv)
		}
	}
	dir := work
	var outputs []string
	for _, line := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		if cd, ok := strings.CutPrefix(line, "cd "); ok {
			dir = filepath.Join(dir, cd)
			continue
		}
		start := time.Now()
		cmd := exec.Command("sh", "-ec", line)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		t.Logf("%-80s %6.1f s", line, time.Since(start).Seconds())
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		outputs = append(outputs, string(out))
	}
	// What each step must have shown.
	for _, want := range []string{
		`"LocalID": "v-`,                        // modules call: the answer as JSON
		"fake host: dir_create",                 // the fake host's log of the call
		"from:      its wasmcsi.module section", // make build wrote it
		"| `maxVolumes` | int | 0 | any | no |", // the declared parameter
		"quota 0.1.0 quota.wasm",                // modules: loaded with the grant
		"ops=backend_info,configure,create_volume,delete_volume,node_stage,node_unstage",
	} {
		if !strings.Contains(strings.Join(outputs, "\n"), want) {
			t.Errorf("the guide's commands did not print %q:\n%s", want, strings.Join(outputs, "\n"))
		}
	}
	for _, f := range []string{"quota.wasm", "quota.tinygo.wasm"} {
		if _, err := os.Stat(filepath.Join(work, "quota", f)); err != nil {
			t.Errorf("make did not write %s: %v", f, err)
		}
	}
}
