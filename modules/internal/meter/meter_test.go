package meter

//go:generate wat2wasm testdata/shapes.wat -o testdata/shapes.wasm
//go:generate wat2wasm testdata/bare.wat -o testdata/bare.wasm
//go:generate wat2wasm testdata/bulk.wat -o testdata/bulk.wasm
//go:generate wat2wasm testdata/heavy.wat -o testdata/heavy.wasm
//go:generate wat2wasm testdata/tables.wat -o testdata/tables.wasm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wasmcsi/wasmcsi/modules/wattest"
)

func TestFixturesMatchWat(t *testing.T) {
	wattest.CheckFixtures(t, "meter_test.go", "./modules/internal/meter")
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name + ".wasm")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// refueler is the test's refuel: it counts its calls, answers fuel, and
// stops the guest on call number stopAt (0: never).
type refueler struct {
	fuel   uint32
	calls  int
	stopAt int
}

var errStopped = errors.New("stopped by refuel")

// instantiate compiles wasm (with wazero's default features: SIMD, bulk
// memory, reference types) next to the env and meter host modules.
func instantiate(t *testing.T, wasm []byte, rf *refueler) api.Module {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	if _, err := rt.NewHostModuleBuilder("env").
		NewFunctionBuilder().WithFunc(func(x int64) int64 { return 2 * x }).Export("twice").
		Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.NewHostModuleBuilder(Module).
		NewFunctionBuilder().WithFunc(func() uint32 {
		rf.calls++
		if rf.calls == rf.stopAt {
			panic(errStopped)
		}
		return rf.fuel
	}).Export(Func).
		Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig())
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	return mod
}

func call(t *testing.T, mod api.Module, name string, args ...uint64) uint64 {
	t.Helper()
	res, err := mod.ExportedFunction(name).Call(context.Background(), args...)
	if err != nil {
		t.Fatalf("%s%v: %v", name, args, err)
	}
	if len(res) != 1 {
		t.Fatalf("%s%v answered %d values", name, args, len(res))
	}
	return res[0]
}

// Every export of the shapes fixture answers the same with the counter as
// without, and the countdown runs exactly once at each function entry and
// each loop header passed: with one unit of fuel (and the shapes
// functions' cost of one) every countdown calls refuel, so the calls count
// them. Instantiation runs the start function: one more.
func TestSameAnswers(t *testing.T) {
	orig := readFixture(t, "shapes")
	metered, err := Instrument(orig)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(orig, readFixture(t, "shapes")) {
		t.Fatal("Instrument changed its input")
	}
	plain := instantiate(t, orig, &refueler{fuel: 1})
	for _, tc := range []struct {
		export     string
		args       []uint64
		countdowns int
	}{
		// entry, n+1 loop headers, and a charge before each of the
		// n/1000 calls of the imported $twice
		{"sum", []uint64{100_000}, 1 + 100_001 + 100},
		// entry, n loop headers
		{"params", []uint64{5_000}, 1 + 5_000},
		// entry, n outer and n*n inner loop headers, and the entries of
		// $inc and $dec, called when (i+j) % 3 is 0 or 1: 2n*n/3 times
		{"nested", []uint64{300}, 1 + 300 + 300*300 + 2*300*300/3},
		// entry, and a charge before memory.fill and memory.copy
		{"mem", nil, 1 + 2},
		// entry and $square's
		{"refs", nil, 2},
	} {
		t.Run(tc.export, func(t *testing.T) {
			rf := &refueler{fuel: 1}
			mod := instantiate(t, metered, rf)
			want := call(t, plain, tc.export, tc.args...)
			if got := call(t, mod, tc.export, tc.args...); got != want {
				t.Fatalf("%s%v = %d metered, %d plain", tc.export, tc.args, got, want)
			}
			if rf.calls != 1+tc.countdowns {
				t.Fatalf("refuel called %d times, want %d: the start function's and one per countdown (%d)", rf.calls, 1+tc.countdowns, tc.countdowns)
			}
		})
	}
}

