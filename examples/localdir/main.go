// Command localdir is a wasmcsi backend module: volumes are directories in
// a pool folder the operator grants. Build it as a wasip1 reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o localdir.wasm ./examples/localdir
//	tinygo build -buildmode=c-shared -scheduler=none -no-debug -o localdir.tinygo.wasm ./examples/localdir
package main

import "github.com/wasmcsi/wasmcsi/sdk/guest"

func init() { guest.Serve(New()) }

func main() {}
