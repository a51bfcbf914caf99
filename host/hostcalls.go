package host

import (
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
)

// DefaultHostCalls is every host call the daemon offers modules.
func DefaultHostCalls() map[string]hostcalls.Func { return catalog.All() }
