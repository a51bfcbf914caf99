//go:build wasip1 && tinygo

package guest

import (
	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// dispatch calls the backend directly: recover does not work on TinyGo's
// wasm32, so a panic traps; the host fails that call, logs the guest's
// stderr and discards the instance.
func dispatch(op abi.Op, req []byte) ([]byte, abi.Code) {
	return sdk.Dispatch(backend, op, req)
}
