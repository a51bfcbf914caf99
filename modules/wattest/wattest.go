// Package wattest checks hand-written .wat test fixtures against their
// committed .wasm builds, for any package that keeps such fixtures under
// testdata/ (the habit that lets error paths be tested without a compiler).
// It is for tests only.
package wattest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// CheckFixtures rebuilds every testdata/*.wat of the calling package with
// wat2wasm and fails when a committed .wasm differs or when generateFile
// (the file holding the //go:generate lines) lacks the line that rebuilds
// it. pkg names the package in the advice ("go generate ./host"). It skips,
// saying why, where wat2wasm (Debian package wabt) is missing.
func CheckFixtures(t *testing.T, generateFile, pkg string) {
	t.Helper()
	wat2wasm, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Skip("needs wat2wasm (Debian package wabt) to rebuild the fixtures: ", err)
	}
	wats, err := filepath.Glob(filepath.Join("testdata", "*.wat"))
	if err != nil || len(wats) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	self, err := os.ReadFile(generateFile)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	for _, wat := range wats {
		name := strings.TrimSuffix(filepath.Base(wat), ".wat")
		t.Run(name, func(t *testing.T) {
			directive := "//go:generate wat2wasm " + wat + " -o testdata/" + name + ".wasm\n"
			if !bytes.Contains(self, []byte(directive)) {
				t.Errorf("%s lacks %q", generateFile, directive)
			}
			built := filepath.Join(out, name+".wasm")
			if msg, err := exec.Command(wat2wasm, wat, "-o", built).CombinedOutput(); err != nil {
				t.Fatalf("wat2wasm %s: %v\n%s", wat, err, msg)
			}
			want, err := os.ReadFile(built)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join("testdata", name+".wasm"))
			if err != nil {
				t.Fatalf("committed fixture: %v (run go generate %s)", err, pkg)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("testdata/%s.wasm is stale: run go generate %s", name, pkg)
			}
		})
	}
}
