package meter

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/tetratelabs/wazero"
)

// TestTablesGrowWithoutLimit shows what LimitTables is for: the fixture's
// first table, which declares no maximum, grows by two million entries
// (16 MiB of Go heap in wazero) as it is.
func TestTablesGrowWithoutLimit(t *testing.T) {
	mod := instantiate(t, readFixture(t, "tables"), &refueler{fuel: 1000})
	if got := int32(call(t, mod, "grow", 2_000_000)); got != 3 {
		t.Fatalf("grow(2,000,000) = %d, want the old size 3", got)
	}
	if got := call(t, mod, "size"); got != 2_000_003 {
		t.Fatalf("size = %d, want 2,000,003", got)
	}
}

func TestLimitTables(t *testing.T) {
	limited, err := LimitTables(readFixture(t, "tables"), 100)
	if err != nil {
		t.Fatal(err)
	}
	mod := instantiate(t, limited, &refueler{fuel: 1000})
	// Minimums 3 + 2; the second table, which declares a maximum of 10,
	// may grow by 8; the first by the remaining 87.
	for _, c := range []struct {
		fn   string
		arg  uint64
		want int32
	}{
		{"grow2", 9, -1}, {"grow2", 8, 2}, {"grow2", 1, -1}, {"size2", 0, 10},
		{"grow", 88, -1}, {"grow", 87, 3}, {"grow", 1, -1}, {"size", 0, 90},
	} {
		var args []uint64
		if c.fn == "grow" || c.fn == "grow2" {
			args = []uint64{c.arg}
		}
		if got := int32(call(t, mod, c.fn, args...)); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.fn, args, got, c.want)
		}
	}
}

// TestLimitTablesAfterInstrument: the two rewrites compose, and a guest
// growing its table in a loop stops at the limit.
func TestLimitTablesAfterInstrument(t *testing.T) {
	metered, err := Instrument(readFixture(t, "tables"))
	if err != nil {
		t.Fatal(err)
	}
	limited, err := LimitTables(metered, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	rf := &refueler{fuel: 1000}
	mod := instantiate(t, limited, rf)
	if got := call(t, mod, "flood"); got != 1<<16-10 {
		t.Fatalf("flood = %d, want %d (the budget less the second table's maximum 10)", got, 1<<16-10)
	}
	if rf.calls == 0 {
		t.Fatal("the flood never refuelled: the loop counter is gone")
	}
}

func TestLimitTablesRefusesLargeMinimums(t *testing.T) {
	_, err := LimitTables(readFixture(t, "tables"), 4)
	if !errors.Is(err, ErrTables) || errors.Is(err, ErrUnsupported) {
		t.Fatalf("minimums 3+2 against a limit of 4: err = %v, want ErrTables", err)
	}
	if _, err := LimitTables(readFixture(t, "tables"), 5); err != nil {
		t.Fatalf("minimums 3+2 against a limit of 5: %v", err)
	}
}

func TestLimitTablesWithoutTables(t *testing.T) {
	bare := readFixture(t, "bare")
	got, err := LimitTables(bare, 0)
	if err != nil || !bytes.Equal(got, bare) {
		t.Fatalf("a module without tables: err %v, changed %v", err, !bytes.Equal(got, bare))
	}
	if _, err := LimitTables([]byte("\x00asm\x02\x00\x00\x00"), 10); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("version 2: err = %v, want ErrUnsupported", err)
	}
}

