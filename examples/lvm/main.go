// Package main is the lvm backend module: every volume is a logical volume
// on a volume group the operator already runs, thick (linear, striped or
// mirrored) or thin in a named thin pool, chosen per StorageClass by a
// device class. Thin volumes have instant snapshots, and restores and
// clones that share blocks with their origin, also into a larger volume.
// Nodes activate a volume's LV and the host formats and mounts it (mount
// access) or hands the device to the workload (block access).
//
// The module decides LV names, sizes, capacity and the order of the steps.
// It reaches the system only through the "lvm" host calls, confined to the
// VGs and thin pools its grant names; the host tags every LV it creates
// and shows the module no other, so an operator's own LVs in the same VG
// are out of its reach. It must never format, mount or write a volume
// itself (the host does that), and never import packages TinyGo cannot
// compile (fmt, encoding/json, reflection).
//
// Build it as a wasip1 reactor with either toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o lvm.wasm ./examples/lvm
//	tinygo build -target=wasip1 -buildmode=c-shared -scheduler=none -no-debug -o lvm.tinygo.wasm ./examples/lvm
package main

import "github.com/wasmcsi/wasmcsi/sdk/guest"

func init() { guest.Serve(New()) }

func main() {}
