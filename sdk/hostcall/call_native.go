//go:build !wasip1

package hostcall

import (
	"errors"
	"os"

	"github.com/wasmcsi/wasmcsi/abi"
)

var host Host

// SetHost installs the host that answers calls in native builds. Tests of
// module logic install a fake or sdk/moduletest.RealHost; nil removes it.
func SetHost(h Host) { host = h }

// call ignores the import function: the name selects the host's answer.
func call(_ rawFunc, name string, req, resp abi.Message) error {
	if host == nil {
		return &abi.Error{Code: abi.Unavailable, Message: "no host installed for " + name + " (hostcall.SetHost)"}
	}
	out, err := host(name, req.AppendWire(nil))
	if err != nil {
		// As the daemon does (modules/instance.go): the code of an
		// *abi.Error anywhere in the chain reaches the module.
		var e *abi.Error
		switch {
		case !errors.As(err, &e) || e.Code == abi.OK || !e.Code.Valid():
			return &abi.Error{Code: abi.Internal, Message: err.Error()}
		case e == err:
			return &abi.Error{Code: e.Code, Message: e.Message}
		default:
			return &abi.Error{Code: e.Code, Message: err.Error()}
		}
	}
	return decode(abi.OK, out, resp)
}

func logLine(level abi.LogLevel, msg string) {
	if level >= abi.LogWarn {
		os.Stderr.WriteString(msg + "\n")
	}
}
