package abi

// Messages of the "lio" host calls: serving block devices and files as
// iSCSI LUNs with the kernel's LIO target. The family's roots are of three
// kinds, told apart by their form: target IQN prefixes ("iqn.2024-01.
// dev.example:node1."; every target must start with one), folders or device
// paths ("/dev/mapper", "/var/lib/pool") that backing stores must lie in,
// and portals ("0.0.0.0:3260", "[::]:3260", "192.0.2.5:3260") a target may
// listen on. Initiators see a LUN only after lio_grant; every call is
// idempotent.
// The codec is generated into hc_lio_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "lio" family.
const (
	// HostCallLioLunCreate creates a backstore and maps it as a LUN of a target.
	HostCallLioLunCreate = "lio_lun_create" // LioLunCreateRequest -> Empty
	// HostCallLioLunDelete unmaps a LUN and deletes its backstore;
	// with req.Path set, only when the LUN is backed by that path.
	HostCallLioLunDelete = "lio_lun_delete" // LioLunRequest -> Empty
	// HostCallLioGrant lets an initiator reach a LUN.
	HostCallLioGrant = "lio_grant" // LioGrantRequest -> Empty
	// HostCallLioRevoke takes an initiator's access away.
	HostCallLioRevoke = "lio_revoke" // LioGrantRequest -> Empty
	// HostCallLioLunResize sets the size a fileio LUN reports after its file grew.
	HostCallLioLunResize = "lio_lun_resize" // LioLunResizeRequest -> Empty
)

// LioLunCreateRequest makes Path available as LUN of Target, creating the
// target and its portals when missing. The same request again is success;
// a LUN number already serving another backing store is ALREADY_EXISTS.
// NOT_FOUND for a missing Path; FAILED_PRECONDITION when LIO is not loaded
// or a portal's address is in use by another program.
type LioLunCreateRequest struct {
	Target string `wire:"1"` // target IQN, inside a granted prefix
	LUN    int32  `wire:"2"` // 0-255
	// Kind is "block" (Path is a block device) or "fileio" (Path is a
	// regular file).
	Kind string `wire:"3"`
	Path string `wire:"4"`
	// SizeBytes is a fileio LUN's size, a multiple of 512; 0 takes the
	// file's size. A block LUN follows its device's size; leave it 0.
	SizeBytes int64    `wire:"5"`
	Portals   []string `wire:"6"` // at least one, each granted
	// WriteCache makes a fileio LUN report a volatile write cache
	// (emulate_write_cache): initiators treat it as write-back and send
	// SYNCHRONIZE CACHE, which the target turns into an fsync of the
	// file; false reports write-through. It is set on every call, also on
	// a LUN that exists, so a repeat with another value changes it live
	// (initiators see it after iscsi_rescan). A block LUN reports its
	// device's cache: WriteCache there is INVALID_ARGUMENT.
	WriteCache bool `wire:"7"`
}

// LioLunRequest names a LUN of a target.
//
//   - lio_lun_delete: removes the LUN, its grants (an initiator left with no
//     LUN loses its session) and its backing store entry, and the target
//     when no LUN is left. A missing LUN is success. With Path set, only a
//     LUN backed by Path is removed and a LUN backed by anything else is
//     left alone (success): a repeated delete never removes a LUN number
//     that was meanwhile given to another volume.
type LioLunRequest struct {
	Target string `wire:"1"`
	LUN    int32  `wire:"2"`
	Path   string `wire:"3"` // optional: the backing store the LUN must have
}

// LioLunResizeRequest sets the size a fileio LUN reports to initiators,
// after the module grew its file (file_resize); initiators see it after
// iscsi_rescan. SizeBytes is a multiple of 512 and at most the file's
// size (FAILED_PRECONDITION otherwise). A block LUN follows its device's
// size by itself: the call is success with nothing to do. NOT_FOUND when
// the LUN does not exist.
type LioLunResizeRequest struct {
	Target    string `wire:"1"`
	LUN       int32  `wire:"2"`
	SizeBytes int64  `wire:"3"`
}

// LioGrantRequest names an initiator's access to a LUN.
//
//   - lio_grant: lets Initiator reach the LUN, with CHAP when ChapUser is
//     set (the credentials belong to the initiator's access to the whole
//     target: the last grant decides them). NOT_FOUND when the LUN does not
//     exist.
//   - lio_revoke: takes the LUN away; an initiator left with no LUN loses
//     its session. What was never granted is success. CHAP fields are
//     ignored.
type LioGrantRequest struct {
	Target     string `wire:"1"`
	LUN        int32  `wire:"2"`
	Initiator  string `wire:"3"` // the initiator's IQN
	ChapUser   string `wire:"4"`
	ChapSecret string `wire:"5"`
}
