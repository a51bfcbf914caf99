package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// LoopAttach attaches a file inside a granted root to a loop device, or
// answers the device it is already attached to (loop_attach).
func LoopAttach(req *abi.LoopAttachRequest) (*abi.LoopDevice, error) {
	resp := new(abi.LoopDevice)
	return resp, call(loopAttach, abi.HostCallLoopAttach, req, resp)
}

// LoopFind answers the device a file is attached to, if any (loop_find).
func LoopFind(file string) (*abi.LoopFindResponse, error) {
	resp := new(abi.LoopFindResponse)
	return resp, call(loopFind, abi.HostCallLoopFind, &abi.LoopFileRequest{File: file}, resp)
}

// LoopResize makes a device pick up its file's new size (loop_resize).
func LoopResize(device string) (int64, error) {
	resp := new(abi.LoopResizeResponse)
	err := call(loopResize, abi.HostCallLoopResize, &abi.LoopDeviceRequest{Device: device}, resp)
	return resp.SizeBytes, err
}

// LoopDetach detaches a device; a free one is success (loop_detach).
func LoopDetach(device string) error {
	return call(loopDetach, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: device}, nil)
}
