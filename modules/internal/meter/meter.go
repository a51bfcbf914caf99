// Package meter rewrites a WebAssembly module so that a guest that loops
// can be stopped cheaply.
//
// wazero stops a looping guest only when the module is compiled with
// close-on-context-done, which puts at every loop header an indirect call
// that leaves the guest's code for Go and back, on every iteration; in the
// guests our SDK builds that exit is about two thirds of a call's time
// (docs/PERFORMANCE.md, "Module calls"). Instrument instead counts loop
// iterations in the guest: every loop header decrements a new mutable i32
// global, and when it runs out calls one imported host function
// (Module.Func, type [] -> [i32]), which checks the call's deadline, stops
// the guest when it is spent, and answers the next count. An iteration
// then costs a global load, a compare, a subtract and a store, and the
// guest leaves its code for Go once per count: the deadline is seen within
// that many iterations, and the Go scheduler can stop the goroutine there
// (native code cannot be preempted).
//
// The countdown sits at every loop header, since every backward branch in
// WebAssembly goes to one, and at every function's entry, since a tree of
// calls can run long without a loop; each subtracts a cost that grows with
// its function's size (bytesPerFuel), so the code run between two refuels
// is bounded whatever the shape of the guest.
//
// The import is appended after the module's own imports, so the index of
// every function the module defines grows by one; Instrument renumbers
// every reference (call, return_call, ref.func, exports, the start
// function, element segments, constant expressions and the name section).
// A module it cannot read completely (an instruction or a section form it
// does not know) is refused with an error wrapping ErrUnsupported, never
// rewritten in part: the caller then compiles the original with wazero's
// own checks.
package meter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The import Instrument adds: module Module, function Func, [] -> [i32].
const (
	Module = "wasmcsi_meter"
	Func   = "refuel"
)

// ErrUnsupported is wrapped by every error of Instrument.
var ErrUnsupported = errors.New("meter: module not instrumented")

var errTooLarge = unsupported("a section would grow past 4 GiB")

// Section ids.
const (
	secCustom  = 0
	secType    = 1
	secImport  = 2
	secFunc    = 3
	secTable   = 4
	secGlobal  = 6
	secExport  = 7
	secStart   = 8
	secElement = 9
	secCode    = 10
)

// order is a section's rank in the order the binary format requires
// (custom sections have none).
var order = map[byte]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}

type section struct {
	id   byte
	body []byte
}

// rewriter holds what the sections need to know of each other.
type rewriter struct {
	imports uint32   // functions imported by the module (before ours)
	refuel  uint32   // our import's function index (== imports)
	fuel    uint32   // our global's index
	params  []uint32 // parameter count of each defined function
	scratch uint32   // the scratch local of the function being rewritten
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, args...)...)
}

