package modules

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/modules/internal/meter"
)

// wasiModule is the WASI import module name; wazero's implementation serves it.
const wasiModule = "wasi_snapshot_preview1"

// Signatures, written as in abi.HostCallSignature.
const (
	sigOp       = "() -> i32"
	sigInit     = "() -> ()"
	sigReadBuf  = "(i32 i32) -> i32"
	sigWriteBuf = "(i32 i32) -> ()"
	sigLog      = "(i32 i32 i32) -> ()"
	sigVersion  = sigOp
	sigRefuel   = sigOp
	sigHostCall = abi.HostCallSignature
)

// coreImports are the wasmcsi imports every module may use without a grant.
var coreImports = map[string]string{
	abi.ImportRequestRead:   sigReadBuf,
	abi.ImportResponseWrite: sigWriteBuf,
	abi.ImportResultRead:    sigReadBuf,
	abi.ImportLog:           sigLog,
}

func isCoreImport(name string) bool { _, ok := coreImports[name]; return ok }

// signature formats a function type as "(i32 i32) -> i64"; no results is "()".
func signature(params, results []api.ValueType) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, p := range params {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(api.ValueTypeName(p))
	}
	b.WriteString(") -> ")
	switch len(results) {
	case 0:
		b.WriteString("()")
	case 1:
		b.WriteString(api.ValueTypeName(results[0]))
	default:
		b.WriteByte('(')
		for i, r := range results {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(api.ValueTypeName(r))
		}
		b.WriteByte(')')
	}
	return b.String()
}

func defSignature(d api.FunctionDefinition) string {
	return signature(d.ParamTypes(), d.ResultTypes())
}

// checked is what validation learned about a compiled module.
type checked struct {
	ops       map[abi.Op]bool  // exported operations
	hostCalls []hostcalls.Func // granted host calls the module imports
	hasInit   bool             // exports _initialize
	problems  []string         // every reason to refuse it, in a stable order
}

// validate checks a compiled module's exports and imports against the ABI,
// the host-call registry and the module's grant. wasi lists the functions of
// the WASI host module by name.
func validate(cm wazero.CompiledModule, grant Grant, registry map[string]hostcalls.Func, wasi map[string]api.FunctionDefinition, metered bool) checked {
	c := checked{ops: map[abi.Op]bool{}}
	exports := cm.ExportedFunctions()

	if d, ok := exports[abi.ExportABIVersion]; !ok {
		c.problems = append(c.problems, fmt.Sprintf("missing export %s %s", abi.ExportABIVersion, sigVersion))
	} else if s := defSignature(d); s != sigVersion {
		c.problems = append(c.problems, fmt.Sprintf("export %s has signature %s, needs %s", abi.ExportABIVersion, s, sigVersion))
	}
	if d, ok := exports[abi.ExportInitialize]; ok {
		if s := defSignature(d); s != sigInit {
			c.problems = append(c.problems, fmt.Sprintf("export %s has signature %s, needs %s", abi.ExportInitialize, s, sigInit))
		} else {
			c.hasInit = true
		}
	}
	if _, ok := cm.ExportedMemories()[abi.ExportMemory]; !ok {
		c.problems = append(c.problems, fmt.Sprintf("missing export %s (the module's linear memory)", abi.ExportMemory))
	}
	if _, ok := exports[string(abi.OpInfo)]; !ok {
		c.problems = append(c.problems, fmt.Sprintf("missing required export %s %s", abi.OpInfo, sigOp))
	}
	for _, op := range abi.AllOps {
		d, ok := exports[string(op)]
		if !ok {
			continue
		}
		if s := defSignature(d); s != sigOp {
			c.problems = append(c.problems, fmt.Sprintf("export %s has signature %s, needs %s", op, s, sigOp))
			continue
		}
		c.ops[op] = true
	}

	granted := map[string]bool{}
	for _, f := range grant.HostCalls {
		granted[f] = true
	}
	linked := map[string]bool{}
	for _, d := range cm.ImportedFunctions() {
		mod, name, _ := d.Import()
		s := defSignature(d)
		switch mod {
		case abi.HostModule:
			if want, ok := coreImports[name]; ok {
				if s != want {
					c.problems = append(c.problems, fmt.Sprintf("import %s.%s has signature %s, needs %s", mod, name, s, want))
				}
				continue
			}
			f, ok := registry[name]
			switch {
			case !ok:
				c.problems = append(c.problems, fmt.Sprintf("import %s.%s is not a host call this daemon offers", mod, name))
			case s != sigHostCall:
				c.problems = append(c.problems, fmt.Sprintf("import %s.%s has signature %s, needs %s", mod, name, s, sigHostCall))
			case !granted[f.Family]:
				c.problems = append(c.problems, fmt.Sprintf("import %s.%s needs grant %q", mod, name, f.Family))
			case !linked[name]:
				linked[name] = true
				f.Name = name
				c.hostCalls = append(c.hostCalls, f)
			}
		case wasiModule:
			w, ok := wasi[name]
			switch {
			case !ok:
				c.problems = append(c.problems, fmt.Sprintf("import %s.%s is not a WASI preview 1 function", mod, name))
			case s != defSignature(w):
				c.problems = append(c.problems, fmt.Sprintf("import %s.%s has signature %s, needs %s", mod, name, s, defSignature(w)))
			}
		case meter.Module:
			// meter.Instrument added it, and refuses a module that
			// imports from meter.Module itself.
			if !metered || name != meter.Func || s != sigRefuel {
				c.problems = append(c.problems, fmt.Sprintf("import %s.%s: unknown import module %q (only %s and %s)", mod, name, mod, abi.HostModule, wasiModule))
			}
		default:
			c.problems = append(c.problems, fmt.Sprintf("import %s.%s: unknown import module %q (only %s and %s)", mod, name, mod, abi.HostModule, wasiModule))
		}
	}
	for _, d := range cm.ImportedMemories() {
		mod, name, _ := d.Import()
		c.problems = append(c.problems, fmt.Sprintf("import %s.%s: a module must define its own memory, not import one", mod, name))
	}
	sort.Slice(c.hostCalls, func(i, j int) bool { return c.hostCalls[i].Name < c.hostCalls[j].Name })
	return c
}
