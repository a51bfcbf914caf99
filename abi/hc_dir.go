package abi

// Messages of the "dir" host calls: volumes as directories in pool folders
// (the localdir backend). The family's roots are pool folders; every volume
// or snapshot is a directory directly in one, whose name (the last path
// element) is at most 255 bytes, has no NUL and does not start with "."
// (reserved for the pool's temporaries: INVALID_ARGUMENT). Directories are
// opened beneath their root without following symlinks or crossing mounts,
// so nothing planted inside a pool leads a call outside it.
// The codec is generated into hc_dir_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "dir" family.
const (
	// HostCallDirCreate creates a volume directory in a pool, with a quota when
	// QuotaBytes > 0.
	HostCallDirCreate = "dir_create" // DirCreateRequest -> Empty
	// HostCallDirRemove removes a volume directory and its contents; a missing one is
	// success.
	HostCallDirRemove = "dir_remove" // DirRequest{path} -> Empty
	// HostCallDirCopy copies a directory tree within a pool.
	HostCallDirCopy = "dir_copy" // DirCopyRequest{source, target} -> Empty
	// HostCallDirStatfs answers the usage of the filesystem holding path.
	HostCallDirStatfs = "dir_statfs" // DirRequest{path} -> DirStatfs
	// HostCallDirUsage answers what a volume directory uses.
	HostCallDirUsage = "dir_usage" // DirRequest{path} -> DirUsage
	// HostCallDirSetQuota sets a volume directory's byte limit.
	HostCallDirSetQuota = "dir_set_quota" // DirQuotaRequest{path, bytes} -> Empty
	// HostCallDirQuotaSupported says whether a pool enforces directory quotas, and why
	// not.
	HostCallDirQuotaSupported = "dir_quota_supported" // DirRequest{pool} -> DirQuotaSupport
	// HostCallDirExists says whether a volume directory exists.
	HostCallDirExists = "dir_exists" // DirRequest{path} -> DirExists.Exists
	// HostCallDirList lists the volume directories of a pool folder, one
	// bounded page at a time.
	HostCallDirList = "dir_list" // ListRequest -> ListPage
)

// ListRequest asks dir_list or file_list for one page of the entries of the
// pool folder Pool (a granted root itself: INVALID_ARGUMENT otherwise):
// directories for dir_list, regular files for file_list, whose names are
// valid volume names (the pool's own temporaries, starting with ".", and
// symlinks are left out). Names come in byte order, those after After
// only (empty: from the first), at most Limit of them (0: ListPageDefault;
// more than ListPageMax: ListPageMax). Pass the previous page's Next as
// After to continue. A name that exists for the whole listing is listed
// exactly once; one created or removed meanwhile may or may not be. The
// listing is not a snapshot: pair it with what your module knows (a
// name's own host calls are serialized by the host, see ABI.md,
// "Concurrency").
type ListRequest struct {
	Pool  string `wire:"1"`
	After string `wire:"2"`
	Limit int64  `wire:"3"`
}

// ListPage is one page of a listing: Names in byte order, and Next, the
// After of the next page, empty when this page is the last.
type ListPage struct {
	Names []string `wire:"1"`
	Next  string   `wire:"2"`
}

// Page sizes of dir_list and file_list: a page holds at most ListPageMax
// names of at most 255 bytes each.
const (
	ListPageDefault = 256
	ListPageMax     = 1024
)

// DirCreateRequest creates the directory Path (mode 0755). An existing
// directory is success; another kind of entry there is ALREADY_EXISTS.
// QuotaBytes above zero also sets a project quota, as dir_set_quota does,
// and is FAILED_PRECONDITION before anything is created when the pool has
// no quota support.
type DirCreateRequest struct {
	Path       string `wire:"1"`
	QuotaBytes int64  `wire:"2"`
}

// DirRequest names a directory in a pool folder (or, for dir_statfs and
// dir_quota_supported, the pool folder itself).
//
//   - dir_remove: removes the directory and everything in it; a missing
//     one is success. FAILED_PRECONDITION when something is mounted inside.
//   - dir_statfs: the pool folder's filesystem, or a directory's, which
//     with a project quota reports the quota as its size.
//   - dir_usage: NOT_FOUND for a missing directory.
//   - dir_exists: false for a missing name, a file or a symlink.
type DirRequest struct {
	Path string `wire:"1"`
}

// DirCopyRequest copies the directory Source to the new directory Target
// in the same pool folder: contents (reflinked where the filesystem can,
// holes kept), modes, owners, timestamps, extended attributes, hard links,
// and symlinks as symlinks, never followed. ALREADY_EXISTS when Target
// exists, NOT_FOUND when Source does not. Target appears only when the
// copy is complete and durable (it is built under a temporary name and
// renamed): after an error, or a daemon killed during the copy, Target
// does not exist, so "copy unless dir_exists" is a correct retry. The copy
// has no quota until dir_set_quota gives it one.
type DirCopyRequest struct {
	Source string `wire:"1"`
	Target string `wire:"2"`
}

// DirStatfs is the capacity statfs(2) reports for a pool folder or a
// directory. Free counts what root may use, Available what others may.
type DirStatfs struct {
	TotalBytes     int64 `wire:"1"`
	FreeBytes      int64 `wire:"2"`
	AvailableBytes int64 `wire:"3"`
	TotalInodes    int64 `wire:"4"`
	FreeInodes     int64 `wire:"5"`
}

// DirUsage is what a directory uses: its project's accounting when it has
// a quota, otherwise the allocated blocks and inodes of its tree (hard
// links once, nothing below a mount point).
type DirUsage struct {
	UsedBytes  int64 `wire:"1"`
	UsedInodes int64 `wire:"2"`
}

// DirQuotaRequest limits the blocks under the directory Path to QuotaBytes
// (rounded up to 512 bytes on xfs, 1 KiB on ext4); 0 removes the limit. It
// may be raised or lowered at any time. FAILED_PRECONDITION when the pool
// has no project quota support (see dir_quota_supported). Writes past the
// quota fail with ENOSPC on xfs and EDQUOT on ext4.
type DirQuotaRequest struct {
	Path       string `wire:"1"`
	QuotaBytes int64  `wire:"2"`
}

// DirQuotaSupport answers whether a pool folder enforces project quotas:
// xfs mounted with prjquota/pquota, or ext4 with the quota and project
// features mounted with prjquota. Reason says why not.
type DirQuotaSupport struct {
	Supported bool   `wire:"1"`
	Reason    string `wire:"2"`
}

// DirExists answers whether a directory exists.
type DirExists struct {
	Exists bool `wire:"1"`
}
