package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Op is one declared operation.
type Op struct {
	Const  string // OpCreateVolume
	Name   string // create_volume, the export
	Iface  string // the sdk interface declaring its method: Backend
	Method string // CreateVolume
	Req    string // CreateVolumeRequest, or Empty when the method takes nothing
	Resp   string // CreateVolumeResponse, or Empty when it returns only an error
	ReqArg bool   // the method takes the request
}

// method is one method of an sdk interface.
type method struct {
	iface, name, pos string
	req, resp        string
	reqArg           bool
	used             bool
}

// Load reads the Op constants of abiDir and the interfaces of sdkDir.
func Load(abiDir, sdkDir string) ([]*Op, error) {
	fset := token.NewFileSet()
	var errs []string
	var ops []*Op
	for _, f := range parseDir(fset, abiDir, &errs) {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				if t, ok := vs.Type.(*ast.Ident); !ok || t.Name != "Op" {
					continue
				}
				for i, n := range vs.Names {
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						errs = append(errs, fmt.Sprintf("%s: %s: the value must be a string literal", fset.Position(n.Pos()), n.Name))
						continue
					}
					name, _ := strconv.Unquote(lit.Value)
					ops = append(ops, &Op{Const: n.Name, Name: name})
				}
			}
		}
	}
	methods := map[string]*method{}
	var order []*method
	for _, f := range parseDir(fset, sdkDir, &errs) {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				it, ok := ts.Type.(*ast.InterfaceType)
				if !ok || !ts.Name.IsExported() {
					continue
				}
				for _, f := range it.Methods.List {
					ft, ok := f.Type.(*ast.FuncType)
					if !ok || len(f.Names) != 1 {
						continue
					}
					m, err := parseMethod(fset, ts.Name.Name, f.Names[0].Name, ft)
					if err != nil {
						errs = append(errs, err.Error())
						continue
					}
					if prev, dup := methods[m.name]; dup {
						errs = append(errs, fmt.Sprintf("%s: method %s also declared by %s", m.pos, m.name, prev.iface))
						continue
					}
					methods[m.name] = m
					order = append(order, m)
				}
			}
		}
	}
	for _, op := range ops {
		op.Method = camel(op.Name)
		if op.Const == "OpInfo" {
			op.Method = "Info"
		}
		m := methods[op.Method]
		if m == nil {
			errs = append(errs, fmt.Sprintf("operation %s: no sdk interface declares a method %s", op.Name, op.Method))
			continue
		}
		m.used = true
		op.Iface, op.Req, op.Resp, op.ReqArg = m.iface, m.req, m.resp, m.reqArg
	}
	for _, m := range order {
		if !m.used {
			errs = append(errs, fmt.Sprintf("%s: %s.%s: no Op constant in abi names its operation", m.pos, m.iface, m.name))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("%s: no Op constants", abiDir)
	}
	return ops, nil
}

func parseDir(fset *token.FileSet, dir string, errs *[]string) []*ast.File {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		*errs = append(*errs, err.Error())
	}
	sort.Strings(names)
	var out []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") || strings.HasSuffix(name, "_gen.go") || strings.HasSuffix(name, "_wire.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			*errs = append(*errs, err.Error())
			continue
		}
		out = append(out, f)
	}
	return out
}

// parseMethod reads a method of the shapes Dispatch can serve:
// M([*abi.Req]) (*abi.Resp, error) or M([*abi.Req]) error, and
// Info() abi.BackendInfo.
func parseMethod(fset *token.FileSet, iface, name string, ft *ast.FuncType) (*method, error) {
	m := &method{iface: iface, name: name, pos: fset.Position(ft.Pos()).String(), req: "Empty", resp: "Empty"}
	fail := fmt.Errorf("%s: %s.%s: want M([req *abi.X]) ([*abi.Y, ]error)", m.pos, iface, name)
	switch n := ft.Params.NumFields(); {
	case n == 1:
		t, ok := abiType(ft.Params.List[0].Type, true)
		if !ok {
			return nil, fail
		}
		m.req, m.reqArg = t, true
	case n > 1:
		return nil, fail
	}
	var res []ast.Expr
	if ft.Results != nil {
		for _, r := range ft.Results.List {
			res = append(res, r.Type)
		}
	}
	isErr := func(e ast.Expr) bool { id, ok := e.(*ast.Ident); return ok && id.Name == "error" }
	switch {
	case name == "Info" && len(res) == 1:
		t, ok := abiType(res[0], false)
		if !ok {
			return nil, fail
		}
		m.resp = t
	case len(res) == 1 && isErr(res[0]):
	case len(res) == 2 && isErr(res[1]):
		t, ok := abiType(res[0], true)
		if !ok {
			return nil, fail
		}
		m.resp = t
	default:
		return nil, fail
	}
	return m, nil
}

// abiType answers X for *abi.X (ptr) or abi.X.
func abiType(e ast.Expr, ptr bool) (string, bool) {
	if ptr {
		s, ok := e.(*ast.StarExpr)
		if !ok {
			return "", false
		}
		e = s.X
	}
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "abi" {
		return "", false
	}
	return sel.Sel.Name, true
}

// camel turns "create_volume" into "CreateVolume".
func camel(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(s, "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}
