package host_test

// The fault, escape, liar, badnode and slow backends are hand-written .wat
// files built with wat2wasm (Debian: wabt).
//go:generate wat2wasm testdata/escape.wat -o testdata/escape.wasm
//go:generate wat2wasm testdata/fault.wat -o testdata/fault.wasm
//go:generate wat2wasm testdata/liar.wat -o testdata/liar.wasm
//go:generate wat2wasm testdata/bloat.wat -o testdata/bloat.wasm
//go:generate wat2wasm testdata/badnode.wat -o testdata/badnode.wasm
//go:generate wat2wasm testdata/slow.wat -o testdata/slow.wasm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/modules/wattest"

	"github.com/wasmcsi/wasmcsi/abi"
)

// fixtureInfo is the BackendInfo each fixture's backend_info answers, as
// written by hand into its data segment at offset 0.
var fixtureInfo = map[string]abi.BackendInfo{
	"fault":   {Name: "fault", Version: "1.0.0", Description: "misbehaves on demand", Mount: true},
	"escape":  {Name: "escape", Version: "1.0.0", Description: "stages outside its roots", Mount: true},
	"liar":    {Name: "liar", Version: "1.0.0", Description: "answers IDs it should not", Mount: true, Ephemeral: true},
	"bloat":   {Name: "bloat", Version: "1.0.0", Description: "oversized answers", Mount: true},
	"badnode": {Name: "badnode", Version: "1.0.0", Description: "node_info fails", Mount: true},
	"slow":    {Name: "slow", Version: "1.0.0", Description: "hangs on demand", Mount: true},
}

// TestFixturesMatchWat rebuilds every testdata/*.wat with wat2wasm and
// checks that the committed .wasm is what it produces.
func TestFixturesMatchWat(t *testing.T) {
	wattest.CheckFixtures(t, "fixtures_test.go", "./host")
}

// TestFixturesBackendInfo checks that each fixture's hand-written
// backend_info bytes are the codec's encoding of fixtureInfo, and that
// backend_info answers all of them.
func TestFixturesBackendInfo(t *testing.T) {
	for name, info := range fixtureInfo {
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("testdata", name+".wat"))
			if err != nil {
				t.Fatal(err)
			}
			enc := info.AppendWire(nil)
			data := `(data (i32.const 0) "` + watString(enc) + `")`
			if !bytes.Contains(src, []byte(data)) {
				t.Errorf("testdata/%s.wat lacks the encoding of %+v:\n%s", name, info, data)
			}
			answer := fmt.Sprintf("(call $response_write (i32.const 0) (i32.const %d))", len(enc))
			if !bytes.Contains(src, []byte(answer)) {
				t.Errorf("testdata/%s.wat: backend_info should answer %d bytes: %s", name, len(enc), answer)
			}
			var back abi.BackendInfo
			if err := back.UnmarshalWire(enc); err != nil || back.Name != info.Name || !back.Mount {
				t.Errorf("encoding does not decode back: %+v, %v", back, err)
			}
		})
	}
}

// watString writes b as the contents of a .wat string literal.
func watString(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			sb.WriteByte(c)
		} else {
			fmt.Fprintf(&sb, `\%02x`, c)
		}
	}
	return sb.String()
}
