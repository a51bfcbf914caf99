// Package abi is the contract between the wasmcsi host and its backend modules:
// the names and signatures of every export and import (see ABI.md), the
// messages that cross the boundary, and the status codes they carry.
//
// abi depends on nothing else of wasmcsi, and its codec on no reflection, so
// that the host, the SDK and guests built with TinyGo or standard Go share one
// copy (only Errorf formats with fmt, and a guest links fmt only if it calls
// Errorf).
// It must never grow host-only or guest-only code.
package abi

import "fmt"

// Version is the ABI version a module reports from its
// wasmcsi_abi_version export. The host refuses every other value.
const Version = 1

// HostModule is the import module name of every host function.
const HostModule = "wasmcsi"

// Code is the status of an operation or host call. Its values are the gRPC
// status code numbers, so the host maps a module's answer to the CO without a
// table and a module author can read the CSI spec's error tables literally.
type Code uint32

const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = [...]string{
	"OK", "CANCELED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
	"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "CODE(" + itoa(uint64(c)) + ")"
}

// Valid reports whether c is one of the codes above; the host treats any other
// value from a module as a garbage answer (INTERNAL).
func (c Code) Valid() bool { return int(c) < len(codeNames) }

// Error is an error with a status code. Host calls return it to modules and
// modules return it to the host; the host's gRPC edge turns it into a status.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return e.Code.String() + ": " + e.Message }

// Errorf returns an *Error with code and the message fmt.Errorf would
// format. %w is accepted and formats its operand like %v, but the result does
// not wrap it: an *Error crosses the boundary as code and message only, so
// what it wrapped would be lost on the way, and a chain that errors.Is finds
// in a native test but not in the module would mislead. Wrap an *Error with
// fmt.Errorf("...: %w", err) instead to keep both.
//
// Errorf links fmt (and reflect) into a guest that calls it; a guest that
// stays without fmt builds &Error{Code: code, Message: msg}, or uses sdk.Error
// or sdk.Errorf without args.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Errorf(format, args...).Error()}
}

// CodeOf returns the code of err: the Code of an *Error anywhere in its
// chain, OK for nil, Unknown otherwise.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	for err != nil {
		if e, ok := err.(*Error); ok {
			return e.Code
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			break
		}
		err = u.Unwrap()
	}
	return Unknown
}

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return string(b[i:])
}

// Message is what the generated codec gives every message type (see CODEC.md).
type Message interface {
	AppendWire([]byte) []byte
	UnmarshalWire([]byte) error
}
