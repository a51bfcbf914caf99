package meter

//go:generate wat2wasm testdata/shapes.wat -o testdata/shapes.wasm
//go:generate wat2wasm testdata/bare.wat -o testdata/bare.wasm
//go:generate wat2wasm testdata/heavy.wat -o testdata/heavy.wasm

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
		// entry, n+1 loop headers ($twice is imported: no countdown)
		{"sum", []uint64{100_000}, 1 + 100_001},
		// entry, n loop headers
		{"params", []uint64{5_000}, 1 + 5_000},
		// entry, n outer and n*n inner loop headers, and the entries of
		// $inc and $dec, called when (i+j) % 3 is 0 or 1: 2n*n/3 times
		{"nested", []uint64{300}, 1 + 300 + 300*300 + 2*300*300/3},
		{"mem", nil, 1},
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
// starting from an empty counter and answering fuel each time.
func refuels(fuel int32, costs ...int32) int {
	var f int32
	n := 0
	for _, c := range costs {
		if f -= c; f < 1 {
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
