package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// HostCall is one declared host call.
type HostCall struct {
	Const   string   // HostCallLoopFind
	Name    string   // loop_find, the import name
	Family  string   // loop, the grant (the file's hc_<family>.go)
	Doc     []string // the constant's doc comment, without "// "
	Req     string   // LoopFileRequest, or Empty
	Resp    string   // LoopFindResponse, or Empty
	Params  []Param  // the wrapper's parameters when the request is spread
	Field   *Param   // the response field the wrapper answers, if one
	Wrapper string   // LoopFind
	Raw     string   // loopFind, the import's adaptor
	pos     string
}

// Param is a request field the wrapper takes as a parameter, or the
// response field it answers.
type Param struct {
	Name  string // parameter name
	Field string // field of the message
	Type  string // Go type as the SDK writes it
}

// decl is "Req -> Resp", "Req{a, b} -> Resp.Field".
var decl = regexp.MustCompile(`^(\w+)(?:\{([\w, ]*)\})? -> (\w+)(?:\.(\w+))?$`)

// Load reads the HostCall* constants of dir's hc_*.go files, in file and
// declaration order.
func Load(dir string) ([]*HostCall, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	structs := map[string][]*ast.Field{}
	var hcFiles []*ast.File
	var hcFamilies []string
	for _, name := range names {
		base := filepath.Base(name)
		if strings.HasSuffix(base, "_test.go") || strings.HasSuffix(base, "_wire.go") || strings.HasSuffix(base, "_gen.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				if st, ok := ts.Type.(*ast.StructType); ok {
					structs[ts.Name.Name] = st.Fields.List
				}
			}
		}
		if fam, ok := strings.CutPrefix(base, "hc_"); ok {
			hcFiles = append(hcFiles, f)
			hcFamilies = append(hcFamilies, strings.TrimSuffix(fam, ".go"))
		}
	}
	var calls []*HostCall
	var errs []string
	seen := map[string]string{}
	for i, f := range hcFiles {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				if len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "HostCall") {
					continue
				}
				hc, err := parseCall(fset, vs, hcFamilies[i], structs)
				if err != nil {
					errs = append(errs, err.Error())
					continue
				}
				if prev, dup := seen[hc.Name]; dup {
					errs = append(errs, fmt.Sprintf("%s: host call %q also declared at %s", hc.pos, hc.Name, prev))
					continue
				}
				seen[hc.Name] = hc.pos
				calls = append(calls, hc)
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	if len(calls) == 0 {
		return nil, fmt.Errorf("%s: no HostCall constants in hc_*.go", dir)
	}
	return calls, nil
}

func parseCall(fset *token.FileSet, vs *ast.ValueSpec, family string, structs map[string][]*ast.Field) (*HostCall, error) {
	c := &HostCall{Const: vs.Names[0].Name, Family: family, pos: fset.Position(vs.Pos()).String()}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%s: %s: %s", c.pos, c.Const, fmt.Sprintf(format, a...))
	}
	lit, ok := vs.Values[0].(*ast.BasicLit)
	if len(vs.Values) != 1 || !ok || lit.Kind != token.STRING {
		return nil, fail("the value must be a string literal")
	}
	c.Name, _ = strconv.Unquote(lit.Value)
	if !strings.HasPrefix(c.Name, family+"_") {
		return nil, fail("%q is not named <family>_<verb> after its file's family %q", c.Name, family)
	}
	c.Wrapper = strings.TrimPrefix(c.Const, "HostCall")
	if c.Wrapper != camel(c.Name) {
		return nil, fail("constant name does not match %q (want HostCall%s)", c.Name, camel(c.Name))
	}
	r := []rune(c.Wrapper)
	r[0] = unicode.ToLower(r[0])
	c.Raw = string(r)
	if vs.Doc == nil {
		return nil, fail("no doc comment (it documents the SDK wrapper too)")
	}
	for _, l := range vs.Doc.List {
		c.Doc = append(c.Doc, strings.TrimPrefix(strings.TrimPrefix(l.Text, "//"), " "))
	}
	if !strings.HasPrefix(c.Doc[0], c.Const+" ") {
		return nil, fail("doc comment must start with %q", c.Const)
	}
	if vs.Comment == nil || len(vs.Comment.List) != 1 {
		return nil, fail(`want a trailing comment "Request -> Response"`)
	}
	m := decl.FindStringSubmatch(strings.TrimSpace(strings.TrimPrefix(vs.Comment.List[0].Text, "//")))
	if m == nil {
		return nil, fail(`trailing comment %q is not "Req[{params}] -> Resp[.Field]"`, vs.Comment.List[0].Text)
	}
	c.Req, c.Resp = m[1], m[3]
	for _, t := range []string{c.Req, c.Resp} {
		if _, ok := structs[t]; !ok {
			return nil, fail("%s is not a message of package abi", t)
		}
	}
	if m[2] != "" {
		fields := flatten(structs[c.Req])
		params := strings.Split(m[2], ",")
		if len(params) != len(fields) {
			return nil, fail("%s has %d fields, the declaration names %d parameters", c.Req, len(fields), len(params))
		}
		for i, p := range params {
			c.Params = append(c.Params, Param{Name: strings.TrimSpace(p), Field: fields[i].Name, Type: fields[i].Type})
		}
	}
	if m[4] != "" {
		for _, f := range flatten(structs[c.Resp]) {
			if f.Name == m[4] {
				c.Field = &f
			}
		}
		if c.Field == nil {
			return nil, fail("%s has no field %s", c.Resp, m[4])
		}
	}
	return c, nil
}

// flatten lists a struct's fields with their types as the SDK spells them.
func flatten(list []*ast.Field) []Param {
	var out []Param
	for _, f := range list {
		for _, n := range f.Names {
			out = append(out, Param{Field: n.Name, Name: n.Name, Type: qualify(f.Type)})
		}
	}
	return out
}

// qualify writes a field type of package abi as seen from another package.
func qualify(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		if ast.IsExported(t.Name) {
			return "abi." + t.Name
		}
		return t.Name
	case *ast.ArrayType:
		return "[]" + qualify(t.Elt)
	case *ast.StarExpr:
		return "*" + qualify(t.X)
	case *ast.MapType:
		return "map[" + qualify(t.Key) + "]" + qualify(t.Value)
	}
	return fmt.Sprintf("%T", e)
}

// camel turns "dm_thin_create" into "DmThinCreate".
func camel(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(s, "_") {
		if w == "" {
			continue
		}
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}