// refuels is how often refuel is called for countdowns of the given costs,
// starting from an empty counter and answering fuel each time; a cost of
// forced is a refuel without a countdown (before an imported call).
func refuels(fuel int32, costs ...int32) int {
	var f int32
	n := 0
	for _, c := range costs {
		if c == forced {
			f = fuel
			n++
		} else if f -= c; f < 1 {
			f = fuel
			n++
		}
	}
	return n
}

// The counter carries over between calls: refuel comes once per fuel's
// worth of countdowns of the instance, not once per call.
func TestFuelCarriesOver(t *testing.T) {
	metered, err := Instrument(readFixture(t, "shapes"))
	if err != nil {
		t.Fatal(err)
	}
	rf := &refueler{fuel: 1000}
	mod := instantiate(t, metered, rf)
	for range 10 {
		call(t, mod, "params", 100) // 101 countdowns each
	}
	costs := make([]int32, 1+10*101) // the start function's, then the calls'
	for i := range costs {
		costs[i] = 1
	}
	if want := refuels(1000, costs...); rf.calls != want || want != 2 {
		t.Fatalf("refuel called %d times for 1,011 countdowns at 1,000 fuel, want %d (2)", rf.calls, want)
	}
}

// A function of more than bytesPerFuel bytes of code pays more per
// countdown: a loop around a long body reaches refuel sooner.
func TestCostGrowsWithTheFunction(t *testing.T) {
	metered, err := Instrument(readFixture(t, "heavy"))
	if err != nil {
		t.Fatal(err)
	}
	rf := &refueler{fuel: 10}
	mod := instantiate(t, metered, rf)
	if got := call(t, mod, "heavy", 100); got != 100 {
		t.Fatalf("heavy(100) = %d", got)
	}
	costs := make([]int32, 1+100) // entry and 100 loop headers, 2 each
	for i := range costs {
		costs[i] = 2
	}
	if want := refuels(10, costs...); rf.calls != want {
		t.Fatalf("refuel called %d times, want %d (at cost 1 it would be %d)", rf.calls, want, (101+9)/10)
	}
}

// A guest that never returns is stopped where refuel says so, and only
// there.
func TestRefuelStopsLoop(t *testing.T) {
	metered, err := Instrument(readFixture(t, "shapes"))
	if err != nil {
		t.Fatal(err)
	}
	rf := &refueler{fuel: 1 << 10, stopAt: 50}
	mod := instantiate(t, metered, rf)
	_, err = mod.ExportedFunction("forever").Call(context.Background())
	if !errors.Is(err, errStopped) {
		t.Fatalf("forever: %v, want the refuel's error", err)
	}
	if rf.calls != 50 {
		t.Fatalf("refuel called %d times, want 50", rf.calls)
	}
}

// A module without imports, globals or types gets the sections it needs,
// in the order the format requires.
func TestBareModule(t *testing.T) {
	for _, name := range []string{"bare", "empty"} {
		t.Run(name, func(t *testing.T) {
			orig := []byte("\x00asm\x01\x00\x00\x00")
			if name == "bare" {
				orig = readFixture(t, "bare")
			}
			metered, err := Instrument(orig)
			if err != nil {
				t.Fatal(err)
			}
			rf := &refueler{fuel: 3}
			mod := instantiate(t, metered, rf)
			if name == "bare" {
				if got := call(t, mod, "count", 10); got != 10 {
					t.Fatalf("count(10) = %d", got)
				}
				// entry and 10 loop headers at 3 fuel
				if want := refuels(3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1); rf.calls != want {
					t.Fatalf("refuel called %d times, want %d", rf.calls, want)
				}
			}
		})
	}
}

