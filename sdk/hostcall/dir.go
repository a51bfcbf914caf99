package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// DirCreate creates a volume directory in a pool, with a quota when
// QuotaBytes > 0 (dir_create).
func DirCreate(req *abi.DirCreateRequest) error {
	return call(dirCreate, abi.HostCallDirCreate, req, nil)
}

// DirRemove removes a volume directory and its contents; a missing one is
// success (dir_remove).
func DirRemove(path string) error {
	return call(dirRemove, abi.HostCallDirRemove, &abi.DirRequest{Path: path}, nil)
}

// DirCopy copies a directory tree within a pool (dir_copy).
func DirCopy(source, target string) error {
	return call(dirCopy, abi.HostCallDirCopy, &abi.DirCopyRequest{Source: source, Target: target}, nil)
}

// DirStatfs answers the usage of the filesystem holding path (dir_statfs).
func DirStatfs(path string) (*abi.DirStatfs, error) {
	resp := new(abi.DirStatfs)
	return resp, call(dirStatfs, abi.HostCallDirStatfs, &abi.DirRequest{Path: path}, resp)
}

// DirUsage answers what a volume directory uses (dir_usage).
func DirUsage(path string) (*abi.DirUsage, error) {
	resp := new(abi.DirUsage)
	return resp, call(dirUsage, abi.HostCallDirUsage, &abi.DirRequest{Path: path}, resp)
}

// DirSetQuota sets a volume directory's byte limit (dir_set_quota).
func DirSetQuota(path string, bytes int64) error {
	return call(dirSetQuota, abi.HostCallDirSetQuota, &abi.DirQuotaRequest{Path: path, QuotaBytes: bytes}, nil)
}

// DirQuotaSupported says whether a pool enforces directory quotas, and why
// not (dir_quota_supported).
func DirQuotaSupported(pool string) (*abi.DirQuotaSupport, error) {
	resp := new(abi.DirQuotaSupport)
	return resp, call(dirQuotaSupported, abi.HostCallDirQuotaSupported, &abi.DirRequest{Path: pool}, resp)
}

// DirExists says whether a volume directory exists (dir_exists).
func DirExists(path string) (bool, error) {
	resp := new(abi.DirExists)
	err := call(dirExists, abi.HostCallDirExists, &abi.DirRequest{Path: path}, resp)
	return resp.Exists, err
}
