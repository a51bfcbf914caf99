//go:build wasip1

package hostcall

import "unsafe"

// One import per host call, each behind a plain function: TinyGo cannot
// take an imported function as a value. Keep in step with
// imports_native.go and the HostCall* names in abi (imports_test.go checks
// both). Only the imports a module's code reaches end up in its binary.

//go:wasmimport wasmcsi loop_attach
func loopAttachImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func loopAttach(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return loopAttachImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi loop_find
func loopFindImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func loopFind(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return loopFindImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi loop_resize
func loopResizeImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func loopResize(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return loopResizeImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi loop_detach
func loopDetachImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func loopDetach(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return loopDetachImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi file_create
func fileCreateImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func fileCreate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return fileCreateImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi file_resize
func fileResizeImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func fileResize(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return fileResizeImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi file_remove
func fileRemoveImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func fileRemove(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return fileRemoveImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi file_clone
func fileCloneImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func fileClone(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return fileCloneImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi file_stat
func fileStatImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func fileStat(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return fileStatImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi file_statfs
func fileStatfsImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func fileStatfs(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return fileStatfsImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_create
func dirCreateImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirCreate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirCreateImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_remove
func dirRemoveImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirRemove(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirRemoveImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_copy
func dirCopyImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirCopy(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirCopyImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_statfs
func dirStatfsImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirStatfs(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirStatfsImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_usage
func dirUsageImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirUsage(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirUsageImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_set_quota
func dirSetQuotaImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirSetQuota(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirSetQuotaImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_quota_supported
func dirQuotaSupportedImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirQuotaSupported(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirQuotaSupportedImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dir_exists
func dirExistsImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dirExists(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dirExistsImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi mount_bind
func mountBindImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func mountBind(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return mountBindImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi mount_unmount
func mountUnmountImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func mountUnmount(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return mountUnmountImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi mount_info
func mountInfoImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func mountInfo(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return mountInfoImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_pool_open
func dmPoolOpenImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmPoolOpen(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmPoolOpenImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_pool_status
func dmPoolStatusImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmPoolStatus(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmPoolStatusImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_thin_create
func dmThinCreateImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmThinCreate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmThinCreateImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_thin_activate
func dmThinActivateImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmThinActivate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmThinActivateImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_thin_deactivate
func dmThinDeactivateImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmThinDeactivate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmThinDeactivateImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_thin_delete
func dmThinDeleteImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmThinDelete(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmThinDeleteImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_thin_resize
func dmThinResizeImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmThinResize(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmThinResizeImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_thin_snapshot
func dmThinSnapshotImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmThinSnapshot(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmThinSnapshotImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi dm_thin_status
func dmThinStatusImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func dmThinStatus(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return dmThinStatusImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi iscsi_login
func iscsiLoginImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func iscsiLogin(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return iscsiLoginImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi iscsi_logout
func iscsiLogoutImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func iscsiLogout(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return iscsiLogoutImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi iscsi_rescan
func iscsiRescanImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func iscsiRescan(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return iscsiRescanImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi iscsi_initiator_name
func iscsiInitiatorNameImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func iscsiInitiatorName(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return iscsiInitiatorNameImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi lio_lun_create
func lioLunCreateImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func lioLunCreate(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return lioLunCreateImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi lio_lun_delete
func lioLunDeleteImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func lioLunDelete(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return lioLunDeleteImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi lio_grant
func lioGrantImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func lioGrant(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return lioGrantImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi lio_revoke
func lioRevokeImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func lioRevoke(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return lioRevokeImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi lio_lun_resize
func lioLunResizeImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func lioLunResize(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return lioLunResizeImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi net_route_to
func netRouteToImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func netRouteTo(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return netRouteToImport(req, reqLen, out, outLimit)
}

//go:wasmimport wasmcsi net_interfaces
func netInterfacesImport(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64
func netInterfaces(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64 {
	return netInterfacesImport(req, reqLen, out, outLimit)
}
