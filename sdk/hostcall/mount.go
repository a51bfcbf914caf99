package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// MountBind bind-mounts source at target, read-only when asked; an
// identical mount already there is success with Changed false (mount_bind).
func MountBind(req *abi.MountBindRequest) (*abi.MountChange, error) {
	resp := new(abi.MountChange)
	return resp, call(mountBind, abi.HostCallMountBind, req, resp)
}

// MountUnmount unmounts target; not mounted is success (mount_unmount).
func MountUnmount(req *abi.MountUnmountRequest) (*abi.MountChange, error) {
	resp := new(abi.MountChange)
	return resp, call(mountUnmount, abi.HostCallMountUnmount, req, resp)
}

// MountInfo describes what is mounted at target (mount_info).
func MountInfo(target string) (*abi.MountInfo, error) {
	resp := new(abi.MountInfo)
	return resp, call(mountInfo, abi.HostCallMountInfo, &abi.MountInfoRequest{Target: target}, resp)
}
