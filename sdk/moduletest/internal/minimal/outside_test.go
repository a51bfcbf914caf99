//go:build !wasip1

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// builtTest is the built-module test the outside folder gets besides this
// module's own native tests: Load with a fake host, as section 8 shows.
const builtTest = `package main

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

func TestBuilt(t *testing.T) {
	fake := &moduletest.FakeHost{}
	moduletest.HandleTyped(fake, "dir", abi.HostCallDirCreate, func(*abi.DirCreateRequest) (*abi.Empty, error) { return &abi.Empty{}, nil })
	moduletest.HandleTyped(fake, "dir", abi.HostCallDirRemove, func(*abi.DirRequest) (*abi.Empty, error) { return &abi.Empty{}, nil })
	m := moduletest.Load(t, moduletest.Build(t, ".", moduletest.Go), moduletest.Options{
		Name:  "quota",
		Grant: moduletest.Grant{HostCalls: []string{"dir"}, Roots: []string{"/pool"}},
		Host:  fake.Host(),
	})
	resp := &abi.CreateVolumeResponse{}
	if err := m.Call(abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "pvc-1"}, resp); err != nil || resp.LocalID == "" {
		t.Fatalf("create_volume: %+v, %v", resp, err)
	}
	if _, err := moduletest.TryLoad(t, moduletest.Build(t, ".", moduletest.Go), moduletest.Options{Name: "quota"}); err == nil {
		t.Fatal("loaded without the dir grant")
	}
}
`

// TestGuideGoModBuildsOutsideTheTree: a module in a folder outside the
// repository, with exactly the go.mod section 2 of the guide shows and a
// wasmcsi source tree at ../wasmcsi, tidies, builds as a wasip1 reactor and
// passes its native and built-module tests.
func TestGuideGoModBuildsOutsideTheTree(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a module outside the tree")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command: ", err)
	}
	m := regexp.MustCompile("(?s)```go\\.mod\n(.*?)```").FindStringSubmatch(readGuide(t))
	if m == nil {
		t.Fatal("the guide shows no go.mod")
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := os.Symlink(root, filepath.Join(tmp, "wasmcsi")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "quota")
	files := map[string]string{"go.mod": m[1], "built_test.go": builtTest}
	for _, f := range []string{"main.go", "main_test.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		// What the surrounding test run sets must not leak in: the
		// author's folder is built as they would build it.
		if !strings.HasPrefix(kv, "GOFLAGS=") && !strings.HasPrefix(kv, "WASMCSI_MODULE_DIR=") && !strings.HasPrefix(kv, "GOWORK=") {
			env = append(env, kv)
		}
	}
	run := func(extra []string, args ...string) {
		t.Helper()
		cmd := exec.Command(goCmd, args...)
		cmd.Dir, cmd.Env = dir, append(append([]string(nil), env...), extra...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(nil, "mod", "tidy")
	run([]string{"GOOS=wasip1", "GOARCH=wasm"}, "build", "-buildmode=c-shared", "-trimpath", "-o", "quota.wasm", ".")
	run(nil, "test", "-count=1", "./...")
}
