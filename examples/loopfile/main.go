// Package main is the loopfile backend module: every volume is one file in
// the module's pool folder, sparse or preallocated, that nodes attach as a
// loop device; the host formats and mounts it (mount access) or hands the
// device to the workload (block access). Snapshots and clones are reflinks
// where the pool's filesystem has them, hole-keeping copies otherwise.
//
// The module decides names, sizes, placement and the order of the steps; it
// reaches the system only through the host calls of the "file" and "loop"
// families, confined to its granted roots. It must never name a path outside
// its pool folder, never format, mount or write a volume itself (the host
// does that), and never import packages TinyGo cannot compile (fmt,
// encoding/json, reflection).
//
// Build it as a wasip1 reactor with either toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o loopfile.wasm ./examples/loopfile
//	tinygo build -target=wasip1 -buildmode=c-shared -scheduler=none -no-debug -o loopfile.wasm ./examples/loopfile
package main

import "github.com/wasmcsi/wasmcsi/sdk/guest"

func init() { guest.Serve(New()) }

func main() {}
