package abi

// Messages of the "lvm" host calls: logical volumes on volume groups the
// operator already runs, through the LVM2 tools. The family's roots name
// what a module may touch, told apart from paths by their "lvm:" form:
// "lvm:VG" grants linear, striped and mirrored LVs in volume group VG,
// "lvm:VG:POOL" grants thin LVs in the thin pool POOL of VG (and the pool's
// usage). A VG or pool no root names is PERMISSION_DENIED.
//
// The family only ever sees its own LVs: it gives every LV it creates the
// tag LvmOwnerTag, and every call but lvm_lv_create answers an LV without
// it as NOT_FOUND, whatever its name. Its LV names are the module's (valid
// LVM names, which `lvs` shows the operator), so a module names LVs after
// its volumes. Sizes are bytes; LVM rounds an LV up to whole extents
// (thick) or thin-pool chunks, and every answer carries the size LVM made.
// The codec is generated into hc_lvm_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// LvmOwnerTag is the LVM tag of every LV the lvm family creates.
const LvmOwnerTag = "wasmcsi.dev"

// Host call names of the "lvm" family.
const (
	// HostCallLvmVgStatus answers a granted volume group's size and free space.
	HostCallLvmVgStatus = "lvm_vg_status" // LvmVgRequest -> LvmVgStatus
	// HostCallLvmPoolStatus answers a granted thin pool's data and metadata use.
	HostCallLvmPoolStatus = "lvm_pool_status" // LvmPoolRequest -> LvmPoolStatus
	// HostCallLvmLvCreate creates a tagged LV, thick or thin.
	HostCallLvmLvCreate = "lvm_lv_create" // LvmCreateRequest -> LvmLv
	// HostCallLvmLvRemove removes a tagged LV.
	HostCallLvmLvRemove = "lvm_lv_remove" // LvmLvRequest -> Empty
	// HostCallLvmLvExtend grows a tagged LV.
	HostCallLvmLvExtend = "lvm_lv_extend" // LvmExtendRequest -> LvmLv
	// HostCallLvmLvSnapshot makes a thin snapshot of a tagged thin LV.
	HostCallLvmLvSnapshot = "lvm_lv_snapshot" // LvmSnapshotRequest -> LvmLv
	// HostCallLvmLvActivate activates a tagged LV and answers its device.
	HostCallLvmLvActivate = "lvm_lv_activate" // LvmLvRequest -> LvmLv
	// HostCallLvmLvDeactivate deactivates a tagged LV.
	HostCallLvmLvDeactivate = "lvm_lv_deactivate" // LvmLvRequest -> Empty
	// HostCallLvmLvStatus answers one tagged LV as LVM and the kernel see it.
	HostCallLvmLvStatus = "lvm_lv_status" // LvmLvRequest -> LvmLv
	// HostCallLvmLvList lists the tagged LVs of a granted volume group.
	HostCallLvmLvList = "lvm_lv_list" // LvmListRequest -> LvmLvList
)

// LvmVgRequest names a granted volume group.
type LvmVgRequest struct {
	VG string `wire:"1"`
}

// LvmVgStatus is a volume group's space. FreeBytes is what new thick LVs
// (and thin pool growth) can take; every LV takes whole extents.
type LvmVgStatus struct {
	VG          string `wire:"1"`
	SizeBytes   int64  `wire:"2"`
	FreeBytes   int64  `wire:"3"`
	ExtentBytes int64  `wire:"4"`
	PVCount     int32  `wire:"5"`
	// MissingPVs counts physical volumes LVM cannot find: LVs on them are
	// partial or gone.
	MissingPVs int32 `wire:"6"`
}

// LvmPoolRequest names a granted thin pool.
type LvmPoolRequest struct {
	VG   string `wire:"1"`
	Pool string `wire:"2"`
}

// LvmPoolStatus is a thin pool's use: its data (SizeBytes, of which
// DataUsedBytes hold blocks of some thin LV) and its metadata. A pool that
// is ReadOnly (metadata full or damaged), OutOfDataSpace or Failed cannot
// take writes to unprovisioned blocks; Health is LVM's lv_health_status
// ("" when healthy). An inactive pool reports no use: Active is false and
// the used fields are 0.
type LvmPoolStatus struct {
	VG                string `wire:"1"`
	Pool              string `wire:"2"`
	SizeBytes         int64  `wire:"3"`
	DataUsedBytes     int64  `wire:"4"`
	MetadataBytes     int64  `wire:"5"`
	MetadataUsedBytes int64  `wire:"6"`
	// DataPercent and MetadataPercent are LVM's own figures, in hundredths
	// of a percent (9000 = 90%).
	DataPercent     int32  `wire:"7"`
	MetadataPercent int32  `wire:"8"`
	Active          bool   `wire:"9"`
	ReadOnly        bool   `wire:"10"`
	OutOfDataSpace  bool   `wire:"11"`
	Failed          bool   `wire:"12"`
	Health          string `wire:"13"`
	ChunkBytes      int64  `wire:"14"`
}

