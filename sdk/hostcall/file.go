package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// FileCreate creates a volume file, sparse or preallocated (file_create).
func FileCreate(req *abi.FileCreateRequest) error {
	return call(fileCreate, abi.HostCallFileCreate, req, nil)
}

// FileResize grows a volume file (file_resize).
func FileResize(req *abi.FileResizeRequest) error {
	return call(fileResize, abi.HostCallFileResize, req, nil)
}

// FileRemove removes a volume file; a missing one is success (file_remove).
func FileRemove(path string) error {
	return call(fileRemove, abi.HostCallFileRemove, &abi.FileRequest{Path: path}, nil)
}

// FileClone makes target a reflink or hole-keeping copy of source in the
// same pool (file_clone).
func FileClone(source, target string) error {
	return call(fileClone, abi.HostCallFileClone, &abi.FileCloneRequest{Source: source, Target: target}, nil)
}

// FileStat answers a file's size and allocated bytes (file_stat).
func FileStat(path string) (*abi.FileStat, error) {
	resp := new(abi.FileStat)
	return resp, call(fileStat, abi.HostCallFileStat, &abi.FileRequest{Path: path}, resp)
}

// FileStatfs answers the usage of a pool folder's filesystem (file_statfs).
func FileStatfs(pool string) (*abi.FileStatfs, error) {
	resp := new(abi.FileStatfs)
	return resp, call(fileStatfs, abi.HostCallFileStatfs, &abi.FileRequest{Path: pool}, resp)
}