// TestLimitTablesKeepsInitializers reads the form of a table with an
// initializer (0x40 0x00 reftype limits expr), which wazero does not
// compile, and keeps its expression.
func TestLimitTablesKeepsInitializers(t *testing.T) {
	body := []byte{0x02,
		0x40, 0x00, 0x70, 0x00, 0x01, 0xd2, 0x00, 0x0b, // funcref, min 1, init ref.func 0
		0x6f, 0x01, 0x02, 0x04, // externref, min 2, max 4
	}
	got, err := limitTables(body, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x02,
		0x40, 0x00, 0x70, 0x01, 0x01, 0x06, 0xd2, 0x00, 0x0b, // max 1 + (10 - 1 - 4)
		0x6f, 0x01, 0x02, 0x04,
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got % x\nwant % x", got, want)
	}
	for _, bad := range [][]byte{
		{0x01, 0x40, 0x01, 0x70, 0x00, 0x01, 0x0b},       // reserved byte
		{0x01, 0x40, 0x00, 0x70, 0x00, 0x01, 0x20, 0x00}, // local.get in an initializer
		{0x01, 0x70, 0x04, 0x01},                         // table64 flags
		{0x01, 0x70, 0x01, 0x05, 0x04},                   // max below min
		{0x01, 0x70, 0x00, 0x01, 0x00},                   // trailing byte
	} {
		if _, err := limitTables(bad, 10); !errors.Is(err, ErrUnsupported) {
			t.Errorf("% x: err = %v, want ErrUnsupported", bad, err)
		}
	}
}

func FuzzLimitTables(f *testing.F) {
	for _, name := range []string{"tables", "shapes", "bare", "bulk"} {
		b, err := os.ReadFile("testdata/" + name + ".wasm")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint64(100))
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { _ = rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, wasm []byte, budget uint64) {
		out, err := LimitTables(wasm, budget)
		if err != nil {
			return
		}
		if _, cerr := rt.CompileModule(ctx, wasm); cerr != nil {
			return
		}
		if _, cerr := rt.CompileModule(ctx, out); cerr != nil {
			t.Fatalf("the input compiles, its limited copy does not: %v", cerr)
		}
	})
}

// wazero keeps a structure per element entry and per global in every
// instance, outside the memory limit: their numbers are bounded too.
func TestLimitTablesCountsElementsAndGlobals(t *testing.T) {
	module := func(id byte, body []byte) []byte {
		b := []byte("\x00asm\x01\x00\x00\x00")
		b = append(b, id)
		b = appendU32(b, uint32(len(body)))
		return append(b, body...)
	}
	// One segment of each of the eight forms, 1 + 2 + ... + 8 entries.
	elems := []byte{0x08,
		0x00, 0x41, 0x00, 0x0b, 0x01, 0x00, // active, table 0: offset, 1 function index
		0x01, 0x00, 0x02, 0x00, 0x00, // passive, elemkind: 2
		0x02, 0x00, 0x41, 0x00, 0x0b, 0x00, 0x03, 0x00, 0x00, 0x00, // active, table index: 3
		0x03, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, // declarative: 4
		0x04, 0x41, 0x00, 0x0b, 0x05, 0xd2, 0x00, 0x0b, 0xd2, 0x00, 0x0b, 0xd2, 0x00, 0x0b, 0xd2, 0x00, 0x0b, 0xd0, 0x70, 0x0b, // expressions: 5
		0x05, 0x70, 0x06, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, // 6
		0x06, 0x00, 0x41, 0x00, 0x0b, 0x70, 0x07, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, // 7
		0x07, 0x70, 0x08, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, 0xd0, 0x70, 0x0b, // 8
	}
	if n, err := elementEntries(elems); err != nil || n != 8+36 {
		t.Fatalf("elementEntries = %d, %v; want 44 (8 segments, 36 entries)", n, err)
	}
	for _, c := range []struct {
		name string
		wasm []byte
		need uint64
	}{
		{"elements", module(secElement, elems), 44},
		{"globals", module(secGlobal, []byte{0x02, 0x7f, 0x00, 0x41, 0x00, 0x0b, 0x7f, 0x00, 0x41, 0x00, 0x0b}), 2},
	} {
		if _, err := LimitTables(c.wasm, c.need-1); !errors.Is(err, ErrTables) {
			t.Errorf("%s with a limit of %d: err = %v, want ErrTables", c.name, c.need-1, err)
		}
		if _, err := LimitTables(c.wasm, c.need); err != nil {
			t.Errorf("%s with a limit of %d: %v", c.name, c.need, err)
		}
	}
	if _, err := elementEntries([]byte{0x01, 0x08}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("element flags 8: err = %v, want ErrUnsupported", err)
	}
}
