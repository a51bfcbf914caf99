// Package hostcall is how a backend module uses the privileged primitives
// the operator granted it: one Go function per host call, each taking and
// returning abi messages. In a wasip1 build every function is a
// `wasmcsi.<name>` import; the Go and TinyGo linkers keep only the imports a
// module really calls, so the host can check a module's grants at load.
//
// In a native build (unit tests of module logic) the calls go to the
// function installed with SetHost: a fake, or the daemon's real
// implementations (sdk/moduletest.RealHost).
package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// Host answers host calls in native builds: name is the import name
// ("dir_create"), req the encoded request; the result is the encoded
// response or an error (an *abi.Error keeps its code).
type Host func(name string, req []byte) ([]byte, error)

// Log writes one line to the daemon's log, attributed to the module.
func Log(level abi.LogLevel, msg string) { logLine(level, msg) }

// Logf is Log without fmt: parts are concatenated.
func Logf(level abi.LogLevel, parts ...string) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	b := make([]byte, 0, n)
	for _, p := range parts {
		b = append(b, p...)
	}
	logLine(level, string(b))
}

// decode turns a host call's result into resp or an error.
func decode(code abi.Code, out []byte, resp abi.Message) error {
	if code != abi.OK {
		if !code.Valid() {
			code = abi.Internal
		}
		return &abi.Error{Code: code, Message: string(out)}
	}
	if resp == nil {
		return nil
	}
	if err := resp.UnmarshalWire(out); err != nil {
		return &abi.Error{Code: abi.Internal, Message: "host answer does not decode: " + err.Error()}
	}
	return nil
}
