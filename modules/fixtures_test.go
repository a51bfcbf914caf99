package modules

// The fixtures are hand-written .wat files built with wat2wasm (Debian: wabt).
//go:generate wat2wasm testdata/badcore.wat -o testdata/badcore.wasm
//go:generate wat2wasm testdata/badsig.wat -o testdata/badsig.wasm
//go:generate wat2wasm testdata/badversion.wat -o testdata/badversion.wasm
//go:generate wat2wasm testdata/bigmin.wat -o testdata/bigmin.wasm
//go:generate wat2wasm testdata/bigtable.wat -o testdata/bigtable.wasm
//go:generate wat2wasm testdata/flood.wat -o testdata/flood.wasm
//go:generate wat2wasm testdata/garbage.wat -o testdata/garbage.wasm
//go:generate wat2wasm testdata/good.wat -o testdata/good.wasm
//go:generate wat2wasm testdata/grow.wat -o testdata/grow.wasm
//go:generate wat2wasm testdata/hostloop.wat -o testdata/hostloop.wasm
//go:generate wat2wasm testdata/hugemax.wat -o testdata/hugemax.wasm
//go:generate wat2wasm testdata/iovecs.wat -o testdata/iovecs.wasm
//go:generate wat2wasm testdata/loop.wat -o testdata/loop.wasm
//go:generate wat2wasm testdata/noinfo.wat -o testdata/noinfo.wasm
//go:generate wat2wasm testdata/nomemory.wat -o testdata/nomemory.wasm
//go:generate wat2wasm testdata/noisy.wat -o testdata/noisy.wasm
//go:generate wat2wasm testdata/trap.wat -o testdata/trap.wasm
//go:generate wat2wasm testdata/start.wat -o testdata/start.wasm
//go:generate wat2wasm testdata/startloop.wat -o testdata/startloop.wasm
//go:generate wat2wasm testdata/tablegrow.wat -o testdata/tablegrow.wasm
//go:generate wat2wasm testdata/ungranted.wat -o testdata/ungranted.wasm
//go:generate wat2wasm testdata/unknownimport.wat -o testdata/unknownimport.wasm

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/modules/wattest"
)

// TestFixturesMatchWat rebuilds every testdata/*.wat with wat2wasm and
// checks that the committed .wasm is what it produces.
func TestFixturesMatchWat(t *testing.T) {
	wattest.CheckFixtures(t, "fixtures_test.go", "./modules")
}
