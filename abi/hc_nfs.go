package abi

// Messages of the "nfs" host calls: the node's NFS client. The family's
// roots are of two kinds, told apart by their form: absolute folders in
// which a module may mount (each mount is a folder directly inside one,
// which the host creates), and the servers it may mount from, each with
// the export path it confines mounts to: "192.0.2.5:/srv/nfs" (that folder
// and below only), "192.0.2.5:/" (every export), the server an IP address,
// a prefix ("192.0.2.0/24:/") or a host name ("nfs.example:/export"). A
// bare address or prefix is no server root: it belongs to other families
// (the nfsd family's clients). Mounts are NFSv4.1 or 4.2 only.
//
// A dead or unreachable server never holds a call: the mount runs in a
// child process the host kills at the call's deadline, statfs and
// unmounts run apart from the call and are abandoned at their deadline,
// and mounts are soft by default, so that I/O to a server that went away
// fails after timeo×retrans instead of waiting forever.
// The codec is generated into hc_nfs_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "nfs" family.
const (
	// HostCallNfsMount mounts a granted server's export at a folder in a
	// granted root.
	HostCallNfsMount = "nfs_mount" // NfsMountRequest -> NfsMount
	// HostCallNfsUnmount unmounts an NFS mount, lazily when its server
	// does not answer.
	HostCallNfsUnmount = "nfs_unmount" // NfsTargetRequest -> Empty
	// HostCallNfsStat answers what an NFS mount is, its usage and whether
	// its server answers.
	HostCallNfsStat = "nfs_stat" // NfsTargetRequest -> NfsMount
	// HostCallNfsDirCreate creates a folder directly in a share the
	// module mounted.
	HostCallNfsDirCreate = "nfs_dir_create" // NfsDirRequest -> Empty
	// HostCallNfsDirRemove removes a folder of a mounted share and what
	// it holds.
	HostCallNfsDirRemove = "nfs_dir_remove" // NfsDirRequest -> Empty
	// HostCallNfsDirRename renames a folder of a mounted share.
	HostCallNfsDirRename = "nfs_dir_rename" // NfsDirRequest -> Empty
	// HostCallNfsDirCopy copies a folder of a mounted share within it,
	// server-side where the server can.
	HostCallNfsDirCopy = "nfs_dir_copy" // NfsDirRequest -> Empty
	// HostCallNfsDirUsage says whether a folder of a mounted share exists
	// and what it holds.
	HostCallNfsDirUsage = "nfs_dir_usage" // NfsDirRequest -> NfsDirUsage
)

// NfsMountRequest mounts Server:Export at Target, a folder directly in a
// granted folder root (created when missing).
//
// Version is "4.2", "4.1" or "" (4.2, falling back to 4.1 when the server
// refuses it). Options are the StorageClass's mountOptions, passed to the
// kernel after the host's defaults ("soft", "timeo=100", "retrans=3"),
// which they may override ("hard" for workloads that prefer to wait);
// "vers", "nfsvers", "addr", "clientaddr", "port" and options that are not
// NFS mount options are INVALID_ARGUMENT. TimeoutMillis bounds the mount
// (0: 30 s, capped by the call's deadline).
//
// The same mount again is success; another mount at Target is
// ALREADY_EXISTS. PERMISSION_DENIED when the server or the export is not
// granted or the server refuses this client; NOT_FOUND when the server
// has no such export; UNAVAILABLE when the server does not answer in
// time; FAILED_PRECONDITION when the node lacks mount.nfs.
type NfsMountRequest struct {
	Server        string   `wire:"1"` // IP address or host name, no port
	Export        string   `wire:"2"` // absolute path on the server
	Target        string   `wire:"3"`
	Version       string   `wire:"4"`
	Options       []string `wire:"5"`
	TimeoutMillis int64    `wire:"6"`
	ReadOnly      bool     `wire:"7"`
}

// NfsTargetRequest names an NFS mount by its folder.
//
//   - nfs_unmount: unmounts Target and removes the folder. Dirty data is
//     written back while the server answers; when it does not answer
//     within TimeoutMillis (0: 10 s), the mount is detached lazily (it
//     disappears from the namespace at once, and the kernel frees it when
//     its last user lets go) and the call succeeds. A Target that is not
//     mounted is success. FAILED_PRECONDITION when Target is another kind
//     of mount.
//   - nfs_stat: NOT_FOUND when Target is not mounted. The usage comes
//     from a statfs bounded by TimeoutMillis (0: 5 s); a server that
//     does not answer in time is Reachable false, never an error.
type NfsTargetRequest struct {
	Target        string `wire:"1"`
	TimeoutMillis int64  `wire:"2"`
}

// NfsMount describes an NFS mount: where it comes from as the kernel
// shows it, the version it speaks, and, from nfs_stat, its usage and
// whether the server answered (Error says what failed when it did not).
type NfsMount struct {
	Server         string `wire:"1"`
	Export         string `wire:"2"`
	Target         string `wire:"3"`
	Version        string `wire:"4"`
	Reachable      bool   `wire:"5"`
	TotalBytes     int64  `wire:"6"`
	AvailableBytes int64  `wire:"7"`
	UsedBytes      int64  `wire:"8"`
	Error          string `wire:"9"`
}

// NfsDirRequest names a folder directly in the share mounted at Target (an
// NFS mount nfs_mount made, in a granted folder; NOT_FOUND when nothing
// is mounted there). Name and NewName follow the dir family's rules: one
// path element of at most 255 bytes, no NUL, not starting with ".". Every
// call is bounded by TimeoutMillis (0: 30 s; nfs_dir_copy and
// nfs_dir_remove by the call's deadline alone): a server that does not
// answer is UNAVAILABLE, and the call's goroutine is never the one left
// waiting for it.
//
//   - nfs_dir_create: creates Name (mode 0755); an existing folder is
//     success.
//   - nfs_dir_remove: removes Name and its tree; a missing one is success.
//   - nfs_dir_rename: renames Name to NewName, which must not exist
//     (ALREADY_EXISTS); a missing Name with NewName present is success
//     (a repeat).
//   - nfs_dir_copy: copies Name's tree to NewName as the dir family's
//     dir_copy does (built aside, named only when whole; ALREADY_EXISTS
//     when NewName exists). File data goes by reflink or copy_file_range,
//     which NFSv4.2 turns into the server's CLONE or server-side COPY: the
//     data does not cross the network where the server supports them.
//   - nfs_dir_usage: answers whether Name exists and its bytes and inodes
//     in use (walking the tree).
type NfsDirRequest struct {
	Target        string `wire:"1"`
	Name          string `wire:"2"`
	NewName       string `wire:"3"`
	TimeoutMillis int64  `wire:"4"`
}

// NfsDirUsage answers nfs_dir_usage.
type NfsDirUsage struct {
	Exists     bool  `wire:"1"`
	UsedBytes  int64 `wire:"2"`
	UsedInodes int64 `wire:"3"`
}
