package abi

// Messages of the "dm" host calls: thin provisioning on device-mapper. The
// family's roots are device-mapper name prefixes (every pool name must start
// with one; a thin device of pool P is named P-<id>) and absolute paths of
// the block devices a pool may be built on. A pool is opened once
// (dm_pool_open, typically from configure); every other call names it.
//
// The pool's metadata keeps thin ids, mappings and snapshot sharing across
// reboots, but no sizes: a module records each volume's size and passes it
// to dm_thin_activate. Sizes are bytes and must be multiples of 512.
// The codec is generated into hc_dm_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "dm" family.
const (
	// HostCallDmPoolOpen activates a thin pool over granted devices, creating its
	// metadata when new.
	HostCallDmPoolOpen = "dm_pool_open" // DmPoolOpenRequest -> DmPoolOpenResponse
	// HostCallDmPoolStatus answers a thin pool's data and metadata usage.
	HostCallDmPoolStatus = "dm_pool_status" // DmPoolRequest -> DmPoolStatus
	// HostCallDmThinCreate creates and activates a thin volume.
	HostCallDmThinCreate = "dm_thin_create" // DmThinRequest -> DmThinResponse
	// HostCallDmThinActivate activates an existing thin volume.
	HostCallDmThinActivate = "dm_thin_activate" // DmThinRequest -> DmThinResponse
	// HostCallDmThinDeactivate removes a thin volume's device, keeping its data.
	HostCallDmThinDeactivate = "dm_thin_deactivate" // DmThinRequest -> Empty
	// HostCallDmThinDelete deactivates and deletes a thin volume.
	HostCallDmThinDelete = "dm_thin_delete" // DmThinRequest -> Empty
	// HostCallDmThinResize changes a thin volume's virtual size.
	HostCallDmThinResize = "dm_thin_resize" // DmThinRequest -> Empty
	// HostCallDmThinSnapshot snapshots a thin volume inside its pool.
	HostCallDmThinSnapshot = "dm_thin_snapshot" // DmThinSnapshotRequest -> Empty
	// HostCallDmThinStatus answers whether a thin volume exists, whether it is active
	// and how much of it is mapped.
	HostCallDmThinStatus = "dm_thin_status" // DmThinRequest -> DmThinStatus
)

// DmPoolOpenRequest activates a thin pool: an existing one as its metadata
// describes it, or, with Format and a metadata device that holds no pool,
// a fresh one. An active pool on the same devices is success. Errors:
// FAILED_PRECONDITION when the metadata holds no pool and Format is unset
// or a device is in use; INVALID_ARGUMENT for a block size the metadata
// contradicts; PERMISSION_DENIED for a name or device outside the grants.
type DmPoolOpenRequest struct {
	Pool    string `wire:"1"` // device-mapper name of the pool
	MetaDev string `wire:"2"` // metadata block device: 48 bytes per data block + 4 KiB per thin, at least 2 MiB
	DataDev string `wire:"3"` // data block device
	// BlockSectors is the data block size in 512-byte sectors: a multiple
	// of 128 from 128 (64 KiB) to 2097152 (1 GiB). Required with Format;
	// 0 on open takes it from the metadata.
	BlockSectors uint64 `wire:"4"`
	// LowWaterBlocks: free data blocks below which the kernel raises an
	// event.
	LowWaterBlocks uint64 `wire:"5"`
	Format         bool   `wire:"6"`
}

// DmPoolOpenResponse tells how the pool was opened.
type DmPoolOpenResponse struct {
	Path         string       `wire:"1"` // the pool device's node
	Formatted    bool         `wire:"2"` // a new pool was created
	BlockSectors uint64       `wire:"3"`
	Status       DmPoolStatus `wire:"4"`
}

// DmPoolRequest names an open pool.
type DmPoolRequest struct {
	Pool string `wire:"1"`
}

// DmPoolStatus is the pool's usage and health. Metadata blocks are 4 KiB,
// data blocks BlockSectors * 512 bytes. A pool that is ReadOnly,
// OutOfDataSpace, NeedsCheck or Failed cannot take new volumes.
type DmPoolStatus struct {
	TransactionID   uint64 `wire:"1"`
	UsedMetaBlocks  uint64 `wire:"2"`
	TotalMetaBlocks uint64 `wire:"3"`
	UsedDataBlocks  uint64 `wire:"4"`
	TotalDataBlocks uint64 `wire:"5"`
	BlockSectors    uint64 `wire:"6"`
	ReadOnly        bool   `wire:"7"`
	OutOfDataSpace  bool   `wire:"8"`
	NeedsCheck      bool   `wire:"9"`
	Failed          bool   `wire:"10"`
}

// DmThinRequest names thin device ID (0 to 2^24-1) of Pool. SizeBytes is
// the volume size for create, activate and resize, unused otherwise.
//
//   - dm_thin_create: ALREADY_EXISTS when the id is in use; answers the node.
//   - dm_thin_activate: NOT_FOUND when the pool has no such id; active with
//     another size is ALREADY_EXISTS.
//   - dm_thin_deactivate: inactive is success; FAILED_PRECONDITION while open.
//   - dm_thin_delete: deactivates, then deletes; NOT_FOUND when already gone.
//   - dm_thin_resize: grows an active device; shrinking is INVALID_ARGUMENT;
//     for an inactive device the module's record is the size.
//   - dm_thin_status: what the kernel knows of the id (DmThinStatus); it
//     changes nothing.
type DmThinRequest struct {
	Pool      string `wire:"1"`
	ID        uint32 `wire:"2"`
	SizeBytes int64  `wire:"3"`
}

// DmThinResponse answers the node of an active thin device.
type DmThinResponse struct {
	Path string `wire:"1"`
}

// DmThinSnapshotRequest creates thin device SnapshotID of Pool as a
// snapshot of OriginID, sharing its blocks; an active origin is suspended
// for the moment. The snapshot stays inactive and has the origin's size.
// NOT_FOUND for a missing origin, ALREADY_EXISTS for a used SnapshotID.
type DmThinSnapshotRequest struct {
	Pool       string `wire:"1"`
	OriginID   uint32 `wire:"2"`
	SnapshotID uint32 `wire:"3"`
}

// DmThinStatus is one thin device as the kernel sees it. Exists says the
// pool's metadata holds the id (asked by loading a thin table for it into
// a device that is never activated, so an inactive volume is checked
// without activating it). Active says a block device serves it at Path;
// SizeBytes is then that device's size and MappedBytes the part of it
// with data blocks behind it, and Failed says its target reports failure
// (the pool failed under it).
type DmThinStatus struct {
	Exists      bool   `wire:"1"`
	Active      bool   `wire:"2"`
	Path        string `wire:"3"`
	SizeBytes   int64  `wire:"4"`
	MappedBytes int64  `wire:"5"`
	Failed      bool   `wire:"6"`
}