// Instrument returns a copy of wasm with the loop counter and its import
// added; wasm itself is not changed.
func Instrument(wasm []byte) ([]byte, error) {
	secs, err := sections(wasm)
	if err != nil {
		return nil, err
	}

	w := &rewriter{}
	var types, globals, importedGlobals uint32
	var typeParams []uint32
	for _, s := range secs {
		switch s.id {
		case secType:
			var err error
			if typeParams, err = countTypes(s.body); err != nil {
				return nil, err
			}
			types = uint32(len(typeParams))
		case secImport:
			fns, gls, err := countImports(s.body)
			if err != nil {
				return nil, err
			}
			w.imports, importedGlobals = fns, gls
		case secGlobal:
			sr := &reader{b: s.body}
			globals = sr.u32()
			if sr.err != nil {
				return nil, unsupported("global section: %v", sr.err)
			}
		}
	}
	if uint64(w.imports)+1 > math.MaxUint32/2 || uint64(importedGlobals)+uint64(globals) > math.MaxUint32/2 || uint64(types) > math.MaxUint32/2 {
		return nil, unsupported("too many entries")
	}
	w.refuel = w.imports
	w.fuel = importedGlobals + globals
	refuelType := types
	for _, s := range secs {
		if s.id == secFunc {
			var err error
			if w.params, err = funcParams(s.body, typeParams); err != nil {
				return nil, err
			}
		}
	}

	out := make([]byte, 0, len(wasm)+len(wasm)/16+64)
	out = append(out, wasm[:8]...)
	have := map[byte]bool{}
	for _, s := range secs {
		have[s.id] = true
	}
	// Sections this rewrite needs, made empty where the module has none,
	// each placed before the first section that must follow it.
	pending := []byte{}
	for _, id := range []byte{secType, secImport, secGlobal} {
		if !have[id] {
			pending = append(pending, id)
		}
	}
	emit := func(id byte, body []byte) error {
		if uint64(len(body)) > math.MaxUint32 {
			return errTooLarge
		}
		out = append(out, id)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
		return nil
	}
	flush := func(beforeRank int) error {
		for len(pending) > 0 && order[pending[0]] < beforeRank {
			body, err := w.section(pending[0], nil, refuelType)
			if err != nil {
				return err
			}
			if err := emit(pending[0], body); err != nil {
				return err
			}
			pending = pending[1:]
		}
		return nil
	}
	for _, s := range secs {
		if s.id != secCustom {
			if err := flush(order[s.id]); err != nil {
				return nil, err
			}
		}
		body, err := w.section(s.id, s.body, refuelType)
		if err != nil {
			return nil, err
		}
		if body != nil {
			if err := emit(s.id, body); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(math.MaxInt); err != nil {
		return nil, err
	}
	return out, nil
}

// section returns the new body of section id (body is the original, nil
// for one the module lacks), or nil to leave the section out.
func (w *rewriter) section(id byte, body []byte, refuelType uint32) ([]byte, error) {
	wrap := func(what string, b []byte, err error) ([]byte, error) {
		if err != nil {
			return nil, unsupported("%s section: %v", what, err)
		}
		return b, nil
	}
	switch id {
	case secType:
		// One more function type, [] -> [i32], at the end.
		b, err := appendToVec(body, []byte{0x60, 0x00, 0x01, 0x7f})
		return wrap("type", b, err)
	case secImport:
		entry := appendName(nil, Module)
		entry = appendName(entry, Func)
		entry = append(entry, 0x00)
		entry = appendU32(entry, refuelType)
		b, err := appendToVec(body, entry)
		return wrap("import", b, err)
	case secGlobal:
		b, err := w.globals(body)
		return wrap("global", b, err)
	case secExport:
		b, err := w.exports(body)
		return wrap("export", b, err)
	case secStart:
		r := &reader{b: body}
		idx := r.u32()
		if r.err != nil || r.off != len(r.b) {
			return nil, unsupported("start section malformed")
		}
		return appendU32(nil, w.fn(idx)), nil
	case secElement:
		b, err := w.elements(body)
		return wrap("element", b, err)
	case secCode:
		b, err := w.code(body)
		return wrap("code", b, err)
	case secTable:
		b, err := w.tables(body)
		return wrap("table", b, err)
	case secCustom:
		// Only the name section is kept, renumbered. Others may hold
		// function indices or code offsets the rewrite moved (DWARF,
		// source maps, branch hints), and none changes what the code does.
		r := &reader{b: body}
		name := r.name()
		if r.err == nil && name == "name" {
			b, err := w.names(body[:r.off], r)
			if err != nil {
				return nil, nil // names are optional: leave out what cannot be renumbered
			}
			return b, nil
		}
		return nil, nil
	}
	return body, nil
}

// tables renumbers ref.func in the initializers of tables that have one
// (0x40 0x00 reftype limits expr).
func (w *rewriter) tables(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(make([]byte, 0, len(body)), n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		start := r.off
		init := r.off < len(r.b) && r.b[r.off] == 0x40
		if init {
			r.byte()
			if r.byte() != 0x00 {
				return nil, errors.New("table with an initializer: reserved byte not 0")
			}
		}
		r.refType()
		r.limits()
		out = append(out, r.b[start:r.off]...)
		if init {
			var err error
			if out, err = w.expr(r, out); err != nil {
				return nil, err
			}
		}
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	return out, r.err
}

// fn is the new index of function idx.
func (w *rewriter) fn(idx uint32) uint32 {
	if idx >= w.imports {
		return idx + 1
	}
	return idx
}

// countTypes counts the function types of a type section. Anything else
// (a rec group, 0x4e, which wazero reads and which holds several types in
// one entry) is refused: the new type's index would be wrong.
func countTypes(body []byte) (params []uint32, err error) {
	r := &reader{b: body}
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		if form := r.byte(); form != 0x60 {
			r.fail("type form %#x", form)
		}
		for k := range 2 { // parameters, results
			m := r.u32()
			for j := uint32(0); j < m && r.err == nil; j++ {
				r.valType()
			}
			if k == 0 {
				params = append(params, m)
			}
		}
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return nil, unsupported("type section: %v", r.err)
	}
	return params, nil
}

// funcParams returns the parameter count of each function the function
// section declares.
func funcParams(body []byte, typeParams []uint32) ([]uint32, error) {
	r := &reader{b: body}
	n := r.u32()
	var params []uint32
	for i := uint32(0); i < n && r.err == nil; i++ {
		t := r.u32()
		if r.err == nil && t >= uint32(len(typeParams)) {
			r.fail("function %d of type %d, past the types", i, t)
		}
		if r.err == nil {
			params = append(params, typeParams[t])
		}
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return nil, unsupported("function section: %v", r.err)
	}
	return params, nil
}

// countImports counts the functions and globals of an import section.
func countImports(body []byte) (fns, globals uint32, err error) {
	r := &reader{b: body}
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		mod := r.name()
		r.name()
		if mod == Module {
			return 0, 0, unsupported("the module imports from %q itself", Module)
		}
		switch kind := r.byte(); kind {
		case 0x00: // function
			r.u32()
			fns++
		case 0x01: // table
			r.refType()
			r.limits()
		case 0x02: // memory
			r.limits()
		case 0x03: // global
			r.valType()
			r.byte() // mutability
			globals++
		default:
			return 0, 0, unsupported("import of kind %#x", kind)
		}
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return 0, 0, unsupported("import section: %v", r.err)
	}
	return fns, globals, nil
}

// globals renumbers ref.func in the initializers and appends the counter,
// (mut i32) starting at 0: a guest's first loop asks for fuel at once.
func (w *rewriter) globals(body []byte) ([]byte, error) {
	r := &reader{b: body}
	var n uint32
	if body != nil {
		n = r.u32()
	}
	out := appendU32(make([]byte, 0, len(body)+10), n+1)
	for i := uint32(0); i < n && r.err == nil; i++ {
		start := r.off
		r.valType()
		r.byte() // mutability
		out = append(out, r.b[start:r.off]...)
		var err error
		if out, err = w.expr(r, out); err != nil {
			return nil, err
		}
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return nil, r.err
	}
	return append(out, 0x7f, 0x01, 0x41, 0x00, 0x0b), nil
}

func (w *rewriter) exports(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		start := r.off
		r.name()
		kind := r.byte()
		out = append(out, r.b[start:r.off]...)
		idx := r.u32()
		switch {
		case kind == 0x00:
			idx = w.fn(idx)
		case kind == 0x03 && idx >= w.fuel:
			// Invalid in the module, it would export the counter.
			return nil, fmt.Errorf("export of global %d, past the module's globals", idx)
		}
		out = appendU32(out, idx)
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	return out, r.err
}

func (w *rewriter) elements(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		flags := r.u32()
		if flags > 7 {
			return nil, fmt.Errorf("segment flags %d", flags)
		}
		out = appendU32(out, flags)
		var err error
		if flags&1 == 0 { // active
			if flags&2 != 0 {
				out = appendU32(out, r.u32()) // table index
			}
			if out, err = w.expr(r, out); err != nil {
				return nil, err
			}
		}
		switch {
		case flags&3 != 0 && flags&4 == 0: // element kind: funcref
			if r.byte() != 0x00 {
				return nil, errors.New("element kind not 0")
			}
			out = append(out, 0x00)
		case flags&3 != 0: // reference type
			start := r.off
			r.refType()
			out = append(out, r.b[start:r.off]...)
		}
		count := r.u32()
		out = appendU32(out, count)
		for j := uint32(0); j < count && r.err == nil; j++ {
			if flags&4 == 0 {
				idx := r.u32()
				if r.err == nil && idx < w.imports {
					return nil, fmt.Errorf("element segment names imported function %d", idx)
				}
				out = appendU32(out, w.fn(idx))
			} else if out, err = w.expr(r, out); err != nil {
				return nil, err
			}
		}
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	return out, r.err
}

// expr copies a constant expression up to and including its end.
func (w *rewriter) expr(r *reader, out []byte) ([]byte, error) {
	return w.instructions(r, out, 0)
}

func (w *rewriter) code(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(make([]byte, 0, len(body)+len(body)/8), n)
	var fn []byte
	for i := uint32(0); i < n && r.err == nil; i++ {
		size := r.u32()
		fr := &reader{b: r.take(int(size))}
		if r.err != nil {
			break
		}
		if i >= uint32(len(w.params)) {
			return nil, fmt.Errorf("function %d has no type (function section)", i)
		}
		// One i32 local is added after the function's own: the scratch
		// that keeps a bulk operation's length for its countdown.
		groups := fr.u32()
		start := fr.off
		scratch := uint64(w.params[i])
		for j := uint32(0); j < groups && fr.err == nil; j++ {
			scratch += uint64(fr.u32())
			fr.valType()
		}
		if fr.err == nil && (groups == math.MaxUint32 || scratch >= math.MaxUint32) {
			fr.fail("too many locals")
		}
		if fr.err != nil {
			return nil, fmt.Errorf("function %d: locals: %v", i, fr.err)
		}
		fn = appendU32(fn[:0], groups+1)
		fn = append(fn, fr.b[start:fr.off]...)
		fn = append(fn, 0x01, 0x7f)
		w.scratch = uint32(scratch)
		cost := 1 + size/bytesPerFuel
		fn = w.appendCountdown(fn, cost)
		var err error
		if fn, err = w.instructions(fr, fn, cost); err != nil {
			return nil, fmt.Errorf("function %d: %v", i, err)
		}
		if fr.off != len(fr.b) {
			return nil, fmt.Errorf("function %d: bytes after its end", i)
		}
		if uint64(len(fn)) > math.MaxUint32 {
			return nil, errTooLarge
		}
		out = appendU32(out, uint32(len(fn)))
		out = append(out, fn...)
	}
	if r.err == nil && r.off != len(r.b) {
		r.err = errors.New("trailing bytes")
	}
	return out, r.err
}

// names renumbers the function indices of the name section's function,
// local and label name maps. head is the section up to its subsections.
func (w *rewriter) names(head []byte, r *reader) ([]byte, error) {
	out := append([]byte(nil), head...)
	for r.off < len(r.b) && r.err == nil {
		id := r.byte()
		sub := &reader{b: r.take(int(r.u32()))}
		if r.err != nil {
			break
		}
		var nb []byte
		switch id {
		case 1: // function names: idx name
			n := sub.u32()
			nb = appendU32(nb, n)
			for i := uint32(0); i < n && sub.err == nil; i++ {
				nb = appendU32(nb, w.fn(sub.u32()))
				nb = appendName(nb, sub.name())
			}
		case 3: // label names: the countdowns' blocks shift their indices
			sub.off = len(sub.b)
			continue
		case 2: // local names: idx (idx name)*
			n := sub.u32()
			nb = appendU32(nb, n)
			for i := uint32(0); i < n && sub.err == nil; i++ {
				nb = appendU32(nb, w.fn(sub.u32()))
				start := sub.off
				m := sub.u32()
				for j := uint32(0); j < m && sub.err == nil; j++ {
					sub.u32()
					sub.name()
				}
				nb = append(nb, sub.b[start:sub.off]...)
			}
		default:
			nb = sub.b
			sub.off = len(sub.b)
		}
		if sub.err != nil || sub.off != len(sub.b) {
			return nil, errors.New("malformed name subsection")
		}
		out = append(out, id)
		out = appendU32(out, uint32(len(nb)))
		out = append(out, nb...)
	}
	return out, r.err
}

// instructions copies instructions from r to out up to the end that closes
// the sequence (a function body's or a constant expression's), renumbering
// function references and, in code, counting down the fuel at each loop
// header.
func (w *rewriter) instructions(r *reader, out []byte, cost uint32) ([]byte, error) {
	depth := 0
	copied := r.off // r.b[copied:start] is still to be copied to out
	for {
		if r.off >= len(r.b) {
			return nil, errors.New("instructions end without end")
		}
		start := r.off
		op := r.byte()
		switch {
		case op == 0x02 || op == 0x04: // block, if
			r.blockType()
			depth++
		case op == 0x03: // loop
			r.blockType()
			depth++
			if cost > 0 && r.err == nil {
				out = append(out, r.b[copied:r.off]...)
				out = w.appendCountdown(out, cost)
				copied = r.off
			}
		case op == 0x0b: // end
			if depth == 0 {
				return append(out, r.b[copied:r.off]...), r.err
			}
			depth--
		case op == 0x10 || op == 0x12 || op == 0xd2: // call, return_call, ref.func
			idx := r.u32()
			switch {
			case r.err != nil:
			case idx >= w.imports:
				out = append(out, r.b[copied:start]...)
				out = append(out, op)
				out = appendU32(out, w.fn(idx))
				copied = r.off
			case op == 0xd2:
				// An imported function in a table would be reached by
				// call_indirect, which has no countdown of its own.
				r.fail("ref.func of imported function %d", idx)
			case cost > 0:
				// The host's code runs outside the count, for as long as
				// its arguments say (a WASI random_get, poll_oneoff,
				// fd_write): refuel checks the deadline before each call,
				// as wazero's checks did at each loop iteration.
				out = append(out, r.b[copied:start]...)
				out = w.appendRefuel(out)
				copied = start
			}
		case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0f || op == 0x1a || op == 0x1b ||
			op == 0xd1 || (op >= 0x45 && op <= 0xc4):
			// no immediate
		case op == 0x23 || op == 0x24: // global.get, global.set
			// An index past the module's globals is invalid there and
			// would reach the counter once it is added: refused.
			if idx := r.u32(); r.err == nil && idx >= w.fuel {
				r.fail("global %d past the module's globals", idx)
			}
		case op == 0x0c || op == 0x0d || (op >= 0x20 && op <= 0x26) || op == 0x3f || op == 0x40:
			r.u32() // label, local, table or memory index
		case op == 0x0e: // br_table
			n := r.u32()
			for i := uint32(0); i <= n && r.err == nil; i++ {
				r.u32()
			}
		case op == 0x11 || op == 0x13: // call_indirect, return_call_indirect
			r.u32()
			r.u32()
		case op == 0x1c: // select t
			if r.u32() != 1 {
				r.fail("select with other than one type")
			}
			r.valType()
		case op >= 0x28 && op <= 0x3e: // loads and stores
			r.memarg()
		case op == 0x41:
			r.signed(5)
		case op == 0x42:
			r.signed(10)
		case op == 0x43:
			r.take(4)
		case op == 0x44:
			r.take(8)
		case op == 0xd0: // ref.null t
			r.refType()
		case op == 0xfc:
			if shift := r.prefixFC(); shift > 0 && cost > 0 && r.err == nil {
				// The length is on top of the stack: charged by it.
				out = append(out, r.b[copied:start]...)
				out = w.appendLengthCountdown(out, shift)
				copied = start
			}
		case op == 0xfd:
			r.prefixFD()
		case op == 0xfe:
			r.prefixFE()
		default:
			return nil, fmt.Errorf("unknown opcode %#x at byte %d", op, start)
		}
		if r.err != nil {
			return nil, r.err
		}
	}
}

// bytesPerFuel weighs a function's countdowns by its size: each costs one
// unit of fuel per bytesPerFuel bytes of the function's code (and at least
// one). Between two countdowns a guest runs at most its function's code
// once (the code of the functions it calls is counted by their own), so
// the work between two refuels is bounded by the fuel times bytesPerFuel
// bytes of code, whatever the shape of the loops and calls: a loop around
// a call of a long function without loops, or a tree of calls without
// any, is stopped as promptly as a tight loop.
const bytesPerFuel = 1024

// appendRefuel appends an unconditional refuel: call $refuel  global.set
// $fuel.
func (w *rewriter) appendRefuel(out []byte) []byte {
	out = append(out, 0x10)
	out = appendU32(out, w.refuel)
	out = append(out, 0x24)
	return appendU32(out, w.fuel)
}

// appendLengthCountdown appends, before a bulk operation whose i32 length
// n is on top of the stack, a countdown of 1 + n>>shift:
//
//	local.tee $scratch
//	global.get $fuel  local.get $scratch  i32.const shift  i32.shr_u  i32.sub
//	i32.const 1  i32.sub  global.set $fuel
//	global.get $fuel  i32.const 1  i32.lt_s
//	if  call $refuel  global.set $fuel  end
//
// The stack is as before it.
func (w *rewriter) appendLengthCountdown(out []byte, shift uint8) []byte {
	out = append(out, 0x22)
	out = appendU32(out, w.scratch)
	out = append(out, 0x23)
	out = appendU32(out, w.fuel)
	out = append(out, 0x20)
	out = appendU32(out, w.scratch)
	out = append(out, 0x41, shift, 0x76, 0x6b, 0x41, 0x01, 0x6b, 0x24)
	out = appendU32(out, w.fuel)
	return w.appendCheck(out)
}

// appendCountdown appends, at a function's entry and at each loop header:
//
//	global.get $fuel  i32.const cost  i32.sub  global.set $fuel
//	global.get $fuel  i32.const 1  i32.lt_s
//	if  call $refuel  global.set $fuel  end
//
// The stack is as before it, so a loop's parameters pass through.
func (w *rewriter) appendCountdown(out []byte, cost uint32) []byte {
	out = append(out, 0x23)
	out = appendU32(out, w.fuel)
	out = append(out, 0x41)
	out = appendS32(out, int32(cost))
	out = append(out, 0x6b, 0x24)
	out = appendU32(out, w.fuel)
	return w.appendCheck(out)
}

// appendCheck appends the refuel when the counter is below 1.
func (w *rewriter) appendCheck(out []byte) []byte {
	out = append(out, 0x23)
	out = appendU32(out, w.fuel)
	out = append(out, 0x41, 0x01, 0x48, 0x04, 0x40, 0x10)
	out = appendU32(out, w.refuel)
	out = append(out, 0x24)
	out = appendU32(out, w.fuel)
	return append(out, 0x0b)
}

// appendToVec adds one encoded entry to a vector section body (nil: none).
func appendToVec(body, entry []byte) ([]byte, error) {
	var n uint32
	var rest []byte
	if body != nil {
		r := &reader{b: body}
		n = r.u32()
		if r.err != nil {
			return nil, r.err
		}
		rest = body[r.off:]
	}
	out := appendU32(make([]byte, 0, len(body)+len(entry)+5), n+1)
	out = append(out, rest...)
	return append(out, entry...), nil
}

func appendU32(b []byte, v uint32) []byte { return binary.AppendUvarint(b, uint64(v)) }

// appendS32 appends v as a signed LEB128 (i32.const's immediate).
func appendS32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendName(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}

// reader reads the binary format; the first error sticks and every later
// read returns zero.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
	r.off = len(r.b)
}

