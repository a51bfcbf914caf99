package abi

// Messages of the "mount" host calls: bind mounts and unmounts by system
// call. The family's roots are the folders a module may mount in and from
// (the CO's publish and staging folders, pool folders, device folders).
// Source and target must lie inside a root both as written and with their
// symlinks resolved. Every call is idempotent, because the CO repeats calls
// after timeouts and restarts.
// The codec is generated into hc_mount_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "mount" family.
const (
	// HostCallMountBind bind-mounts source at target, read-only when asked; an
	// identical mount already there is success with Changed false.
	HostCallMountBind = "mount_bind" // MountBindRequest -> MountChange
	// HostCallMountUnmount unmounts target; not mounted is success.
	HostCallMountUnmount = "mount_unmount" // MountUnmountRequest -> MountChange
	// HostCallMountInfo describes what is mounted at target.
	HostCallMountInfo = "mount_info" // MountInfoRequest{target} -> MountInfo
)

// MountBindRequest bind-mounts Source on Target, read-only when ReadOnly.
// Target (and its parents) are created when missing: a directory for a
// directory Source, an empty file otherwise (a block device's publish
// path). The same Source already bound on Target with the same ReadOnly is
// success with Changed false; a Target mounted from anything else, or with
// the other ReadOnly, is ALREADY_EXISTS. NOT_FOUND for a missing Source;
// FAILED_PRECONDITION for a Target of the wrong kind or a symlink.
type MountBindRequest struct {
	Source   string `wire:"1"`
	Target   string `wire:"2"`
	ReadOnly bool   `wire:"3"`
}

// MountUnmountRequest unmounts Target and every mount stacked on it. A
// Target that is missing or not mounted is success with Changed false. A
// busy mount is FAILED_PRECONDITION unless Lazy, which detaches it at
// once and lets the kernel finish when it is no longer used.
type MountUnmountRequest struct {
	Target string `wire:"1"`
	Lazy   bool   `wire:"2"`
}

// MountChange says whether the call changed anything (false: it was
// already so).
type MountChange struct {
	Changed bool `wire:"1"`
}

// MountInfoRequest asks what is mounted on Target.
type MountInfoRequest struct {
	Target string `wire:"1"`
}

// MountInfo describes the mount on top of a target; Mounted is false, and
// the rest empty, when the target is not a mount point or does not exist.
type MountInfo struct {
	Mounted bool `wire:"1"`
	// Source is what the kernel shows as mounted: the device of a block
	// filesystem (also for a bind mount, whose Root says which part) or a
	// name like "tmpfs".
	Source string `wire:"2"`
	// Root is the path inside the source filesystem mounted there: "/" for
	// a whole filesystem.
	Root   string `wire:"3"`
	FSType string `wire:"4"`
	// Options are the per-mount options ("ro", "nosuid", ...),
	// SuperOptions the filesystem's ("nouuid", "prjquota", ...).
	Options      []string `wire:"5"`
	SuperOptions []string `wire:"6"`
	ReadOnly     bool     `wire:"7"`
	// BlockDevice says a block device node is bound there (a published raw
	// block volume).
	BlockDevice bool `wire:"8"`
}
