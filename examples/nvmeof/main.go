// Package main is the nvmeof backend module: network block volumes served
// by the kernel's NVMe target (nvmet) over TCP and reached by nodes with
// the kernel's NVMe/TCP initiator. Every volume is the one namespace of
// its own subsystem, backed by a file in the module's pool folder on the
// storage host; ControllerPublish allows the node's host NQN on the
// volume's subsystem and ControllerUnpublish denies it again, which also
// ends the node's controller (fencing); the node connects at stage (one
// controller per subsystem, so per volume, disconnected at unstage) and
// the host formats and mounts the namespace's disk (mount access) or hands
// it to the workload (block access). Snapshots and clones are reflinks of
// the volume files where the pool's filesystem has them, copies
// otherwise.
//
// The module decides names, sizes and the order of the steps. It reaches
// the system only through the host calls of the "file", "nvmet" and "nvme"
// families, confined to its granted roots: files in its pool folder,
// subsystems under a granted NQN prefix listening on granted addresses,
// connections to granted addresses. It must never format, mount or write
// a volume itself (the host does that), never touch a subsystem it did not
// make, and never import packages TinyGo cannot compile (fmt,
// encoding/json, reflection).
//
// Build it as a wasip1 reactor with either toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o nvmeof.wasm ./examples/nvmeof
//	tinygo build -target=wasip1 -buildmode=c-shared -scheduler=none -no-debug -o nvmeof.tinygo.wasm ./examples/nvmeof
package main

import "github.com/wasmcsi/wasmcsi/sdk/guest"

func init() { guest.Serve(New()) }

func main() {}
