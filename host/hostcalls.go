package host

import (
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
)

// DefaultHostCalls is every host call the daemon offers modules, with the
// iSCSI initiator's state under stateDir.
func DefaultHostCalls(stateDir string) (map[string]hostcalls.Func, error) {
	return catalog.New(catalog.Options{StateDir: stateDir})
}
