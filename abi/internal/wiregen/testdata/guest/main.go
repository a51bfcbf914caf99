// Command guest is a wasip1 reactor for wiregen's toolchain test: it decodes
// a fixture message, changes it and encodes the answer, so that the codec
// and the generated code are proven to compile and run under TinyGo and
// standard Go on wasm32. It must never be used outside that test.
package main

import (
	"unsafe"

	"github.com/wasmcsi/wasmcsi/abi/internal/wiregen/testdata/fixture"
)

// buf is where the test writes the request and reads the answer.
var buf [1 << 16]byte

// errFlag marks an answer that is an error text instead of a message.
const errFlag = 1 << 31

//go:wasmexport buffer
func buffer() uint32 { return uint32(uintptr(unsafe.Pointer(&buf[0]))) }

// roundtrip decodes the n-byte Everything in buf, appends " (guest)" to S
// and the number of Names to Sizes, and writes the encoded result to buf.
// It returns the answer's length, with errFlag set when the answer is the
// decoding error's text.
//
//go:wasmexport roundtrip
func roundtrip(n uint32) uint32 {
	if n > uint32(len(buf)) {
		return errFlag
	}
	var m fixture.Everything
	if err := m.UnmarshalWire(buf[:n]); err != nil {
		return errFlag | uint32(copy(buf[:], err.Error()))
	}
	m.S += " (guest)"
	m.Sizes = append(m.Sizes, int64(len(m.Names)))
	out := m.AppendWire(make([]byte, 0, 1024))
	if len(out) > len(buf) {
		return errFlag
	}
	return uint32(copy(buf[:], out))
}

func main() {}
