package hostcall

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestImportsMatchABI keeps the three lists of host calls in step: the
// HostCall* names declared in abi, the wasip1 imports, and the native
// stand-ins.
func TestImportsMatchABI(t *testing.T) {
	var want []string
	files, _ := filepath.Glob("../../abi/hc_*.go")
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_wire.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok || len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "HostCall") || len(vs.Values) != 1 {
				return true
			}
			if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
				s, _ := strconv.Unquote(lit.Value)
				want = append(want, s)
			}
			return true
		})
	}
	if len(want) == 0 {
		t.Fatal("no HostCall names found in abi/hc_*.go")
	}
	src, err := os.ReadFile("imports_wasip1.go")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^//go:wasmimport wasmcsi (\w+)$`).FindAllStringSubmatch(string(src), -1) {
		got = append(got, m[1])
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		t.Errorf("wasip1 imports %v\nabi host calls  %v", got, want)
	}
	native, err := os.ReadFile("imports_native.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^func (\w+)\(`).FindAllStringSubmatch(string(src), -1) {
		if strings.HasSuffix(m[1], "Import") {
			continue
		}
		if !regexp.MustCompile(`\b` + m[1] + `\b`).Match(native) {
			t.Errorf("imports_native.go lacks %s", m[1])
		}
	}
}
