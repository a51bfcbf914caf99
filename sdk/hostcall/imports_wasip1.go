//go:build wasip1

package hostcall

import "unsafe"

// One import per host call; keep in step with imports_native.go and the
// HostCall* names in abi (imports_test.go checks both).

//go:wasmimport wasmcsi loop_attach
func loopAttach(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi loop_find
func loopFind(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi loop_resize
func loopResize(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi loop_detach
func loopDetach(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi file_create
func fileCreate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi file_resize
func fileResize(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi file_remove
func fileRemove(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi file_clone
func fileClone(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi file_stat
func fileStat(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi file_statfs
func fileStatfs(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_create
func dirCreate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_remove
func dirRemove(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_copy
func dirCopy(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_statfs
func dirStatfs(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_usage
func dirUsage(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_set_quota
func dirSetQuota(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_quota_supported
func dirQuotaSupported(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dir_exists
func dirExists(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi mount_bind
func mountBind(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi mount_unmount
func mountUnmount(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi mount_info
func mountInfo(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_pool_open
func dmPoolOpen(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_pool_status
func dmPoolStatus(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_thin_create
func dmThinCreate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_thin_activate
func dmThinActivate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_thin_deactivate
func dmThinDeactivate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_thin_delete
func dmThinDelete(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_thin_resize
func dmThinResize(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

//go:wasmimport wasmcsi dm_thin_snapshot
func dmThinSnapshot(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
