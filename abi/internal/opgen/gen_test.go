package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi/internal/gencheck"
)

const (
	abiDir = "../.."
	sdkDir = "../../../sdk"
)

// TestUpToDate fails when a generated file is not what the generator makes
// of the current declarations.
func TestUpToDate(t *testing.T) {
	files, err := Generate(abiDir, sdkDir)
	if err != nil {
		t.Fatal(err)
	}
	gencheck.UpToDate(t, files)
}

// TestDocsAgree checks ABI.md's table of operations (export, request and
// response) and the authoring guide's table of sdk interfaces (methods and
// operations) against the declarations.
func TestDocsAgree(t *testing.T) {
	ops, err := Load(abiDir, sdkDir)
	if err != nil {
		t.Fatal(err)
	}
	msg := func(m string) string {
		if m == "Empty" {
			return m
		}
		return "`" + m + "`"
	}
	var want, got []string
	for _, op := range ops {
		want = append(want, "| `"+op.Name+"` | "+msg(op.Req)+" → "+msg(op.Resp)+" |")
	}
	row := regexp.MustCompile("^(\\| `\\w+` \\| [^|]* → [^|]* \\|)")
	for _, l := range gencheck.Lines(t, filepath.Join(abiDir, "ABI.md")) {
		if m := row.FindStringSubmatch(l); m != nil {
			got = append(got, m[1])
		}
	}
	slices.Sort(got) // the table keeps a reading order of its own
	slices.Sort(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("ABI.md's operations table:\n%s\nthe declarations say:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	type iface struct{ methods, ops []string }
	wantIfaces := map[string]*iface{}
	var order []string
	for _, op := range ops {
		if wantIfaces[op.Iface] == nil {
			wantIfaces[op.Iface] = &iface{}
			order = append(order, op.Iface)
		}
		wantIfaces[op.Iface].methods = append(wantIfaces[op.Iface].methods, op.Method)
		wantIfaces[op.Iface].ops = append(wantIfaces[op.Iface].ops, op.Name)
	}
	cells := regexp.MustCompile("^\\| `(\\w+)`[^|]* \\| ([^|]*) \\| ([^|]*) \\|")
	seen := map[string]bool{}
	for _, l := range gencheck.Table(t, filepath.Join(abiDir, "..", "docs", "authoring.md"), "| interface | methods | operations") {
		m := cells.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		w := wantIfaces[m[1]]
		if w == nil {
			t.Errorf("authoring.md: interface %s has no operation", m[1])
			continue
		}
		seen[m[1]] = true
		// The table lists Backend's Info first, as a module author
		// writes it; compare as sets.
		methods, ops := gencheck.Ticked(m[2]), gencheck.Ticked(m[3])
		if !sameSet(methods, w.methods) || !sameSet(ops, w.ops) {
			t.Errorf("authoring.md: %s: methods %v, operations %v; declared %v, %v", m[1], methods, ops, w.methods, w.ops)
		}
	}
	for _, name := range order {
		if !seen[name] {
			t.Errorf("authoring.md: no row for %s", name)
		}
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}

// TestBadDeclarations: an operation without a method, a method without an
// operation, or a signature Dispatch cannot serve is an error, never a guess.
func TestBadDeclarations(t *testing.T) {
	const ops = "package abi\n\ntype Op string\n\nconst (\n\tOpInfo Op = \"backend_info\"\n\tOpDo Op = \"do_it\"\n)\n"
	for _, tc := range []struct{ name, sdk, want string }{
		{"good", "type B interface {\n\tInfo() abi.BackendInfo\n}\ntype D interface {\n\tDoIt(req *abi.X) (*abi.Y, error)\n}\n", ""},
		{"operation without a method", "type B interface {\n\tInfo() abi.BackendInfo\n}\n", "operation do_it: no sdk interface declares a method DoIt"},
		{"method without an operation", "type B interface {\n\tInfo() abi.BackendInfo\n\tDoIt() error\n\tUndo() error\n}\n", "B.Undo: no Op constant"},
		{"two arguments", "type B interface {\n\tInfo() abi.BackendInfo\n\tDoIt(a, b *abi.X) error\n}\n", "B.DoIt: want"},
		{"not a message", "type B interface {\n\tInfo() abi.BackendInfo\n\tDoIt(s string) error\n}\n", "B.DoIt: want"},
		{"no error", "type B interface {\n\tInfo() abi.BackendInfo\n\tDoIt() *abi.Y\n}\n", "B.DoIt: want"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, s := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(a, "names.go"), []byte(ops), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s, "sdk.go"), []byte("package sdk\n\nimport \"x/abi\"\n\n"+tc.sdk), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := Load(a, s)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "":
				if len(got) != 2 || got[1].Iface != "D" || got[1].Req != "X" || got[1].Resp != "Y" || !got[1].ReqArg {
					t.Errorf("parsed %+v", got[1])
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}
