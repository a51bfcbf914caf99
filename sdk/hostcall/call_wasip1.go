//go:build wasip1

package hostcall

import (
	"unsafe"

	"github.com/wasmcsi/wasmcsi/abi"
)

//go:wasmimport wasmcsi result_read
func resultRead(buf unsafe.Pointer, limit uint32) uint32

//go:wasmimport wasmcsi log
func logWrite(level int32, buf unsafe.Pointer, n uint32)

// rawFunc is the shape of every host-call import (abi.HostCallSignature).
type rawFunc func(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

// Buffers reused across calls: an instance runs one call at a time. Most
// answers fit outBuf; larger ones are fetched whole with result_read, so no
// host call runs twice.
var (
	reqBuf []byte
	outBuf = make([]byte, 4096)
)

func call(fn rawFunc, _ string, req, resp abi.Message) error {
	reqBuf = req.AppendWire(reqBuf[:0])
	var reqPtr unsafe.Pointer
	if len(reqBuf) > 0 {
		reqPtr = unsafe.Pointer(&reqBuf[0])
	}
	code, n := abi.UnpackResult(fn(reqPtr, uint32(len(reqBuf)), unsafe.Pointer(&outBuf[0]), uint32(len(outBuf))))
	out := outBuf[:0]
	if n <= uint32(len(outBuf)) {
		out = outBuf[:n]
	} else {
		out = make([]byte, n)
		resultRead(unsafe.Pointer(&out[0]), n)
	}
	return decode(code, out, resp)
}

func logLine(level abi.LogLevel, msg string) {
	if len(msg) == 0 {
		return
	}
	logWrite(int32(level), unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
}

// SetHost is a no-op in a module: the daemon is the host.
func SetHost(Host) {}