// LvmCreateRequest creates LV Name in VG: thin in ThinPool (which must be
// granted as "lvm:VG:ThinPool") when ThinPool is set, otherwise thick
// (linear; striped over Stripes PVs with stripe size StripeBytes; with
// Mirrors extra copies as RAID1). The LV gets LvmOwnerTag and Tags, and is
// left active when Activate is set, inactive otherwise.
//
// A tagged LV of that name already there is success (Existed), whatever its
// size, which the answer tells, and is left active or not as it is (it may
// be in use) but activated when Activate is set; an untagged one is
// ALREADY_EXISTS and is left alone. A thick LV larger than the VG's free space, or a thin LV in
// a pool whose data or metadata is full or read-only, is RESOURCE_EXHAUSTED
// and nothing is created. INVALID_ARGUMENT for a name LVM refuses or a tag
// outside LVM's tag characters.
type LvmCreateRequest struct {
	VG          string   `wire:"1"`
	Name        string   `wire:"2"`
	SizeBytes   int64    `wire:"3"`
	ThinPool    string   `wire:"4"`
	Tags        []string `wire:"5"`
	Stripes     int32    `wire:"6"`
	StripeBytes int64    `wire:"7"`
	Mirrors     int32    `wire:"8"`
	Activate    bool     `wire:"9"`
}

// LvmLvRequest names a tagged LV of a granted VG.
//
//   - lvm_lv_remove: deactivates and removes it; NOT_FOUND when there is no
//     tagged LV of that name; FAILED_PRECONDITION while it is open (mounted,
//     staged) or has thin snapshots that are themselves open.
//   - lvm_lv_activate: active already is success; a thin snapshot made
//     with activation skipped is activated all the same. Answers the LV with
//     its device.
//   - lvm_lv_deactivate: inactive is success; FAILED_PRECONDITION while open.
//   - lvm_lv_status: the LV as it is; NOT_FOUND when there is no tagged LV of
//     that name. Changes nothing.
type LvmLvRequest struct {
	VG   string `wire:"1"`
	Name string `wire:"2"`
}

// LvmExtendRequest grows LV Name of VG to SizeBytes: a larger or equal
// size is success (an LV never shrinks: smaller is success too, answering
// the size it has), RESOURCE_EXHAUSTED when the VG (thick) has no room.
// An active LV grows live; its filesystem is the host's to grow.
type LvmExtendRequest struct {
	VG        string `wire:"1"`
	Name      string `wire:"2"`
	SizeBytes int64  `wire:"3"`
}

// LvmSnapshotRequest makes Name a thin snapshot of the thin LV Origin in the
// same pool (instant, sharing every block): a snapshot to keep (Writable
// false: read-only, activation skipped, as LVM makes thin snapshots), or a
// writable copy to use as a volume (restore, clone: Writable true, active
// when Activate). SizeBytes above the origin's grows the copy at once (a
// restore into a larger volume; the host grows the filesystem at stage).
// An active origin is suspended for the moment of the snapshot. A tagged
// LV of that name already there is success (Existed). NOT_FOUND for a
// missing origin, INVALID_ARGUMENT for a thick one.
type LvmSnapshotRequest struct {
	VG        string   `wire:"1"`
	Origin    string   `wire:"2"`
	Name      string   `wire:"3"`
	Tags      []string `wire:"4"`
	Writable  bool     `wire:"5"`
	Activate  bool     `wire:"6"`
	SizeBytes int64    `wire:"7"`
}

// LvmListRequest lists the tagged LVs of VG; with ThinPool, only that
// pool's; with Tag, only those that also carry Tag.
type LvmListRequest struct {
	VG       string `wire:"1"`
	ThinPool string `wire:"2"`
	Tag      string `wire:"3"`
}

// LvmLv is one tagged LV. Path, Major and Minor are its device while it is
// active (Path is /dev/mapper/<VG>-<Name> as device-mapper names it, Major
// and Minor its device number, by which the host and other families tell
// it: a block source exported elsewhere is checked by its number, never by
// its name). MappedBytes is the part of a thin LV with blocks behind it.
// ReadOnly is LVM's permission; Health is lv_health_status ("" when
// healthy: "partial", "failed", ...).
type LvmLv struct {
	VG          string   `wire:"1"`
	Name        string   `wire:"2"`
	UUID        string   `wire:"3"`
	SizeBytes   int64    `wire:"4"`
	ThinPool    string   `wire:"5"`
	Origin      string   `wire:"6"`
	Tags        []string `wire:"7"` // all but LvmOwnerTag
	Active      bool     `wire:"8"`
	Path        string   `wire:"9"`
	Major       uint32   `wire:"10"`
	Minor       uint32   `wire:"11"`
	MappedBytes int64    `wire:"12"`
	ReadOnly    bool     `wire:"13"`
	Health      string   `wire:"14"`
	Existed     bool     `wire:"15"` // create or snapshot found it made before
	// ThinID is a thin LV's device id in its pool's metadata (the pool's
	// device-mapper name is DMName(VG, ThinPool)+"-tpool"), by which the
	// host reads its mapped and changed blocks.
	ThinID uint32 `wire:"16"`
}

// LvmLvList is the answer of lvm_lv_list, in name order.
type LvmLvList struct {
	LVs []LvmLv `wire:"1"`
}