// The name section follows its functions to their new indices.
func TestNamesRenumbered(t *testing.T) {
	orig := readFixture(t, "shapes")
	// Name every function f<index>: 1 import and 10 defined.
	var sub []byte
	sub = appendU32(sub, 11)
	for i := uint32(0); i < 11; i++ {
		sub = appendU32(sub, i)
		sub = appendName(sub, "f"+string(rune('a'+i)))
	}
	body := appendName(nil, "name")
	body = append(body, 1)
	body = appendU32(body, uint32(len(sub)))
	body = append(body, sub...)
	named := append(append([]byte(nil), orig...), 0)
	named = appendU32(named, uint32(len(body)))
	named = append(named, body...)

	metered, err := Instrument(named)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	before, err := rt.CompileModule(ctx, named)
	if err != nil {
		t.Fatal(err)
	}
	after, err := rt.CompileModule(ctx, metered)
	if err != nil {
		t.Fatal(err)
	}
	for export, d := range before.ExportedFunctions() {
		if got := after.ExportedFunctions()[export].Name(); got != d.Name() || got == "" {
			t.Errorf("export %s is named %q after, %q before", export, got, d.Name())
		}
	}
	imp := after.ImportedFunctions()
	if len(imp) != 2 || imp[0].Name() != "fa" {
		t.Errorf("imports after: %d, the first named %q; want 2, fa", len(imp), imp[0].Name())
	}
}

// What the meter cannot read whole it refuses, and says so; it never
// returns a partial rewrite.
func TestRefused(t *testing.T) {
	shapes := readFixture(t, "shapes")
	typ := sec(1, []byte{1, 0x60, 0, 0}) // one type, [] -> []
	imp := appendU32(nil, 1)
	imp = appendName(imp, Module)
	imp = appendName(imp, Func)
	imp = append(imp, 0, 0)
	for _, tc := range []struct {
		name string
		wasm []byte
	}{
		{"not wasm", []byte("hello, world")},
		{"truncated", shapes[:len(shapes)-3]},
		{"own meter import", concat(hdr, typ, sec(2, imp))},
		{"unknown opcode", concat(hdr, typ,
			sec(3, []byte{1, 0}),                               // one function of type 0
			sec(10, []byte{1, 5, 0, 0x06, 0x40, 0x0b, 0x0b}))}, // try (exceptions) ... end end
		{"sections out of order", concat(hdr, sec(3, []byte{1, 0}), typ)},
		{"unknown section", concat(hdr, sec(42, []byte{0}))},
		// Invalid (the module has no global), but the counter would be
		// global 0 once added: a loop that set it would never stop.
		{"global.set past the globals", module(1, []byte{0, 0x03, 0x40, 0x41, 0xff, 0xff, 0xff, 0xff, 0x07, 0x24, 0x00, 0x0c, 0x00, 0x0b, 0x0b})},
		{"export of a global past the globals", concat(hdr, sec(7, append(appendName([]byte{1}, "g"), 0x03, 0x00)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Instrument(tc.wasm)
			if !errors.Is(err, ErrUnsupported) || out != nil {
				t.Fatalf("Instrument = %d bytes, %v; want nothing and ErrUnsupported", len(out), err)
			}
		})
	}
}

var hdr = []byte("\x00asm\x01\x00\x00\x00")

func concat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func sec(id byte, body []byte) []byte {
	return append(appendU32([]byte{id}, uint32(len(body))), body...)
}

// BenchmarkInstrument measures the rewrite of the shapes fixture.
func BenchmarkInstrument(b *testing.B) {
	wasm, err := os.ReadFile("testdata/shapes.wasm")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(wasm)))
	for b.Loop() {
		if _, err := Instrument(wasm); err != nil {
			b.Fatal(err)
		}
	}
}

// module builds a module of ntypes types [] -> [] and one function of type
// 0 with the given code (locals and body), exported as "f".
func module(ntypes int, fn []byte) []byte {
	typ := appendU32(nil, uint32(ntypes))
	for range ntypes {
		typ = append(typ, 0x60, 0, 0)
	}
	exp := appendU32(nil, 1)
	exp = appendName(exp, "f")
	exp = append(exp, 0, 0)
	code := appendU32(nil, 1)
	code = appendU32(code, uint32(len(fn)))
	code = append(code, fn...)
	return concat(hdr, sec(1, typ), sec(3, []byte{1, 0}), sec(7, exp), sec(10, code))
}

func nops(n int) []byte { return bytes.Repeat([]byte{0x01}, n) }

