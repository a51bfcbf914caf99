package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePkg writes files into a new temporary package directory.
func writePkg(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestGenerationErrors: every unsupported declaration is an error naming
// file:line, and all of them are reported at once.
func TestGenerationErrors(t *testing.T) {
	cases := []struct {
		name string
		src  string // the body after "package p", starting on line 2
		want []string
	}{
		{"unsupported scalar", "type M struct {\n\tX float64 `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type float64"}},
		{"plain int", "type M struct {\n\tX int `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type int"}},
		{"map of other types", "type M struct {\n\tX map[string]int `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type map[string]int"}},
		{"type of another package", "import \"time\"\ntype M struct {\n\tX time.Duration `wire:\"1\"`\n}", []string{"m.go:4: M.X: unsupported type time.Duration"}},
		{"pointer to a non-message", "type M struct {\n\tX *string `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type *string"}},
		{"slice of pointers to non-messages", "type M struct {\n\tX []*int64 `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type []*int64"}},
		{"array", "type M struct {\n\tX [4]byte `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type [4]byte"}},
		{"slice of bools", "type M struct {\n\tX []bool `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type []bool"}},
		{"struct without tags", "type S struct{ A int }\ntype M struct {\n\tX S `wire:\"1\"`\n}", []string{"m.go:4: M.X: unsupported type S"}},
		{"named non-integer slice", "type N float32\ntype M struct {\n\tX []N `wire:\"1\"`\n}", []string{"m.go:4: M.X: unsupported type []N"}},
		{"undeclared type", "type M struct {\n\tX Missing `wire:\"1\"`\n}", []string{"m.go:3: M.X: unsupported type Missing"}},
		{"duplicate number", "type M struct {\n\tA string `wire:\"1\"`\n\tB string `wire:\"1\"`\n}", []string{"m.go:4: M.B: duplicate field number 1 (also at"}},
		{"duplicate number in one declaration", "type M struct {\n\tA, B string `wire:\"2\"`\n}", []string{"m.go:3: M.B: duplicate field number 2"}},
		{"field number zero", "type M struct {\n\tA string `wire:\"0\"`\n}", []string{"m.go:3: M.A: wire tag \"0\" is not a field number"}},
		{"field number too large", "type M struct {\n\tA string `wire:\"536870912\"`\n}", []string{"m.go:3: M.A: wire tag \"536870912\" is not a field number"}},
		{"field number not a number", "type M struct {\n\tA string `wire:\"one\"`\n}", []string{"m.go:3: M.A: wire tag \"one\" is not a field number"}},
		{"untagged field in a message", "type M struct {\n\tA string `wire:\"1\"`\n\tB string\n}", []string{"m.go:4: M.B: no wire tag"}},
		{"embedded field", "type E struct{}\ntype M struct {\n\tA string `wire:\"1\"`\n\tE\n}", []string{"m.go:5: M: embedded field E is not supported"}},
		{"generic message", "type M[T any] struct {\n\tA string `wire:\"1\"`\n}", []string{"m.go:2: M: a message cannot be an alias or generic"}},
		{"message named like a local", "type m struct {\n\tA string `wire:\"1\"`\n}", []string{"m.go:2: message type name m clashes"}},
		{"field type named like a local", "type v int32\ntype M struct {\n\tA v `wire:\"1\"`\n}", []string{"m.go:4: M.A: type name v clashes"}},
		{"package-level wire", "var wire = 1\ntype M struct {\n\tA string `wire:\"1\"`\n}", []string{"m.go:2: package-level name wire clashes"}},
		{"all errors at once", "type M struct {\n\tA float32 `wire:\"1\"`\n\tB string\n}\ntype N struct {\n\tC uint8 `wire:\"1\"`\n}",
			[]string{"m.go:3: M.A: unsupported type float32", "m.go:4: M.B: no wire tag", "m.go:7: N.C: unsupported type uint8"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writePkg(t, map[string]string{"m.go": "package p\n" + tc.src + "\n"})
			_, err := Generate(dir, Options{})
			if err == nil {
				t.Fatal("no error")
			}
			msg := strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), "")
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestSupportedDeclarationsGenerate(t *testing.T) {
	cases := []struct {
		name, src, want string
	}{
		{"named string", "type L string\ntype M struct {\n\tX L `wire:\"1\"`\n}", "wire.AppendString(b, 1, string(m.X))"},
		{"bytes as []uint8", "type M struct {\n\tX []uint8 `wire:\"1\"`\n}", "wire.AppendBytes(b, 1, m.X)"},
		{"named type over named type", "type A uint64\ntype B A\ntype M struct {\n\tX B `wire:\"1\"`\n}", "m.X = B(v)"},
		{"message declared in another file", "type M struct {\n\tX *Other `wire:\"1\"`\n}", "m.X = new(Other)"},
		{"unexported message and field", "type msg struct {\n\tx int64 `wire:\"1\"`\n}", "func (m *msg) AppendWire"},
		{"excluded field only", "type M struct {\n\tX float64 `wire:\"-\"`\n}", "func (m *M) AppendWire(b []byte) []byte {\n\treturn b\n}"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writePkg(t, map[string]string{
				"m.go":     "package p\n" + tc.src + "\n",
				"other.go": "package p\n\ntype Other struct {\n\tY string `wire:\"1\"`\n}\n",
			})
			out, err := Generate(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := string(out.Files["m_wire.go"]); !strings.Contains(got, tc.want) {
				t.Fatalf("m_wire.go does not contain %q:\n%s", tc.want, got)
			}
		})
	}
}

