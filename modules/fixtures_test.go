package modules

// The fixtures are hand-written .wat files built with wat2wasm (Debian: wabt).
//go:generate wat2wasm testdata/badcore.wat -o testdata/badcore.wasm
//go:generate wat2wasm testdata/badsig.wat -o testdata/badsig.wasm
//go:generate wat2wasm testdata/badversion.wat -o testdata/badversion.wasm
//go:generate wat2wasm testdata/bigmin.wat -o testdata/bigmin.wasm
//go:generate wat2wasm testdata/flood.wat -o testdata/flood.wasm
//go:generate wat2wasm testdata/garbage.wat -o testdata/garbage.wasm
//go:generate wat2wasm testdata/good.wat -o testdata/good.wasm
//go:generate wat2wasm testdata/hugemax.wat -o testdata/hugemax.wasm
//go:generate wat2wasm testdata/loop.wat -o testdata/loop.wasm
//go:generate wat2wasm testdata/noinfo.wat -o testdata/noinfo.wasm
//go:generate wat2wasm testdata/nomemory.wat -o testdata/nomemory.wasm
//go:generate wat2wasm testdata/trap.wat -o testdata/trap.wasm
//go:generate wat2wasm testdata/ungranted.wat -o testdata/ungranted.wasm
//go:generate wat2wasm testdata/unknownimport.wat -o testdata/unknownimport.wasm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFixturesMatchWat rebuilds every testdata/*.wat with wat2wasm and
// checks that the committed .wasm is what it produces.
func TestFixturesMatchWat(t *testing.T) {
	wat2wasm, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Skip("needs wat2wasm (Debian package wabt) to rebuild the fixtures: ", err)
	}
	wats, err := filepath.Glob(filepath.Join("testdata", "*.wat"))
	if err != nil || len(wats) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	self, err := os.ReadFile("fixtures_test.go")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	for _, wat := range wats {
		name := strings.TrimSuffix(filepath.Base(wat), ".wat")
		t.Run(name, func(t *testing.T) {
			directive := "//go:generate wat2wasm " + wat + " -o testdata/" + name + ".wasm\n"
			if !bytes.Contains(self, []byte(directive)) {
				t.Errorf("fixtures_test.go lacks %q", directive)
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
				t.Fatalf("committed fixture: %v (run go generate)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("testdata/%s.wasm is stale: run go generate ./modules", name)
			}
		})
	}
}