// Forms wazero reads that the meter does not: each hides a loop from a
// reader that takes one byte too few or too many, so each must be refused
// (and the module then compiled with wazero's own checks), never rewritten.
// Each original compiles in wazero.
func TestWazeroFormsRefused(t *testing.T) {
	simd := append([]byte{0, 0x02, 0x40, 0x0c, 0x00, 0xfd, 0x0c}, make([]byte, 16)...)
	simd = append(simd, 0x41, 0x00, 0xfd, 0x8c, 0x00) // 0x8c as one byte, then unreachable
	simd = append(simd, nops(8)...)
	simd = append(simd, 0x0b, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x02, 0x40, 0x0b, 0x0b)
	hidden := []byte{0x00, 0x1a, 0x1a, 0x0b, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x02, 0x40}
	sel := append([]byte{1, 1, 0x7f, 0x02, 0x40, 0x0c, 0x00, 0x1c, 0x01, 0x63, 0x1c, 0x20}, hidden...)
	sel = append(sel, nops(32-len(hidden))...)
	sel = append(sel, 0x0b, 0x0b)
	block := append([]byte{1, 1, 0x7f, 0x02, 0x63, 0x1c, 0x20, 0x00, 0x1a}, nops(24)...)
	block = append(block, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b, 0x1a, 0x0b)
	for _, tc := range []struct {
		name string
		wasm []byte
	}{
		{"block type (ref null 28)", module(29, block)},
		{"select (ref null 28)", module(29, sel)},
		{"local (ref null func)", module(1, []byte{1, 1, 0x63, 0x70, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b})},
		{"SIMD opcode 0x8c not followed by 0x01", module(1, simd)},
		{"block type (ref null 2) in two bytes", module(3, []byte{0, 0x02, 0xe3, 0x7f, 0x02, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b, 0x1a, 0x0b})},
		{"block type (ref null 2) in five bytes", module(3, []byte{0, 0x02, 0xe3, 0xff, 0xff, 0xff, 0x3f, 0x02, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b, 0x1a, 0x0b})},
		{"block type (ref 2) in two bytes", module(3, []byte{0, 0x02, 0xe4, 0x7f, 0x02, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00, 0x0b, 0x1a, 0x0b})},
		{"rec group of two types", concat(hdr, sec(1, []byte{1, 0x4e, 2, 0x60, 0, 0, 0x60, 0, 0}), sec(3, []byte{1, 1}),
			sec(10, []byte{1, 2, 0, 0x0b}))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rt := wazero.NewRuntime(ctx)
			defer rt.Close(ctx)
			if _, err := rt.CompileModule(ctx, tc.wasm); err != nil {
				t.Fatalf("the original does not compile in wazero: %v", err)
			}
			if out, err := Instrument(tc.wasm); !errors.Is(err, ErrUnsupported) || out != nil {
				t.Fatalf("Instrument = %d bytes, %v; want it refused", len(out), err)
			}
		})
	}
}

// A table's initializer expression (0x40 0x00 reftype limits expr) names
// a function too: call_indirect through it reaches the same function.
func TestTableInitializerRenumbered(t *testing.T) {
	tab := []byte{1, 0x40, 0x00, 0x70, 0x00, 0x01, 0xd2, 0x00, 0x0b} // 1 funcref, all (ref.func 0)
	exp := appendName([]byte{1}, "call")
	exp = append(exp, 0, 1)
	f0 := []byte{0, 0x41, 42, 0x0b}            // () -> 42
	f1 := []byte{0, 0x41, 0, 0x11, 0, 0, 0x0b} // call_indirect table[0]
	code := append([]byte{2, byte(len(f0))}, f0...)
	code = append(append(code, byte(len(f1))), f1...)
	wasm := concat(hdr, sec(1, []byte{1, 0x60, 0, 1, 0x7f}), sec(3, []byte{2, 0, 0}), sec(4, tab),
		sec(7, exp), sec(9, []byte{1, 3, 0x00, 1, 0x00}), sec(10, code))
	metered, err := Instrument(wasm)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{wasm, metered} {
		if got := call(t, instantiate(t, b, &refueler{fuel: 1000}), "call"); got != 42 {
			t.Fatalf("call() = %d, want 42", got)
		}
	}
}

