//go:build wasip1

package guest

import (
	"unsafe"

	"github.com/wasmcsi/wasmcsi/abi"
)

//go:wasmimport wasmcsi request_read
func requestRead(buf unsafe.Pointer, limit uint32) uint32

//go:wasmimport wasmcsi response_write
func responseWrite(buf unsafe.Pointer, n uint32)

// reqBuf is reused across calls: an instance runs one call at a time.
var reqBuf []byte

// serve runs one operation: pull the request, dispatch, push the answer.
func serve(op abi.Op) uint32 {
	if backend == nil {
		msg := "module registered no backend (call guest.Serve in init)"
		responseWrite(unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
		return uint32(abi.Internal)
	}
	n := requestRead(nil, 0)
	if uint32(cap(reqBuf)) < n {
		reqBuf = make([]byte, n)
	}
	req := reqBuf[:n]
	if n > 0 {
		requestRead(unsafe.Pointer(&req[0]), n)
	}
	out, code := dispatch(op, req)
	if len(out) > 0 {
		responseWrite(unsafe.Pointer(&out[0]), uint32(len(out)))
	}
	return uint32(code)
}

//go:wasmexport wasmcsi_abi_version
func abiVersion() uint32 { return abi.Version }

//go:wasmexport backend_info
func opInfo() uint32 { return serve(abi.OpInfo) }

//go:wasmexport configure
func opConfigure() uint32 { return serve(abi.OpConfigure) }

//go:wasmexport create_volume
func opCreateVolume() uint32 { return serve(abi.OpCreateVolume) }

//go:wasmexport delete_volume
func opDeleteVolume() uint32 { return serve(abi.OpDeleteVolume) }

//go:wasmexport expand_volume
func opExpandVolume() uint32 { return serve(abi.OpExpandVolume) }

//go:wasmexport modify_volume
func opModifyVolume() uint32 { return serve(abi.OpModifyVolume) }

//go:wasmexport create_snapshot
func opCreateSnapshot() uint32 { return serve(abi.OpCreateSnapshot) }

//go:wasmexport delete_snapshot
func opDeleteSnapshot() uint32 { return serve(abi.OpDeleteSnapshot) }

//go:wasmexport get_capacity
func opGetCapacity() uint32 { return serve(abi.OpGetCapacity) }

//go:wasmexport controller_publish
func opControllerPublish() uint32 { return serve(abi.OpControllerPublish) }

//go:wasmexport controller_unpublish
func opControllerUnpublish() uint32 { return serve(abi.OpControllerUnpublish) }

//go:wasmexport volume_health
func opVolumeHealth() uint32 { return serve(abi.OpVolumeHealth) }

//go:wasmexport storage_health
func opStorageHealth() uint32 { return serve(abi.OpStorageHealth) }

//go:wasmexport node_info
func opNodeInfo() uint32 { return serve(abi.OpNodeInfo) }

//go:wasmexport node_stage
func opNodeStage() uint32 { return serve(abi.OpNodeStage) }

//go:wasmexport node_unstage
func opNodeUnstage() uint32 { return serve(abi.OpNodeUnstage) }

//go:wasmexport node_expand
func opNodeExpand() uint32 { return serve(abi.OpNodeExpand) }

//go:wasmexport snapshot_data
func opSnapshotData() uint32 { return serve(abi.OpSnapshotData) }
