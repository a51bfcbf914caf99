package state

import "time"

// Records are encoded in the protobuf wire format by the codec wiregen
// writes from their wire tags (records_wire.go, ephemeral_wire.go; see
// abi/CODEC.md): tagged fields, zero values omitted, maps in key order (so
// equal records encode to equal bytes), nested records length-delimited.
// The decoder skips field numbers it does not know, so a newer daemon may
// add fields without a schema bump and an older one still reads its
// records. A record holding a string that is not valid UTF-8 is refused
// before it is written, since it could not be read back.
//
// Field numbers are part of the on-disk format, pinned by
// testdata/records.golden: never renumber or reuse one. The encoding was
// chosen over encoding/json and encoding/gob after measuring
// (BenchmarkCodec, a typical volume): about twice as fast as JSON to
// encode, three times to decode, and less than half the size; gob, which
// must repeat its type description in every independently decodable
// value, is slower and larger than both.
//
//go:generate go run github.com/wasmcsi/wasmcsi/abi/internal/wiregen -utf8 .

// Empty and nil maps and slices are the same to the store: a record read back
// has nil where an empty one was written. Times come back in UTC without a
// monotonic reading; compare them with time.Time.Equal.

// Volume is a volume the controller created.
type Volume struct {
	ID      string `wire:"1"` // CSI volume ID handed to the CO
	Name    string `wire:"2"` // CO-chosen name; unique among volumes (the idempotency key)
	Backend string `wire:"3"` // backend module that owns the volume
	LocalID string `wire:"4"` // the backend's own name for it

	CapacityBytes int64             `wire:"5"`
	Parameters    map[string]string `wire:"6"` // CreateVolume parameters as given
	Context       map[string]string `wire:"7"` // volume context returned to the CO
	Capabilities  []Capability      `wire:"8"`

	SourceSnapshotID string `wire:"9"` // content source, if any
	SourceVolumeID   string `wire:"10"`

	Topology  []map[string]string `wire:"11"` // accessible topology segments
	CreatedAt time.Time           `wire:"12"`

	// Published holds ControllerPublishVolume results by node ID.
	Published map[string]PublishedNode `wire:"13"`

	// MutableParameters are the volume's current mutable parameters: those
	// of CreateVolume with every later ControllerModifyVolume merged in.
	MutableParameters map[string]string `wire:"14"`

	// Deleting is set, durably, before DeleteVolume asks the module to
	// delete the volume; the record goes once the deletion is durable
	// (host/RATIONALE.md, "Records").
	Deleting bool `wire:"15"`
}

// Intent is an operation the controller logged durably before asking a
// module to do it, kept until what the module did is durable; start-up
// finishes the ones it finds (host/RATIONALE.md, "Records").
type Intent struct {
	Key     string `wire:"1"` // what it is about: "volume/" + the CreateVolume name
	Op      string `wire:"2"` // the module operation, "create_volume"
	Backend string `wire:"3"`
	Request []byte `wire:"4"` // the module request, in the abi wire encoding
	// SourceSnapshotID and SourceVolumeID are the CSI IDs of the content
	// source, which the module request names only by local references.
	SourceSnapshotID string    `wire:"5"`
	SourceVolumeID   string    `wire:"6"`
	CreatedAt        time.Time `wire:"7"`
}

// Capability is one CSI VolumeCapability.
type Capability struct {
	Block      bool     `wire:"1"` // block access; otherwise mount access
	FsType     string   `wire:"2"`
	MountFlags []string `wire:"3"`
	AccessMode int32    `wire:"4"` // csi.VolumeCapability_AccessMode_Mode value
}

// PublishedNode is the result of publishing a volume to one node. Its
// field 1 is the node ID, Volume.Published's key.
type PublishedNode struct {
	ReadOnly bool              `wire:"2"`
	Context  map[string]string `wire:"3"` // publish context returned to the CO
	// Capability is the one it was published with, which a repeated
	// publication must match; nil in records written before it was kept.
	Capability *Capability `wire:"4"`
}

