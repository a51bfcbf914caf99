package sdk_test

import (
	"errors"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

func TestErrorf(t *testing.T) {
	err := sdk.Errorf(abi.InvalidArgument, "config quota=%s: want %s", "maybe", "auto, required or off")
	var e *abi.Error
	if !errors.As(err, &e) {
		t.Fatalf("Errorf returned %T, want *abi.Error", err)
	}
	if e.Code != abi.InvalidArgument || e.Message != "config quota=maybe: want auto, required or off" {
		t.Errorf("Errorf = %v %q", e.Code, e.Message)
	}
	if err := sdk.Errorf(abi.NotFound, "no such volume"); err.Error() != "NOT_FOUND: no such volume" {
		t.Errorf("Errorf without args = %q", err)
	}
	if err := sdk.Error(abi.NotFound, "source ", "v1", " is gone"); err.Error() != "NOT_FOUND: source v1 is gone" {
		t.Errorf("Error = %q", err)
	}
}
