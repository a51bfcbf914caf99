// Package main is the nfs backend module: shared filesystems over NFSv4.1
// and 4.2, which every node may mount at once (ReadWriteMany). It has two
// modes, chosen per StorageClass by the parameter "mode":
//
//   - server: volumes are folders in a pool on the storage host, with
//     their capacity enforced by project quotas (as localdir's), each
//     exported by the host's kernel nfsd on its own, to exactly the nodes
//     it is published to: ControllerPublishVolume adds the node's address
//     to the export's clients and ControllerUnpublishVolume takes it away
//     (fencing). Snapshots and clones are copies on the storage host
//     (reflinks where the pool's filesystem has them), expansion raises
//     the quota while the volume is in use.
//   - client: volumes are folders of an export of any NFS server the
//     operator names (server, share), made and removed through the
//     controller's mount of it; capacity is advisory there.
//
// The module reaches the system only through the host calls of the "dir",
// "nfsd", "nfs" and "net" families, confined to its granted roots. It
// never mounts anything but an NFS export in a granted folder, never
// exports anything to a client it was not told of, and never imports
// packages TinyGo cannot compile.
//
// Build it as a wasip1 reactor with either toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o nfs.wasm ./examples/nfs
//	tinygo build -target=wasip1 -buildmode=c-shared -scheduler=none -no-debug -o nfs.tinygo.wasm ./examples/nfs
package main

import "github.com/wasmcsi/wasmcsi/sdk/guest"

func init() { guest.Serve(New()) }

func main() {}
