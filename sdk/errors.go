package sdk

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Errorf returns an *abi.Error whose message is formatted as by abi.Errorf
// (fmt.Errorf's verbs; %w formats its operand but does not wrap). Without
// args the format is the message as written and the module links no fmt
// (the call inlines to a plain *abi.Error); a message with a literal % goes
// through Error. Error also builds messages from string parts without fmt.
func Errorf(code abi.Code, format string, args ...any) error {
	if len(args) == 0 {
		return &abi.Error{Code: code, Message: format}
	}
	return abi.Errorf(code, format, args...)
}

// Error returns an *abi.Error whose message is parts joined, for building
// messages without fmt.
func Error(code abi.Code, parts ...string) error {
	return &abi.Error{Code: code, Message: strings.Join(parts, "")}
}

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
	return &abi.Error{Code: code, Message: what + ": " + msg}
}