// Snapshot is a snapshot the controller created.
type Snapshot struct {
	ID             string            `wire:"1"`
	Name           string            `wire:"2"` // unique among snapshots
	Backend        string            `wire:"3"`
	LocalID        string            `wire:"4"`
	SourceVolumeID string            `wire:"5"`
	SizeBytes      int64             `wire:"6"`
	Context        map[string]string `wire:"7"`
	CreatedAt      time.Time         `wire:"8"`
	ReadyToUse     bool              `wire:"9"`
	GroupID        string            `wire:"10"` // VolumeGroupSnapshot this snapshot belongs to, if any
	// Topology is where the snapshot can be restored, if the backend says.
	Topology []map[string]string `wire:"11"`
	// Deleting is set, durably, before DeleteSnapshot asks the module to
	// delete the snapshot, as Volume.Deleting.
	Deleting bool `wire:"12"`
}

// Group is a VolumeGroupSnapshot.
type Group struct {
	ID          string    `wire:"1"`
	Name        string    `wire:"2"` // unique among groups
	SnapshotIDs []string  `wire:"3"`
	CreatedAt   time.Time `wire:"4"`
	// SourceVolumeIDs are the group's volumes, sorted, and Parameters the
	// request's parameters: with Name, the idempotency key.
	SourceVolumeIDs []string          `wire:"5"`
	Parameters      map[string]string `wire:"6"`
}

// Stage is a volume staged on this node (NodeStageVolume), keyed by volume ID.
type Stage struct {
	VolumeID    string            `wire:"1"`
	StagingPath string            `wire:"2"`
	Backend     string            `wire:"3"`
	Device      string            `wire:"4"` // block device the volume is attached as, if any
	Directory   string            `wire:"5"` // backing directory for directory-backed volumes
	FsType      string            `wire:"6"`
	MountFlags  []string          `wire:"7"`
	Block       bool              `wire:"8"`
	Context     map[string]string `wire:"9"` // what the backend's node_stage returned
	AccessMode  int32             `wire:"10"`
	StagedAt    time.Time         `wire:"11"`
	// VolumeContext is the CO's volume context, kept so that a re-stage
	// after a reboot and node_unstage see what node_stage saw.
	VolumeContext map[string]string `wire:"12"`
	// BackendFlags are mount flags the backend added (e.g. nouuid).
	BackendFlags []string `wire:"13"`
	// DeviceFile identifies the file behind Device when it is a loop
	// device ("<st_dev>:<st_ino>"): a reboot hands loop device numbers out
	// afresh, so the recorded number alone may name another file's device.
	DeviceFile string `wire:"14"`
	// Unstaging is set, durably, before NodeUnstageVolume takes the stage
	// down (host/RATIONALE.md, "Records", says why).
	Unstaging bool `wire:"15"`
	// LostReported is set once start-up has reported that the stage is
	// gone and waits for the CO's next NodeStage, so that it is reported
	// once, not at every start.
	LostReported bool `wire:"16"`
}

// Publish is a volume published on this node (NodePublishVolume), keyed by
// volume ID and target path.
type Publish struct {
	VolumeID    string   `wire:"1"`
	TargetPath  string   `wire:"2"`
	StagingPath string   `wire:"3"`
	ReadOnly    bool     `wire:"4"`
	Block       bool     `wire:"5"`
	MountFlags  []string `wire:"6"`
	Backend     string   `wire:"7"`
	// Device is the read-only loop device a read-only block publication
	// binds instead of the staged device.
	Device      string            `wire:"8"`
	FsType      string            `wire:"9"`
	Context     map[string]string `wire:"10"`
	AccessMode  int32             `wire:"11"`
	PublishedAt time.Time         `wire:"12"`
}

// Adopted reports whether start-up rebuilt p from the mount table and the
// CO has not published it again since: such a record has no time and no
// mount flags, which the mount table does not show (host/RATIONALE.md,
// "Records").
func (p *Publish) Adopted() bool { return p.PublishedAt.IsZero() && p.MountFlags == nil }
