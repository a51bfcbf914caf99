// Package main is the iscsi backend module: network block volumes served
// by the kernel's LIO target and reached by nodes over iSCSI. Every volume
// is one LUN of one shared target, backed by a file in the module's pool
// folder on the target host; the node that publishes it logs in to the
// target (one session per target, shared by every volume of the node) and
// the host formats and mounts the LUN's disk (mount access) or hands it to
// the workload (block access). Snapshots and clones are reflinks of the
// volume files where the pool's filesystem has them, copies otherwise.
//
// The module decides names, LUN numbers, sizes and the order of the steps.
// It reaches the system only through the host calls of the "file", "lio"
// and "iscsi" families, confined to its granted roots: files in its pool
// folder, targets under a granted IQN prefix listening on granted portals,
// logins to granted portals. It must never format, mount or write a volume
// itself (the host does that), never touch a LUN it did not make, never
// put a CHAP secret into a context, an error or a log line, and never
// import packages TinyGo cannot compile (fmt, encoding/json, reflection).
//
// Build it as a wasip1 reactor with either toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o iscsi.wasm ./examples/iscsi
//	tinygo build -target=wasip1 -buildmode=c-shared -scheduler=none -no-debug -o iscsi.tinygo.wasm ./examples/iscsi
package main

import "github.com/wasmcsi/wasmcsi/sdk/guest"

func init() { guest.Serve(New()) }

func main() {}
