//go:build !wasip1

package hostcall

import "unsafe"

// rawFunc matches the wasip1 adaptors; natively it is never called.
type rawFunc = func(req unsafe.Pointer, reqLen uint32, out unsafe.Pointer, outLimit uint32) uint64

// Native stand-ins for the imports of imports_wasip1.go: the import name
// passed to call selects the answer from the installed Host.
var (
	loopAttach, loopFind, loopResize, loopDetach                                                                                       rawFunc
	fileCreate, fileResize, fileRemove, fileClone, fileStat, fileStatfs                                                                rawFunc
	dirCreate, dirRemove, dirCopy, dirStatfs, dirUsage, dirSetQuota, dirQuotaSupported, dirExists                                      rawFunc
	mountBind, mountUnmount, mountInfo                                                                                                 rawFunc
	dmPoolOpen, dmPoolStatus, dmThinCreate, dmThinActivate, dmThinDeactivate, dmThinDelete, dmThinResize, dmThinSnapshot, dmThinStatus rawFunc
	iscsiLogin, iscsiLogout, iscsiRescan, iscsiInitiatorName                                                                           rawFunc
	lioLunCreate, lioLunDelete, lioGrant, lioRevoke, lioLunResize                                                                      rawFunc
	netRouteTo, netInterfaces                                                                                                          rawFunc
)