func (r *reader) byte() byte {
	if r.err != nil || r.off >= len(r.b) {
		r.fail("unexpected end at byte %d", r.off)
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b)-r.off {
		r.fail("%d bytes wanted at byte %d of %d", n, r.off, len(r.b))
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u64(maxBytes int) uint64 {
	if r.err != nil {
		return 0
	}
	if r.off < len(r.b) && r.b[r.off] < 0x80 { // most immediates are one byte
		r.off++
		return uint64(r.b[r.off-1])
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 || n > maxBytes {
		r.fail("bad unsigned LEB128 at byte %d", r.off)
		return 0
	}
	r.off += n
	return v
}

func (r *reader) u32() uint32 {
	v := r.u64(5)
	if v > math.MaxUint32 {
		r.fail("u32 out of range at byte %d", r.off)
		return 0
	}
	return uint32(v)
}

// signed skips a signed LEB128 of at most maxBytes bytes.
func (r *reader) signed(maxBytes int) {
	for i := 0; i < maxBytes; i++ {
		if r.byte()&0x80 == 0 {
			return
		}
	}
	r.fail("signed LEB128 longer than %d bytes", maxBytes)
}

func (r *reader) name() string {
	return string(r.take(int(r.u32())))
}

// limits skips table or memory limits (with memory64 and shared flags).
func (r *reader) limits() {
	flags := r.byte()
	if flags > 0x07 {
		r.fail("limits flags %#x", flags)
		return
	}
	r.u64(10)
	if flags&1 != 0 {
		r.u64(10)
	}
}

// blockType skips a block type: empty, a value type, or a type index (a
// non-negative s33). The one-byte negative values are the other value
// types, among them 0x63 and 0x64, the prefixes of (ref null ht) and
// (ref ht), which wazero reads and this reader refuses.
func (r *reader) blockType() {
	if r.off < len(r.b) && r.b[r.off] == 0x40 {
		r.off++
		return
	}
	if r.off < len(r.b) && r.b[r.off]&0xc0 == 0x40 { // one byte, negative
		r.valType()
		return
	}
	// wazero reads an s33 and takes -29 and -28, in any length, for the
	// typed-reference prefixes: the last byte's sign bit must be clear.
	r.u32()
	if r.err == nil && r.b[r.off-1]&0x40 != 0 {
		r.fail("negative block type")
	}
}

// valType skips a value type: a number, vector or reference type in its
// one-byte form. Typed references (0x63, 0x64 and a heap type) are refused.
func (r *reader) valType() {
	switch c := r.byte(); c {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
	default:
		r.fail("value type %#x", c)
	}
}

// refType skips funcref or externref.
func (r *reader) refType() {
	switch c := r.byte(); c {
	case 0x70, 0x6f:
	default:
		r.fail("reference type %#x", c)
	}
}

// subOpcode reads the opcode after a 0xfc, 0xfd or 0xfe prefix. The format
// has a LEB128; wazero reads one byte after 0xfd and 0xfe (a LEB128 after
// 0xfc). The two agree for values below 0x80; for a larger one the
// LEB128's second byte must be 0x01, which wazero reads as a nop after the
// one byte. Every other form is refused (none is a valid 0xfc opcode).
func (r *reader) subOpcode() uint32 {
	b := r.byte()
	if b < 0x80 {
		return uint32(b)
	}
	if r.byte() != 0x01 {
		r.fail("prefixed opcode not encoded as wazero reads it")
	}
	return uint32(b)
}

// memarg skips alignment (with the multi-memory index flag) and offset.
func (r *reader) memarg() {
	align := r.u32()
	if align&0x40 != 0 {
		r.u32()
	}
	r.u64(10)
}

// prefixFC skips a 0xfc instruction. For a bulk operation, one with an
// i32 length on top of the stack, it answers the shift that turns the
// length into 4 KiB units: 12 for bytes (memory.init, memory.copy,
// memory.fill), 9 for table entries of 8 bytes (table.init, table.copy,
// table.grow, table.fill); 0 for any other.
func (r *reader) prefixFC() (shift uint8) {
	switch sub := r.subOpcode(); {
	case sub <= 7: // saturating truncations
	case sub == 9, sub == 13, sub == 16: // data.drop, elem.drop, table.size
		r.u32()
	case sub == 11: // memory.fill
		r.u32()
		return 12
	case sub == 15, sub == 17: // table.grow, table.fill
		r.u32()
		return 9
	case sub == 8, sub == 10: // memory.init, memory.copy
		r.u32()
		r.u32()
		return 12
	case sub == 12, sub == 14: // table.init, table.copy
		r.u32()
		r.u32()
		return 9
	default:
		r.fail("unknown instruction 0xfc %d", sub)
	}
	return 0
}

func (r *reader) prefixFD() {
	switch sub := r.subOpcode(); {
	case sub <= 11, sub == 92, sub == 93: // loads, splat loads, store, load_zero
		r.memarg()
	case sub == 12, sub == 13: // v128.const, i8x16.shuffle
		r.take(16)
	case sub >= 21 && sub <= 34: // extract and replace lane
		r.byte()
	case sub >= 84 && sub <= 91: // load and store lane
		r.memarg()
		r.byte()
	case sub <= 0xff: // the rest of SIMD has no immediate
	default:
		r.fail("unknown instruction 0xfd %d", sub)
	}
}

func (r *reader) prefixFE() {
	switch sub := r.subOpcode(); {
	case sub == 0x03: // atomic.fence
		r.byte()
	case sub <= 0x02, sub >= 0x10 && sub <= 0x4e: // notify, waits, atomic loads, stores, rmw
		r.memarg()
	default:
		r.fail("unknown instruction 0xfe %#x", sub)
	}
}
