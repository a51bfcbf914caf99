package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// LioLunCreate creates a backstore and maps it as a LUN of a target
// (lio_lun_create).
func LioLunCreate(req *abi.LioLunCreateRequest) error {
	return call(lioLunCreate, abi.HostCallLioLunCreate, req, nil)
}

// LioLunDelete unmaps a LUN and deletes its backstore (lio_lun_delete);
// with req.Path set, only when the LUN is backed by that path.
func LioLunDelete(req *abi.LioLunRequest) error {
	return call(lioLunDelete, abi.HostCallLioLunDelete, req, nil)
}

// LioGrant lets an initiator reach a LUN (lio_grant).
func LioGrant(req *abi.LioGrantRequest) error {
	return call(lioGrant, abi.HostCallLioGrant, req, nil)
}

// LioRevoke takes an initiator's access away (lio_revoke).
func LioRevoke(req *abi.LioGrantRequest) error {
	return call(lioRevoke, abi.HostCallLioRevoke, req, nil)
}

// LioLunResize sets the size a fileio LUN reports after its file grew
// (lio_lun_resize).
func LioLunResize(req *abi.LioLunResizeRequest) error {
	return call(lioLunResize, abi.HostCallLioLunResize, req, nil)
}