// Custom sections other than the name section are left out (they may name
// code offsets the rewrite moved); label names, whose indices the
// countdowns' blocks shift, too.
func TestCustomSectionsLeftOut(t *testing.T) {
	bare := readFixture(t, "bare")
	labels := appendU32(nil, 1) // function 0: label 0 "l"
	labels = appendU32(labels, 0)
	labels = appendU32(labels, 1)
	labels = appendU32(labels, 0)
	labels = appendName(labels, "l")
	fnames := appendU32(nil, 1)
	fnames = appendU32(fnames, 0)
	fnames = appendName(fnames, "count")
	names := appendName(nil, "name")
	names = append(append(names, 1), appendU32(nil, uint32(len(fnames)))...)
	names = append(names, fnames...)
	names = append(append(names, 3), appendU32(nil, uint32(len(labels)))...)
	names = append(names, labels...)
	wasm := concat(bare, sec(0, appendName(nil, ".debug_line")), sec(0, names))
	metered, err := Instrument(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(metered, []byte(".debug_line")) {
		t.Error("the DWARF section was kept")
	}
	renamed := appendU32(nil, 1)
	renamed = appendU32(renamed, 1) // after the refuel import
	renamed = appendName(renamed, "count")
	want := appendName(nil, "name")
	want = append(append(want, 1), appendU32(nil, uint32(len(renamed)))...)
	want = append(want, renamed...)
	if !bytes.HasSuffix(metered, concat(sec(0, want))) {
		t.Error("the name section should end the module with its function names only")
	}
}

// FuzzInstrument: no input makes Instrument panic, and a module wazero
// compiles is either refused or rewritten into one it compiles too.
// (go test runs the seeds; go test -fuzz FuzzInstrument searches.)
func FuzzInstrument(f *testing.F) {
	for _, n := range []string{"shapes", "bare", "heavy"} {
		b, err := os.ReadFile("testdata/" + n + ".wasm")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { _ = rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := Instrument(b)
		if err != nil {
			return
		}
		orig, err := rt.CompileModule(ctx, b)
		if err != nil {
			return
		}
		_ = orig.Close(ctx)
		m, err := rt.CompileModule(ctx, out)
		if err != nil {
			t.Fatalf("the original compiles, the rewrite does not: %v", err)
		}
		_ = m.Close(ctx)
	})
}

// Work outside the count is charged: a bulk memory operation by its
// length (1 + n/4096), and an imported function's call refuels first.
// Without that, a loop of 4 MiB memory.fill calls ran 16,384 fills between
// two refuels.
func TestChargedWork(t *testing.T) {
	metered, err := Instrument(readFixture(t, "bulk"))
	if err != nil {
		t.Fatal(err)
	}
	rf := &refueler{fuel: 1 << 30}
	mod := instantiate(t, metered, rf)
	// fill(n, len): n fills of len bytes. The counter starts empty: the
	// first countdown refuels, then the charges add up.
	before := rf.calls
	call(t, mod, "fill", 10, 4<<20)
	if rf.calls != before+1 {
		t.Fatalf("refuel called %d times for one call, want 1", rf.calls-before)
	}
	small := &refueler{fuel: 3000}
	mod = instantiate(t, metered, small)
	call(t, mod, "fill", 10, 4<<20) // 10 fills of 1 + 4 MiB/4096 = 1,025 units each
	if want := refuels(3000, chargedFill(10, 1025)...); small.calls != want || want < 4 {
		t.Fatalf("refuel called %d times, want %d", small.calls, want)
	}
	imp := &refueler{fuel: 3000}
	mod = instantiate(t, metered, imp)
	call(t, mod, "imported", 10) // 10 calls of env.twice
	if want := refuels(3000, chargedImported(10)...); imp.calls != want || want != 11 {
		t.Fatalf("refuel called %d times, want %d", imp.calls, want)
	}
}

// chargedFill is the countdowns of fill(n, len): entry, then per
// iteration the loop header and the fill's charge.
func chargedFill(n int, charge int32) []int32 {
	costs := []int32{1}
	for range n {
		costs = append(costs, 1, charge)
	}
	return costs
}

const forced = -1

// chargedImported is the countdowns of imported(n): entry, then per
// iteration the loop header and the refuel before the imported call.
func chargedImported(n int) []int32 {
	costs := []int32{1}
	for range n {
		costs = append(costs, 1, forced)
	}
	return costs
}
