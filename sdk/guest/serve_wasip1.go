//go:build wasip1

package guest

import (
	"unsafe"

	"github.com/wasmcsi/wasmcsi/abi"
)

//go:wasmimport wasmcsi request_read
func requestRead(buf unsafe.Pointer, limit uint32) uint32

//go:wasmimport wasmcsi response_write
func responseWrite(buf unsafe.Pointer, n uint32)

// reqBuf is reused across calls: an instance runs one call at a time.
var reqBuf []byte

// serve runs one operation: pull the request, dispatch, push the answer.
func serve(op abi.Op) uint32 {
	if backend == nil {
		msg := "module registered no backend (call guest.Serve in init)"
		responseWrite(unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
		return uint32(abi.Internal)
	}
	growHeap()
	n := requestRead(nil, 0)
	if uint32(cap(reqBuf)) < n {
		reqBuf = make([]byte, n)
	}
	req := reqBuf[:n]
	if n > 0 {
		requestRead(unsafe.Pointer(&req[0]), n)
	}
	out, code := dispatch(op, req)
	if len(out) > 0 {
		responseWrite(unsafe.Pointer(&out[0]), uint32(len(out)))
	}
	return uint32(code)
}

//go:wasmexport wasmcsi_abi_version
func abiVersion() uint32 { return abi.Version }
