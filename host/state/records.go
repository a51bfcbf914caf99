package state

import "time"

// Empty and nil maps and slices are the same to the store: a record read back
// has nil where an empty one was written. Times come back in UTC without a
// monotonic reading; compare them with time.Time.Equal.

// Volume is a volume the controller created.
type Volume struct {
	ID      string // CSI volume ID handed to the CO
	Name    string // CO-chosen name; unique among volumes (the idempotency key)
	Backend string // backend module that owns the volume
	LocalID string // the backend's own name for it

	CapacityBytes int64
	Parameters    map[string]string // CreateVolume parameters as given
	Context       map[string]string // volume context returned to the CO
	Capabilities  []Capability

	SourceSnapshotID string // content source, if any
	SourceVolumeID   string

	Topology  []map[string]string // accessible topology segments
	CreatedAt time.Time

	// Published holds ControllerPublishVolume results by node ID.
	Published map[string]PublishedNode

	// MutableParameters are the volume's current mutable parameters: those
	// of CreateVolume with every later ControllerModifyVolume merged in.
	MutableParameters map[string]string

	// Deleting is set, durably, before DeleteVolume asks the module to
	// delete the volume; the record goes once the deletion is durable
	// (host/RATIONALE.md, "Records").
	Deleting bool
}

// Intent is an operation the controller logged durably before asking a
// module to do it, kept until what the module did is durable; start-up
// finishes the ones it finds (host/RATIONALE.md, "Records").
type Intent struct {
	Key     string // what it is about: "volume/" + the CreateVolume name
	Op      string // the module operation, "create_volume"
	Backend string
	Request []byte // the module request, in the abi wire encoding
	// SourceSnapshotID and SourceVolumeID are the CSI IDs of the content
	// source, which the module request names only by local references.
	SourceSnapshotID string
	SourceVolumeID   string
	CreatedAt        time.Time
}

// Capability is one CSI VolumeCapability.
type Capability struct {
	Block      bool // block access; otherwise mount access
	FsType     string
	MountFlags []string
	AccessMode int32 // csi.VolumeCapability_AccessMode_Mode value
}

// PublishedNode is the result of publishing a volume to one node.
type PublishedNode struct {
	ReadOnly bool
	Context  map[string]string // publish context returned to the CO
	// Capability is the one it was published with, which a repeated
	// publication must match; nil in records written before it was kept.
	Capability *Capability
}

// Snapshot is a snapshot the controller created.
type Snapshot struct {
	ID             string
	Name           string // unique among snapshots
	Backend        string
	LocalID        string
	SourceVolumeID string
	SizeBytes      int64
	Context        map[string]string
	CreatedAt      time.Time
	ReadyToUse     bool
	GroupID        string // VolumeGroupSnapshot this snapshot belongs to, if any
	// Topology is where the snapshot can be restored, if the backend says.
	Topology []map[string]string
}

// Group is a VolumeGroupSnapshot.
type Group struct {
	ID          string
	Name        string // unique among groups
	SnapshotIDs []string
	CreatedAt   time.Time
	// SourceVolumeIDs are the group's volumes, sorted, and Parameters the
	// request's parameters: with Name, the idempotency key.
	SourceVolumeIDs []string
	Parameters      map[string]string
}

// Stage is a volume staged on this node (NodeStageVolume), keyed by volume ID.
type Stage struct {
	VolumeID    string
	StagingPath string
	Backend     string
	Device      string // block device the volume is attached as, if any
	Directory   string // backing directory for directory-backed volumes
	FsType      string
	MountFlags  []string
	Block       bool
	Context     map[string]string // what the backend's node_stage returned
	AccessMode  int32
	StagedAt    time.Time
	// VolumeContext is the CO's volume context, kept so that a re-stage
	// after a reboot and node_unstage see what node_stage saw.
	VolumeContext map[string]string
	// BackendFlags are mount flags the backend added (e.g. nouuid).
	BackendFlags []string
	// DeviceFile identifies the file behind Device when it is a loop
	// device ("<st_dev>:<st_ino>"): a reboot hands loop device numbers out
	// afresh, so the recorded number alone may name another file's device.
	DeviceFile string
	// Unstaging is set, durably, before NodeUnstageVolume takes the stage
	// down (host/RATIONALE.md, "Records", says why).
	Unstaging bool
	// LostReported is set once start-up has reported that the stage is
	// gone and waits for the CO's next NodeStage, so that it is reported
	// once, not at every start.
	LostReported bool
}

// Publish is a volume published on this node (NodePublishVolume), keyed by
// volume ID and target path.
type Publish struct {
	VolumeID    string
	TargetPath  string
	StagingPath string
	ReadOnly    bool
	Block       bool
	MountFlags  []string
	Backend     string
	// Device is the read-only loop device a read-only block publication
	// binds instead of the staged device.
	Device      string
	FsType      string
	Context     map[string]string
	AccessMode  int32
	PublishedAt time.Time
}
