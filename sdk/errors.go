package sdk

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Errorf returns an *abi.Error; the host answers the CO with its code.
func Errorf(code abi.Code, msg string) error { return abi.Errorf(code, msg) }

// Error returns an *abi.Error whose message is parts joined, for building
// messages without fmt.
func Error(code abi.Code, parts ...string) error { return abi.Errorf(code, strings.Join(parts, "")) }

// Wrap adds what the module was doing to a host call's error and keeps its
// code, so the CO sees the host call's verdict (NOT_FOUND, ALREADY_EXISTS,
// RESOURCE_EXHAUSTED...) with the module's context. An error without a code
// becomes INTERNAL. Wrap(nil, ...) is nil.
func Wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	code := abi.CodeOf(err)
	msg := err.Error()
	if e, ok := err.(*abi.Error); ok {
		msg = e.Message
	}
	if code == abi.Unknown {
		code = abi.Internal
	}
	return abi.Errorf(code, what+": "+msg)
}
