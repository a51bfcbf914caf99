//go:build wasip1 && !tinygo

package guest

import (
	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// dispatch turns a panic in the backend into an INTERNAL answer. Standard
// Go's recover works on wasm; the instance stays usable.
func dispatch(op abi.Op, req []byte) (out []byte, code abi.Code) {
	defer func() {
		if r := recover(); r != nil {
			out, code = []byte("backend panic: "+panicString(r)), abi.Internal
		}
	}()
	return sdk.Dispatch(backend, op, req)
}

func panicString(r any) string {
	switch v := r.(type) {
	case string:
		return v
	case error:
		return v.Error()
	}
	return "non-error value"
}
