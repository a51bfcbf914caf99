// Package main is the dmthin backend module: every volume is a thin device
// in one device-mapper thin pool on the node. Volumes are provisioned
// instantly and take data blocks only as they are written; snapshots,
// clones and restores are thin snapshots that share blocks with their
// origin until either side writes. Nodes activate a volume's thin device
// and the host formats and mounts it (mount access) or hands the device to
// the workload (block access).
//
// The module decides thin ids, sizes, capacity accounting and the order of
// the steps. It reaches the system only through the host calls of the "dm",
// "file" and "loop" families, confined to its granted roots: dm names under
// a granted prefix, record files in its state folder, loop devices over
// files in granted folders. It must never format, mount or write a volume
// itself (the host does that), never act on a pool other than the one
// configured, and never import packages TinyGo cannot compile (fmt,
// encoding/json, reflection).
//
// Build it as a wasip1 reactor with either toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o dmthin.wasm ./examples/dmthin
//	tinygo build -target=wasip1 -buildmode=c-shared -scheduler=none -no-debug -o dmthin.tinygo.wasm ./examples/dmthin
package main

import "github.com/wasmcsi/wasmcsi/sdk/guest"

func init() { guest.Serve(New()) }

func main() {}
