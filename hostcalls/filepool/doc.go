// Package filepool keeps volume files in one granted folder, the pool root:
// it creates them sparse or preallocated, grows, clones (reflink when the
// filesystem can, else a copy that keeps holes), removes and measures them,
// and lists their allocated and changed byte ranges for CSI's
// SnapshotMetadata service.
//
// It must never touch anything outside its root. Every file is named by a
// single path component and opened relative to a descriptor of the root
// with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV), so
// neither "..", nor a symlink, nor a mount point inside the root leads
// anywhere else. Names must be non-empty, at most 255 bytes, without "/" or
// NUL, and must not start with "." (such names are reserved for the pool's
// own temporaries and exclude "." and "..").
//
// # Crash safety
//
// A file appears under its name only when it is complete: Create and Clone
// build it as an anonymous O_TMPFILE in the root, fsync it, link it to its
// name (which fails if the name exists, so no file is ever replaced) and
// fsync the root. A process killed half way leaves nothing: the unnamed
// file dies with it, and a repeated call starts afresh. On filesystems
// without O_TMPFILE (NFS, some FUSE), they fall back to a named temporary
// in the pool's scratch folder (".wasmcsi-tmp", see
// hostcalls/internal/scratch), locked while it is built, linked the same
// way and then unlinked; Open removes those a dead process left. A file
// Create only sized or allocated is not synced on its own on xfs and on ext4
// with a journal (not on ext2, or ext4 made without one), whose journal
// makes the size durable before the link that follows it, so the root's
// fsync covers both. A caller that passes hostcalls.DirSyncs in
// the context makes that fsync of the root (and Remove's) itself, later,
// in a batch.
//
// # Consistency
//
// Clone and ChangedRanges read files as they are; the caller makes sure
// nobody writes them meanwhile (a snapshot source is frozen or detached,
// snapshots themselves are never written).
//
// # Requirements
//
// Linux 5.6 or later for openat2 (where a seccomp filter hides it, the pool
// uses openat with O_NOFOLLOW, which is as strict for a single component
// except that it does not refuse a mount point).
package filepool