func TestFilesSkipped(t *testing.T) {
	msg := "type M struct {\n\tX string `wire:\"1\"`\n}\n"
	dir := writePkg(t, map[string]string{
		"a.go":      "package p\n",
		"m_test.go": "package p\n" + msg,
		"gen.go":    "// Code generated by othertool. DO NOT EDIT.\n\npackage p\n" + msg,
		"tool.go":   "//go:build ignore\n\npackage main\n" + msg,
	})
	out, err := Generate(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Files) != 0 || len(out.Stale) != 0 {
		t.Fatalf("generated %v, stale %v; want nothing", sortedKeys(out.Files), out.Stale)
	}
}

func TestMixedPackagesAreAnError(t *testing.T) {
	dir := writePkg(t, map[string]string{"a.go": "package a\n", "b.go": "package b\n"})
	if _, err := Generate(dir, Options{}); err == nil || !strings.Contains(err.Error(), "package") {
		t.Fatalf("got %v, want an error about mixed packages", err)
	}
}

// TestRunWritesAndRemoves drives the command as go generate does: it writes
// X_wire.go, leaves an unchanged file alone, removes its own stale files and
// never touches files it did not generate.
func TestRunWritesAndRemoves(t *testing.T) {
	msg := "package p\n\ntype M struct {\n\tX string `wire:\"1\"`\n}\n"
	handWritten := "package p\n\n// hand-written, not generated\n"
	dir := writePkg(t, map[string]string{"m.go": msg, "n.go": msg[:10] + "type N struct {\n\tY int64 `wire:\"1\"`\n}\n", "x_wire.go": handWritten})
	var stderr bytes.Buffer
	if err := run([]string{dir}, &stderr); err != nil {
		t.Fatalf("run: %v %s", err, stderr.String())
	}
	for _, name := range []string{"m_wire.go", "n_wire.go"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("%s not written: %v", name, err)
		}
	}
	// A second run is a no-op: the file keeps its modification time.
	old := mtime(t, filepath.Join(dir, "m_wire.go"))
	if err := os.Chtimes(filepath.Join(dir, "m_wire.go"), old.Add(-time.Hour), old.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{dir}, &stderr); err != nil {
		t.Fatal(err)
	}
	if got := mtime(t, filepath.Join(dir, "m_wire.go")); !got.Equal(old.Add(-time.Hour)) {
		t.Fatal("unchanged generated file was rewritten")
	}
	// N loses its messages: n_wire.go is stale and removed.
	if err := os.WriteFile(filepath.Join(dir, "n.go"), []byte("package p\n\ntype N int\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{dir}, &stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "n_wire.go")); !os.IsNotExist(err) {
		t.Fatalf("stale n_wire.go not removed: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "x_wire.go")); err != nil || string(got) != handWritten {
		t.Fatalf("hand-written x_wire.go changed: %v %q", err, got)
	}
	// A hand-written file in the way of a generated one is an error, not overwritten.
	if err := os.WriteFile(filepath.Join(dir, "m.go"), []byte("package p\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(msg), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run([]string{dir}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "not generated by wiregen") {
		t.Fatalf("got %v, want a refusal to overwrite x_wire.go", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "x_wire.go")); string(got) != handWritten {
		t.Fatal("hand-written x_wire.go was overwritten")
	}
}

func TestRunUsage(t *testing.T) {
	var stderr bytes.Buffer
	if err := run([]string{"a", "b"}, &stderr); err == nil {
		t.Fatal("two directories accepted")
	}
	if err := run([]string{filepath.Join(t.TempDir(), "missing")}, &stderr); err == nil {
		t.Fatal("missing directory accepted")
	}
}

func mtime(t *testing.T, path string) time.Time {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.ModTime()
}

// TestBrokenGeneratedFileIsReplaced: an old generated file that no longer
// parses does not stop regeneration.
func TestBrokenGeneratedFileIsReplaced(t *testing.T) {
	dir := writePkg(t, map[string]string{
		"m.go":      "package p\n\ntype M struct {\n\tX string `wire:\"1\"`\n}\n",
		"m_wire.go": header + "\n\npackage p\n\nfunc broken( {\n",
		"o_wire.go": header + "\n\npackage p\n\nfunc alsoBroken( {\n",
	})
	if err := run([]string{dir}, new(bytes.Buffer)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "m_wire.go"))
	if err != nil || !strings.Contains(string(got), "func (m *M) AppendWire") {
		t.Fatalf("m_wire.go not regenerated: %v\n%s", err, got)
	}
	if _, err := os.Stat(filepath.Join(dir, "o_wire.go")); !os.IsNotExist(err) {
		t.Fatalf("stale broken o_wire.go not removed: %v", err)
	}
}
