package abi_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestErrorfFormats(t *testing.T) {
	cases := []struct {
		name string
		err  *abi.Error
		want string
	}{
		{"constant", abi.Errorf(abi.NotFound, "no such volume"), "no such volume"},
		{"verbs", abi.Errorf(abi.OutOfRange, "%q has %d bytes, want %d", "v1", 10, 20), `"v1" has 10 bytes, want 20`},
		{"percent", abi.Errorf(abi.Internal, "100%% full"), "100% full"},
		{"error operand", abi.Errorf(abi.Internal, "stat: %v", fs.ErrNotExist), "stat: file does not exist"},
		{"%w formats like %v", abi.Errorf(abi.Internal, "stat: %w", fs.ErrNotExist), "stat: file does not exist"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.err.Message != c.want {
				t.Errorf("Message = %q, want %q", c.err.Message, c.want)
			}
			if c.err.Code == abi.OK || c.err.Error() != c.err.Code.String()+": "+c.want {
				t.Errorf("Error() = %q", c.err.Error())
			}
		})
	}
}

// An *Error crosses the boundary as code and message, so Errorf keeps no
// chain; wrapping an *Error with fmt.Errorf keeps its code.
func TestErrorfDoesNotWrap(t *testing.T) {
	err := abi.Errorf(abi.NotFound, "stat: %w", fs.ErrNotExist)
	if errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = true; an *abi.Error must not carry a chain the module cannot see", err)
	}
	outer := fmt.Errorf("delete v1: %w", err)
	if got := abi.CodeOf(outer); got != abi.NotFound {
		t.Errorf("CodeOf(%v) = %v, want NOT_FOUND", outer, got)
	}
}
