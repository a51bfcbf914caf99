package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wasmcsi/wasmcsi/abi/internal/wiregen/testdata/fixture"
)

// tinyGo returns the tinygo command the way the SDK's tests find it:
// $WASMCSI_TINYGO, else tinygo on PATH, else "".
func tinyGo() string {
	if p := os.Getenv("WASMCSI_TINYGO"); p != "" {
		return p
	}
	if p, err := exec.LookPath("tinygo"); err == nil {
		return p
	}
	return ""
}

// TestGuestToolchains builds testdata/guest with TinyGo and with standard
// Go for wasip1, runs it under wazero and round-trips a message through the
// guest's copy of the codec: the wire package and generated code must
// compile and behave the same on wasm32.
func TestGuestToolchains(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: skipping wasm builds")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go tool on PATH: ", err)
	}
	for _, tc := range []struct {
		name  string
		build func(t *testing.T, out string) *exec.Cmd
	}{
		{"tinygo", func(t *testing.T, out string) *exec.Cmd {
			tg := tinyGo()
			if tg == "" {
				if os.Getenv("WASMCSI_REQUIRE_TINYGO") != "" {
					t.Fatal("TinyGo required (WASMCSI_REQUIRE_TINYGO) but not found")
				}
				t.Skip("needs TinyGo: set WASMCSI_TINYGO (.ci/tinygo.sh prints it) or put tinygo on PATH")
			}
			return exec.Command(tg, "build", "-buildmode=c-shared", "-scheduler=none", "-no-debug", "-o", out, "./testdata/guest")
		}},
		{"go", func(t *testing.T, out string) *exec.Cmd {
			cmd := exec.Command(goTool, "build", "-buildmode=c-shared", "-o", out, "./testdata/guest")
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
			return cmd
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "guest.wasm")
			if b, err := tc.build(t, out).CombinedOutput(); err != nil {
				t.Fatalf("build guest: %v\n%s", err, b)
			}
			bin, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			runGuest(t, bin)
		})
	}
}

func runGuest(t *testing.T, bin []byte) {
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	t.Cleanup(func() { r.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	mod, err := r.InstantiateWithConfig(ctx, bin, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
	if err != nil {
		t.Fatalf("instantiate guest: %v", err)
	}
	res, err := mod.ExportedFunction("buffer").Call(ctx)
	if err != nil {
		t.Fatal(err)
	}
	addr := uint32(res[0])
	call := func(req []byte) (answer []byte, isErr bool) {
		t.Helper()
		if !mod.Memory().Write(addr, req) {
			t.Fatal("request does not fit guest memory")
		}
		res, err := mod.ExportedFunction("roundtrip").Call(ctx, uint64(len(req)))
		if err != nil {
			t.Fatalf("roundtrip: %v", err)
		}
		n := uint32(res[0])
		isErr = n&(1<<31) != 0
		n &^= 1 << 31
		answer, ok := mod.Memory().Read(addr, n)
		if !ok {
			t.Fatalf("answer of %d bytes is outside guest memory", n)
		}
		return append([]byte(nil), answer...), isErr
	}

	in := full()
	answer, isErr := call(in.AppendWire(nil))
	if isErr {
		t.Fatalf("guest could not decode: %s", answer)
	}
	var got fixture.Everything
	if err := got.UnmarshalWire(answer); err != nil {
		t.Fatalf("guest's answer does not decode: %v", err)
	}
	want := full()
	want.S += " (guest)"
	want.Sizes = append(want.Sizes, int64(len(want.Names)))
	if !reflect.DeepEqual(&got, want) {
		t.Fatalf("guest answered\n%+v\nwant\n%+v", &got, want)
	}

	// Garbage: field 16 (Inner) holding a name that is not UTF-8.
	answer, isErr = call([]byte{0x82, 0x01, 0x03, 0x0a, 0x01, 0xff})
	if !isErr || !strings.Contains(string(answer), "decode Everything field 16: decode Inner field 1") {
		t.Fatalf("guest answered %q (error %v) to garbage", answer, isErr)
	}
}
