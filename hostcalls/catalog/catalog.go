// Package catalog is the list of every host call the daemon offers to
// modules. Adding a family to the daemon means adding its Bindings here;
// nothing else in the host names host calls.
package catalog

import (
	"fmt"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/dirpool"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
)

// All returns every host call by import name. It panics on a duplicate
// name, which is a programming error caught by the package's test.
func All() map[string]hostcalls.Func {
	out := map[string]hostcalls.Func{}
	for _, family := range [][]hostcalls.Func{
		dirpool.Bindings(),
		mount.Bindings(),
		filepool.Bindings(),
		loop.Bindings(),
		dm.Bindings(),
	} {
		for _, f := range family {
			if _, dup := out[f.Name]; dup {
				panic(fmt.Sprintf("catalog: host call %q declared twice", f.Name))
			}
			out[f.Name] = f
		}
	}
	return out
}
