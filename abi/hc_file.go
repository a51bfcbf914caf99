package abi

// Messages of the "file" host calls: volume files in pool folders. The
// family's roots are pool folders; every file lives directly in one, and
// its name (the last path element) is at most 255 bytes, has no NUL and
// does not start with "." (reserved for the pool's temporaries). Files are
// opened beneath their root without following symlinks or crossing mounts.
// A file appears under its name only when complete (created or cloned in
// full and synced).
// The codec is generated into hc_file_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "file" family.
const (
	// HostCallFileCreate creates a volume file, sparse or preallocated.
	HostCallFileCreate = "file_create" // FileCreateRequest -> Empty
	// HostCallFileResize grows a volume file.
	HostCallFileResize = "file_resize" // FileResizeRequest -> Empty
	// HostCallFileRemove removes a volume file; a missing one is success.
	HostCallFileRemove = "file_remove" // FileRequest{path} -> Empty
	// HostCallFileClone makes target a reflink or hole-keeping copy of source in the
	// same pool.
	HostCallFileClone = "file_clone" // FileCloneRequest{source, target} -> Empty
	// HostCallFileStat answers a file's size and allocated bytes.
	HostCallFileStat = "file_stat" // FileRequest{path} -> FileStat
	// HostCallFileStatfs answers the usage of a pool folder's filesystem.
	HostCallFileStatfs = "file_statfs" // FileRequest{pool} -> FileStatfs
	// HostCallFileList lists the volume files of a pool folder, one bounded
	// page at a time.
	HostCallFileList = "file_list" // ListRequest -> ListPage
)

// FileCreateRequest creates the file Path of SizeBytes: sparse, or with
// every block allocated when Prealloc. A file of that size already there is
// success; of another size ALREADY_EXISTS. RESOURCE_EXHAUSTED when the pool
// has no room for a preallocated file.
type FileCreateRequest struct {
	Path      string `wire:"1"`
	SizeBytes int64  `wire:"2"`
	Prealloc  bool   `wire:"3"`
}

// FileResizeRequest grows the file Path to SizeBytes. With Prealloc every
// block of the file is allocated afterwards, the holes of the old part too
// (written data is never changed), so the same size with Prealloc fills
// the file's holes; without, the same size is success with nothing to do.
// A smaller size is INVALID_ARGUMENT; RESOURCE_EXHAUSTED when the pool has
// no room for the blocks. An attached loop device sees a new size after
// loop_resize.
type FileResizeRequest struct {
	Path      string `wire:"1"`
	SizeBytes int64  `wire:"2"`
	Prealloc  bool   `wire:"3"`
}

// FileRequest names a file (or, for file_statfs, a pool folder).
//
//   - file_remove: a missing file is success; FAILED_PRECONDITION while a
//     loop device is attached to it.
//   - file_stat: NOT_FOUND for a missing file.
type FileRequest struct {
	Path string `wire:"1"`
}

// FileCloneRequest makes Target a copy of Source in the same pool folder:
// a reflink sharing Source's blocks where the filesystem supports it (xfs
// with reflink, btrfs), else a copy of Source's data that keeps its holes.
// ALREADY_EXISTS when Target exists; NOT_FOUND when Source does not.
// Target appears only when the clone is complete and durable, also when
// the daemon is killed during the copy. Source must not be written
// meanwhile (detach or freeze it).
type FileCloneRequest struct {
	Source string `wire:"1"`
	Target string `wire:"2"`
}

// FileStat is a file's apparent size and the bytes allocated to it, which
// are fewer for a sparse file and may be shared with clones.
type FileStat struct {
	SizeBytes      int64 `wire:"1"`
	AllocatedBytes int64 `wire:"2"`
}

// FileStatfs is the usage of the filesystem that holds a pool folder.
// Inode counts are zero where the filesystem allocates them dynamically.
type FileStatfs struct {
	TotalBytes     int64 `wire:"1"`
	AvailableBytes int64 `wire:"2"`
	UsedBytes      int64 `wire:"3"`
	TotalInodes    int64 `wire:"4"`
	FreeInodes     int64 `wire:"5"`
	UsedInodes     int64 `wire:"6"`
}
