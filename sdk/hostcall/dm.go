package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// DmPoolOpen activates a thin pool over granted devices, creating its
// metadata when new (dm_pool_open).
func DmPoolOpen(req *abi.DmPoolOpenRequest) (*abi.DmPoolOpenResponse, error) {
	resp := new(abi.DmPoolOpenResponse)
	return resp, call(dmPoolOpen, abi.HostCallDmPoolOpen, req, resp)
}

// DmPoolStatus answers a thin pool's data and metadata usage (dm_pool_status).
func DmPoolStatus(req *abi.DmPoolRequest) (*abi.DmPoolStatus, error) {
	resp := new(abi.DmPoolStatus)
	return resp, call(dmPoolStatus, abi.HostCallDmPoolStatus, req, resp)
}

// DmThinCreate creates and activates a thin volume (dm_thin_create).
func DmThinCreate(req *abi.DmThinRequest) (*abi.DmThinResponse, error) {
	resp := new(abi.DmThinResponse)
	return resp, call(dmThinCreate, abi.HostCallDmThinCreate, req, resp)
}

// DmThinActivate activates an existing thin volume (dm_thin_activate).
func DmThinActivate(req *abi.DmThinRequest) (*abi.DmThinResponse, error) {
	resp := new(abi.DmThinResponse)
	return resp, call(dmThinActivate, abi.HostCallDmThinActivate, req, resp)
}

// DmThinDeactivate removes a thin volume's device, keeping its data
// (dm_thin_deactivate).
func DmThinDeactivate(req *abi.DmThinRequest) error {
	return call(dmThinDeactivate, abi.HostCallDmThinDeactivate, req, nil)
}

// DmThinDelete deactivates and deletes a thin volume (dm_thin_delete).
func DmThinDelete(req *abi.DmThinRequest) error {
	return call(dmThinDelete, abi.HostCallDmThinDelete, req, nil)
}

// DmThinResize changes a thin volume's virtual size (dm_thin_resize).
func DmThinResize(req *abi.DmThinRequest) error {
	return call(dmThinResize, abi.HostCallDmThinResize, req, nil)
}

// DmThinSnapshot snapshots a thin volume inside its pool (dm_thin_snapshot).
func DmThinSnapshot(req *abi.DmThinSnapshotRequest) error {
	return call(dmThinSnapshot, abi.HostCallDmThinSnapshot, req, nil)
}

// DmThinStatus answers whether a thin volume exists, whether it is active
// and how much of it is mapped (dm_thin_status).
func DmThinStatus(req *abi.DmThinRequest) (*abi.DmThinStatus, error) {
	resp := new(abi.DmThinStatus)
	return resp, call(dmThinStatus, abi.HostCallDmThinStatus, req, resp)
}
