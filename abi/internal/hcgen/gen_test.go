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
	sdkDir = "../../../sdk/hostcall"
)

// TestUpToDate fails when a generated file is not what the generator makes
// of abi's current declarations.
func TestUpToDate(t *testing.T) {
	files, err := Generate(abiDir, sdkDir)
	if err != nil {
		t.Fatal(err)
	}
	gencheck.UpToDate(t, files)
}

// TestDocsAgree checks the family tables of ABI.md (import names) and
// docs/authoring.md (SDK functions) against the declarations.
func TestDocsAgree(t *testing.T) {
	calls, err := Load(abiDir)
	if err != nil {
		t.Fatal(err)
	}
	imports, wrappers := map[string][]string{}, map[string][]string{}
	for _, c := range calls {
		imports[c.Family] = append(imports[c.Family], c.Name)
		wrappers[c.Family] = append(wrappers[c.Family], c.Wrapper)
	}
	for doc, want := range map[string]map[string][]string{
		filepath.Join(abiDir, "ABI.md"):                     imports,
		filepath.Join(abiDir, "..", "docs", "authoring.md"): wrappers,
	} {
		got := familyTable(t, doc)
		for fam, names := range want {
			slices.Sort(names)
			if !slices.Equal(got[fam], names) {
				t.Errorf("%s: family %s lists %v, abi declares %v", doc, fam, got[fam], names)
			}
		}
		for fam := range got {
			if want[fam] == nil {
				t.Errorf("%s: family %s is not declared in abi", doc, fam)
			}
		}
	}
}

// familyTable reads the "| family | host calls ... |" table of a document.
func familyTable(t *testing.T, path string) map[string][]string {
	t.Helper()
	row := regexp.MustCompile("^\\| `(\\w+)` \\| ([^|]*) \\|")
	out := map[string][]string{}
	for _, l := range gencheck.Table(t, path, "| family | host calls") {
		if m := row.FindStringSubmatch(l); m != nil {
			out[m[1]] = append(out[m[1]], gencheck.Ticked(m[2])...)
			slices.Sort(out[m[1]])
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no family table", path)
	}
	return out
}

// TestBadDeclarations: a declaration the generator cannot honour exactly is
// an error naming it, never a guess.
func TestBadDeclarations(t *testing.T) {
	const msgs = "package abi\n\ntype Empty struct{}\ntype XRequest struct {\n\tPath string `wire:\"1\"`\n\tSize int64 `wire:\"2\"`\n}\ntype XResponse struct {\n\tOK bool `wire:\"1\"`\n}\n"
	for _, tc := range []struct{ name, decl, want string }{
		{"good", "// HostCallXDo does.\nHostCallXDo = \"x_do\" // XRequest{path, size} -> XResponse.OK", ""},
		{"no doc", "HostCallXDo = \"x_do\" // XRequest -> Empty", "no doc comment"},
		{"doc names another", "// Do does.\nHostCallXDo = \"x_do\" // XRequest -> Empty", "doc comment must start with"},
		{"no declaration", "// HostCallXDo does.\nHostCallXDo = \"x_do\"", "trailing comment"},
		{"unknown message", "// HostCallXDo does.\nHostCallXDo = \"x_do\" // YRequest -> Empty", "YRequest is not a message"},
		{"parameters miss a field", "// HostCallXDo does.\nHostCallXDo = \"x_do\" // XRequest{path} -> Empty", "has 2 fields, the declaration names 1"},
		{"unknown response field", "// HostCallXDo does.\nHostCallXDo = \"x_do\" // XRequest -> XResponse.Nope", "has no field Nope"},
		{"other family", "// HostCallYDo does.\nHostCallYDo = \"y_do\" // XRequest -> Empty", "after its file's family"},
		{"name and constant differ", "// HostCallXDone does.\nHostCallXDone = \"x_do\" // XRequest -> Empty", "want HostCallXDo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "m.go"), []byte(msgs), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "hc_x.go"), []byte("package abi\n\nconst (\n"+tc.decl+"\n)\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			calls, err := Load(dir)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "":
				c := calls[0]
				if c.Family != "x" || c.Wrapper != "XDo" || len(c.Params) != 2 || c.Params[1].Type != "int64" || c.Field == nil || c.Field.Type != "bool" {
					t.Errorf("parsed %+v", c)
				}
			case err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "hc_x.go:"):
				t.Errorf("error %v, want one naming hc_x.go and %q", err, tc.want)
			}
		})
	}
}
