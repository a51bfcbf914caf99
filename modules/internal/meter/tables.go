package meter

import (
	"errors"
	"fmt"
	"math"
)

// ErrTables is wrapped by LimitTables' error for a module whose tables
// need more entries than it allows.
var ErrTables = errors.New("tables too large")

// LimitTables returns wasm with a maximum on every table it defines, so
// that its tables together never hold more than max entries, or an error
// wrapping ErrTables when their declared minimums already need more, or
// when its element segments (segments and entries counted together) or its
// globals number more than max: wazero keeps a structure for each of those
// too in every instance, outside the memory limit.
//
// wazero keeps a table's entries on the Go heap, outside the memory limit
// of the instance, and grows a table without a declared maximum up to
// millions of entries: a guest looping on table.grow would take the
// daemon's memory. The budget left over by the minimums goes first to the
// tables that declare a maximum, each up to it, then in order to those
// that declare none (standard Go's; neither Go nor TinyGo code grows its
// table). table.grow past the new maximum fails as the
// specification allows, answering -1. A module without a table section is
// returned as it is; any other is copied with only that section changed.
// Errors other than ErrTables wrap ErrUnsupported.
func LimitTables(wasm []byte, max uint64) ([]byte, error) {
	secs, err := sections(wasm)
	if err != nil {
		return nil, err
	}
	at := -1
	for i, s := range secs {
		switch s.id {
		case secTable:
			at = i
		case secElement:
			n, err := elementEntries(s.body)
			if err != nil {
				return nil, err
			}
			if n > max {
				return nil, fmt.Errorf("%w: the module's element segments hold %d entries and segments, the limit is %d", ErrTables, n, max)
			}
		case secGlobal:
			r := &reader{b: s.body}
			if n := r.u32(); r.err == nil && uint64(n) > max {
				return nil, fmt.Errorf("%w: the module declares %d globals, the limit is %d", ErrTables, n, max)
			}
		}
	}
	if at < 0 {
		return wasm, nil
	}
	body, err := limitTables(secs[at].body, max)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(wasm)+len(body)-len(secs[at].body)+8)
	out = append(out, wasm[:8]...)
	for i, s := range secs {
		b := s.body
		if i == at {
			b = body
		}
		out = append(out, s.id)
		out = appendU32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out, nil
}

// table is one entry of a table section: its bytes before the limits,
// its limits, and its initializer's bytes (empty when it has none).
type table struct {
	head     []byte
	min, max uint64
	hasMax   bool
	init     []byte
}

func limitTables(body []byte, budget uint64) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	var ts []table
	var mins uint64
	for i := uint32(0); i < n && r.err == nil; i++ {
		var t table
		start := r.off
		withInit := r.off < len(r.b) && r.b[r.off] == 0x40
		if withInit {
			r.byte()
			if r.byte() != 0x00 {
				r.fail("table %d: reserved byte not 0", i)
			}
		}
		r.refType()
		t.head = r.b[start:r.off]
		switch flags := r.byte(); flags {
		case 0x00:
			t.min = uint64(r.u32())
		case 0x01:
			t.min, t.hasMax = uint64(r.u32()), true
			t.max = uint64(r.u32())
		default:
			r.fail("table %d: limits flags %#x", i, flags)
		}
		if withInit {
			from := r.off
			constExpr(r)
			t.init = r.b[from:r.off]
		}
		if r.err == nil && t.hasMax && t.max < t.min {
			r.fail("table %d: maximum %d below minimum %d", i, t.max, t.min)
		}
		mins += t.min // under 2^32 each, fewer than 2^31 tables in a section: no overflow
		ts = append(ts, t)
	}
	if r.err == nil && r.off != len(r.b) {
		r.fail("trailing bytes")
	}
	if r.err != nil {
		return nil, unsupported("table section: %v", r.err)
	}
	if mins > budget {
		return nil, fmt.Errorf("%w: the module's tables need %d entries at least, the limit is %d", ErrTables, mins, budget)
	}
	// Tables that declare a maximum get their growth first, since their
	// module said how far they may grow; those without one share the rest.
	left := budget - mins
	grow := make([]uint64, len(ts))
	for pass := range 2 {
		for i, t := range ts {
			switch {
			case pass == 0 && t.hasMax:
				grow[i] = min(left, t.max-t.min)
			case pass == 1 && !t.hasMax:
				grow[i] = min(left, math.MaxUint32-t.min)
			default:
				continue
			}
			left -= grow[i]
		}
	}
	out := appendU32(make([]byte, 0, len(body)+len(ts)*6), n)
	for i, t := range ts {
		out = append(out, t.head...)
		out = append(out, 0x01)
		out = appendU32(out, uint32(t.min))
		out = appendU32(out, uint32(t.min+grow[i]))
		out = append(out, t.init...)
	}
	return out, nil
}

// elementEntries counts the segments of an element section and the entries
// they hold: wazero keeps a structure per entry at compile time and again in
// every instance, on the Go heap, however few of them fit any table.
func elementEntries(body []byte) (uint64, error) {
	r := &reader{b: body}
	n := r.u32()
	total := uint64(n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		flags := r.u32()
		if flags > 7 {
			r.fail("element segment %d: flags %d", i, flags)
			break
		}
		if flags&3 == 2 { // active with a table index
			r.u32()
		}
		if flags&1 == 0 { // active: the offset
			constExpr(r)
		}
		if flags&3 != 0 { // not the short active form: the kind or type
			if flags&4 == 0 {
				r.byte() // elemkind
			} else {
				r.refType()
			}
		}
		m := r.u32()
		total += uint64(m)
		for j := uint32(0); j < m && r.err == nil; j++ {
			if flags&4 == 0 {
				r.u32() // a function index
			} else {
				constExpr(r)
			}
		}
	}
	if r.err == nil && r.off != len(r.b) {
		r.fail("trailing bytes")
	}
	if r.err != nil {
		return 0, unsupported("element section: %v", r.err)
	}
	return total, nil
}

// constExpr skips a constant expression up to its end: the instructions
// the specification allows there, with the extended-constant arithmetic.
func constExpr(r *reader) {
	for r.err == nil {
		switch op := r.byte(); op {
		case 0x0b: // end
			return
		case 0x41: // i32.const
			r.signed(5)
		case 0x42: // i64.const
			r.signed(10)
		case 0x43: // f32.const
			r.take(4)
		case 0x44: // f64.const
			r.take(8)
		case 0xd0: // ref.null
			r.refType()
		case 0xd2, 0x23: // ref.func, global.get
			r.u32()
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // i32/i64 add, sub, mul
		default:
			r.fail("opcode %#x in a constant expression", op)
		}
	}
}

// sections splits a binary module into its sections, checking their ids
// and order.
func sections(wasm []byte) ([]section, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" || wasm[4] != 1 || wasm[5] != 0 || wasm[6] != 0 || wasm[7] != 0 {
		return nil, unsupported("not a WebAssembly 1.0 binary module")
	}
	r := &reader{b: wasm, off: 8}
	var secs []section
	var lastRank int
	for r.off < len(r.b) {
		id := r.byte()
		size := r.u32()
		body := r.take(int(size))
		if r.err != nil {
			return nil, unsupported("section %d: %v", id, r.err)
		}
		if id != secCustom {
			rank, ok := order[id]
			if !ok {
				return nil, unsupported("unknown section id %d", id)
			}
			if rank <= lastRank {
				return nil, unsupported("section %d out of order", id)
			}
			lastRank = rank
		}
		secs = append(secs, section{id, body})
	}
	return secs, nil
}
