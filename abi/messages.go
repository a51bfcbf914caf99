package abi

// Messages of the operations a module exports. Field numbers are the wire
// contract: never renumber or reuse one; add new fields with new numbers.
// The codec (see CODEC.md) is generated into messages_wire.go.

// AccessMode mirrors csi.VolumeCapability_AccessMode_Mode numerically.
type AccessMode int32

const (
	AccessUnknown                AccessMode = 0
	AccessSingleNodeWriter       AccessMode = 1
	AccessSingleNodeReadOnly     AccessMode = 2
	AccessMultiNodeReadOnly      AccessMode = 3
	AccessMultiNodeSingleWriter  AccessMode = 4
	AccessMultiNodeMultiWriter   AccessMode = 5
	AccessSingleNodeSingleWriter AccessMode = 6
	AccessSingleNodeMultiWriter  AccessMode = 7
)

// Capability is one requested volume capability.
type Capability struct {
	Block      bool       `wire:"1"` // raw block access; false = mount access
	FsType     string     `wire:"2"` // mount access only; "" = the backend's default
	MountFlags []string   `wire:"3"`
	AccessMode AccessMode `wire:"4"`
	MountGroup string     `wire:"5"` // volume_mount_group
}

// Topology is one topology segment set, e.g. {"topology.wasmcsi.dev/node": "n1"}.
type Topology struct {
	Segments map[string]string `wire:"1"`
}

// VolumeRef identifies a volume to its module: the module's own local ID and
// the context it returned when it created the volume (carried to nodes by the
// CO as volume_context, so node operations need no controller record).
type VolumeRef struct {
	LocalID       string            `wire:"1"`
	Context       map[string]string `wire:"2"`
	CapacityBytes int64             `wire:"3"`
}

// SnapshotRef identifies a snapshot to its module.
type SnapshotRef struct {
	LocalID   string            `wire:"1"`
	Context   map[string]string `wire:"2"`
	SizeBytes int64             `wire:"3"`
	// Source is the volume the snapshot was taken from.
	Source VolumeRef `wire:"4"`
}

// BackendInfo is the answer of the required backend_info export. The host
// reads it once at load; it decides which capabilities the daemon advertises
// and which requests the host refuses before calling the module.
type BackendInfo struct {
	Name        string `wire:"1"` // informative; the module's file name is its routing name
	Version     string `wire:"2"`
	Description string `wire:"3"`
	// Ops lists the operations the module implements. An operation is
	// available when it is exported and, if Ops is not empty, listed here
	// (SDK modules export every operation and list what they implement).
	Ops []string `wire:"4"`
	// AccessModes the backend supports; empty means SINGLE_NODE_WRITER only.
	AccessModes []int64 `wire:"5"`
	Mount       bool    `wire:"6"` // mount access type
	Block       bool    `wire:"7"` // block access type
	// FsTypes accepted for mount access; DefaultFsType applies when the CO
	// names none. Directory backends leave both empty.
	FsTypes       []string `wire:"8"`
	DefaultFsType string   `wire:"9"`
	// Granularity is the allocation unit in bytes: the host rounds requested
	// sizes up to a multiple of it. 0 means 1.
	Granularity  int64 `wire:"10"`
	MinSizeBytes int64 `wire:"11"`
	MaxSizeBytes int64 `wire:"12"` // 0 = no maximum
	// DefaultSizeBytes is used when a CreateVolume names no capacity.
	DefaultSizeBytes int64 `wire:"13"`
	// TopologyKeys the backend reports in node_info and uses in create_volume.
	TopologyKeys []string `wire:"14"`
	Clone        bool     `wire:"15"` // create_volume accepts a volume source
	Restore      bool     `wire:"16"` // create_volume accepts a snapshot source
	// NodeExpansion is true when a controller expansion also needs the
	// node to grow the device or filesystem (block backends).
	NodeExpansion bool `wire:"17"`
	// ExpandOffline is true when expansion needs the volume unpublished.
	ExpandOffline bool `wire:"18"`
	// MaxVolumesPerNode for NodeGetInfo; 0 = no limit.
	MaxVolumesPerNode int64 `wire:"19"`
	// MutableParameters are the parameter keys modify_volume can change
	// (VolumeAttributesClass keys). The host refuses any other key in
	// CreateVolume's and ControllerModifyVolume's mutable_parameters with
	// INVALID_ARGUMENT before calling the module; a module without
	// modify_volume has none.
	MutableParameters []string `wire:"20"`
	// Ephemeral is true when the backend's storage is local to the node
	// that serves it, so that a node daemon can create, stage, publish and
	// delete a volume by itself: the host then serves CSI ephemeral inline
	// volumes of this backend (NodePublishVolume with the volume context
	// "csi.storage.k8s.io/ephemeral": "true"), calling create_volume and
	// delete_volume on the node. A backend whose volumes a controller must
	// place or publish (a shared target, a remote array) leaves it false.
	Ephemeral bool `wire:"21"`
	// DeclaresParameters makes Parameters the whole list of the
	// StorageClass parameters the backend accepts (none when empty). The
	// host then checks every CreateVolume's and GetCapacity's parameters
	// (and the values of mutable parameters) against it before calling the
	// module: an unknown key or a value of the wrong type or not allowed is
	// INVALID_ARGUMENT naming it. Keys of the CO's own, starting with
	// "csi.storage.k8s.io/", always pass. Without it the module checks its
	// parameters itself, as modules built before it do.
	DeclaresParameters bool `wire:"22"`
	// Parameters are the StorageClass parameters the backend accepts.
	Parameters []ParameterSpec `wire:"23"`
	// SingleNodeMultiWriter and ReadOnly publish are implied by AccessModes.
}

// ParameterSpec declares one StorageClass parameter. The host checks a
// value against Type and Allowed; the module reads it (with Default when
// it is absent: the host does not fill it in).
type ParameterSpec struct {
	// Name is the parameter's key.
	Name string `wire:"1"`
	// Type is ParamString (any value, the default when empty), ParamBool
	// ("true" or "false"), ParamInt (a decimal int64) or ParamQuantity (a
	// byte count: digits with an optional Ki, Mi, Gi, Ti suffix).
	Type string `wire:"2"`
	// Default is what an absent parameter means, as a value of Type
	// (sdk.ParameterValue returns it), or "" when that depends on more
	// than the parameter (say, on the module's configuration): then
	// DefaultNote says it.
	Default string `wire:"3"`
	// Allowed, when not empty, are the only values accepted.
	Allowed []string `wire:"4"`
	// Mutable is true when a VolumeAttributesClass may set it too
	// (BackendInfo.MutableParameters lists it).
	Mutable bool `wire:"5"`
	// Description says what it does, in one line.
	Description string `wire:"6"`
	// DefaultNote, when set, is what the documentation shows as the
	// default instead of Default: prose such as "the config's prealloc
	// (false)". Never read as a value.
	DefaultNote string `wire:"7"`
}

// DescriptionSection is the name of the custom section that describes a
// built module (ModuleDescription, encoded like every message), so tools
// read what a module is and asks for without running it. wasmcsi modules
// inspect --write adds it (the SDK's declarations in BackendInfo are its
// source); a module without it loads as before.
const DescriptionSection = "wasmcsi.module"

// ModuleDescription is the content of the DescriptionSection.
type ModuleDescription struct {
	Name        string `wire:"1"`
	Version     string `wire:"2"`
	Description string `wire:"3"`
	// ABIVersion is the module's wasmcsi_abi_version.
	ABIVersion int64 `wire:"4"`
	// HostCallFamilies are the families its imports need granted.
	HostCallFamilies []string `wire:"5"`
	// DeclaresParameters and Parameters are BackendInfo's.
	DeclaresParameters bool            `wire:"6"`
	Parameters         []ParameterSpec `wire:"7"`
}

// ParameterSpec types.
const (
	ParamString   = "string"
	ParamBool     = "bool"
	ParamInt      = "int"
	ParamQuantity = "quantity"
)

// ConfigureRequest is sent to configure once at load, before any other
// operation. The module checks its configuration and keeps it; an error
// refuses the module with the module's message.
type ConfigureRequest struct {
	Config map[string]string `wire:"1"` // the operator's module config
	Roots  []string          `wire:"2"` // the granted roots
	NodeID string            `wire:"3"`
	// Role is "controller", "node" or "all".
	Role string `wire:"4"`
}

// Empty is the answer of operations that return nothing.
type Empty struct{}

// VolumeSource is a CreateVolume content source resolved by the host: the
// host checks the source exists and belongs to the same backend.
type VolumeSource struct {
	Snapshot *SnapshotRef `wire:"1"`
	Volume   *VolumeRef   `wire:"2"`
}

// CreateVolumeRequest asks the module to place and provision a volume. The
// host has validated the request, rounded the sizes to Granularity and
// checked them against the limits of BackendInfo.
type CreateVolumeRequest struct {
	Name          string            `wire:"1"`
	RequiredBytes int64             `wire:"2"`
	LimitBytes    int64             `wire:"3"`
	Parameters    map[string]string `wire:"4"` // StorageClass parameters, host keys removed
	Capabilities  []Capability      `wire:"5"`
	Source        *VolumeSource     `wire:"6"`
	Requisite     []Topology        `wire:"7"`
	Preferred     []Topology        `wire:"8"`
	// MutableParameters (VolumeAttributesClass) if any: only keys of
	// BackendInfo.MutableParameters, which take precedence over the same
	// keys in Parameters.
	MutableParameters map[string]string `wire:"9"`
}

// CreateVolumeResponse describes the new volume.
type CreateVolumeResponse struct {
	// LocalID is unique within the module; the host builds the CSI volume
	// ID from the module's name and LocalID. Characters: [A-Za-z0-9._-],
	// the first a letter or digit; "<module>:<LocalID>" fits 128 bytes.
	LocalID       string            `wire:"1"`
	CapacityBytes int64             `wire:"2"`
	Context       map[string]string `wire:"3"`
	Topology      []Topology        `wire:"4"`
}

// DeleteVolumeRequest deletes a volume. A volume already gone is success.
type DeleteVolumeRequest struct {
	Volume VolumeRef `wire:"1"`
}

// ExpandVolumeRequest grows a volume on the controller side.
type ExpandVolumeRequest struct {
	Volume        VolumeRef   `wire:"1"`
	RequiredBytes int64       `wire:"2"`
	LimitBytes    int64       `wire:"3"`
	Capability    *Capability `wire:"4"`
}

// ExpandVolumeResponse reports the new size.
type ExpandVolumeResponse struct {
	CapacityBytes         int64             `wire:"1"`
	NodeExpansionRequired bool              `wire:"2"`
	Context               map[string]string `wire:"3"` // replaces the volume's context when not empty
}

// ModifyVolumeRequest changes mutable parameters of a volume
// (ControllerModifyVolume). MutableParameters holds only the keys the CO
// asked to change, each one of BackendInfo.MutableParameters; keys not
// named keep their value. The module checks the values (INVALID_ARGUMENT,
// having changed nothing) and applies them; a repeat with the same values
// must succeed.
type ModifyVolumeRequest struct {
	Volume            VolumeRef         `wire:"1"`
	MutableParameters map[string]string `wire:"2"`
	Secrets           map[string]string `wire:"3"`
}

// ModifyVolumeResponse may carry the volume's new context.
type ModifyVolumeResponse struct {
	Context map[string]string `wire:"1"` // replaces the volume's context when not empty
}

// CreateSnapshotRequest cuts a snapshot of a volume.
type CreateSnapshotRequest struct {
	Name       string            `wire:"1"`
	Source     VolumeRef         `wire:"2"`
	Parameters map[string]string `wire:"3"`
	// Requisite and Preferred constrain where the snapshot must be
	// accessible (SNAPSHOT_ACCESSIBILITY_CONSTRAINTS); a backend that cannot
	// honour Requisite answers RESOURCE_EXHAUSTED.
	Requisite []Topology `wire:"4"`
	Preferred []Topology `wire:"5"`
}

// CreateSnapshotResponse describes the new snapshot.
type CreateSnapshotResponse struct {
	LocalID    string            `wire:"1"` // as CreateVolumeResponse.LocalID
	SizeBytes  int64             `wire:"2"`
	Context    map[string]string `wire:"3"`
	ReadyToUse bool              `wire:"4"`
	Topology   []Topology        `wire:"5"` // where the snapshot can be restored; empty = anywhere the source could be
}

// DeleteSnapshotRequest deletes a snapshot. A snapshot already gone is success.
type DeleteSnapshotRequest struct {
	Snapshot SnapshotRef `wire:"1"`
}

// GetCapacityRequest asks how much could be provisioned.
type GetCapacityRequest struct {
	Parameters map[string]string `wire:"1"`
	Topology   *Topology         `wire:"2"`
	Capability *Capability       `wire:"3"`
}

// GetCapacityResponse answers GetCapacity.
type GetCapacityResponse struct {
	AvailableBytes    int64 `wire:"1"`
	MaximumVolumeSize int64 `wire:"2"`
	MinimumVolumeSize int64 `wire:"3"`
}

// ControllerPublishRequest makes a volume reachable from a node.
type ControllerPublishRequest struct {
	Volume     VolumeRef  `wire:"1"`
	NodeID     string     `wire:"2"`
	ReadOnly   bool       `wire:"3"`
	Capability Capability `wire:"4"`
	// NodeContext holds what the node reported about itself in node_info
	// (e.g. its iSCSI initiator name), as recorded in the node ID.
	NodeContext map[string]string `wire:"5"`
}

// ControllerPublishResponse carries the publish context to the node.
type ControllerPublishResponse struct {
	PublishContext map[string]string `wire:"1"`
}

// ControllerUnpublishRequest revokes a node's access. Already revoked is success.
type ControllerUnpublishRequest struct {
	Volume      VolumeRef         `wire:"1"`
	NodeID      string            `wire:"2"`
	NodeContext map[string]string `wire:"3"`
}

// VolumeHealthRequest asks how a volume is. On a node, the paths say where
// the CO staged or published it (either may be empty).
type VolumeHealthRequest struct {
	Volume      VolumeRef `wire:"1"`
	OnNode      bool      `wire:"2"`
	StagingPath string    `wire:"3"`
	PublishPath string    `wire:"4"`
	Device      string    `wire:"5"` // the staged device, when the node has one
}

// HealthStatus mirrors csi.VolumeHealthErrorType (for volumes) and
// csi.StorageHealthErrorType (for storage) numerically.
type HealthStatus int32

const (
	HealthUnknown      HealthStatus = 0
	HealthDegraded     HealthStatus = 1 // DEGRADED / STORAGE_DEGRADED
	HealthInaccessible HealthStatus = 2 // INACCESSIBLE / STORAGE_UNREACHABLE
	HealthDataLoss     HealthStatus = 3 // DATA_LOSS (volumes only)
)

// HealthEntry is one adverse condition. Reason is a CamelCase word.
type HealthEntry struct {
	Status  HealthStatus `wire:"1"`
	Reason  string       `wire:"2"`
	Message string       `wire:"3"`
}

// ListOwnedRequest asks a module for every volume and snapshot its storage
// holds (list_owned), for the host to find at start-up what no record
// explains. It has no fields yet.
type ListOwnedRequest struct{}

// ListOwnedResponse lists what the module's storage holds, as the module
// would answer it from create_volume or create_snapshot: the local ID, the
// context its delete needs, and the CO's name when the storage keeps it
// ("" when it does not).
type ListOwnedResponse struct {
	Items []OwnedItem `wire:"1"`
}

// OwnedItem is one volume or snapshot in a module's storage.
type OwnedItem struct {
	LocalID  string            `wire:"1"`
	Snapshot bool              `wire:"2"`
	Name     string            `wire:"3"`
	Context  map[string]string `wire:"4"`
	// SizeBytes is a volume's capacity or a snapshot's size.
	SizeBytes int64 `wire:"5"`
}

// HealthResponse answers volume_health and storage_health; no entries
// means healthy.
type HealthResponse struct {
	Entries []HealthEntry `wire:"1"`
}

// NodeInfoResponse is what a node reports about itself.
type NodeInfoResponse struct {
	Topology *Topology `wire:"1"`
	// Context is published to the controller through the node ID (kept
	// small: e.g. the iSCSI initiator name).
	Context map[string]string `wire:"2"`
}

// NodeStageRequest asks the module to make a volume's storage present on
// this node and say where it is. The host then does the generic steps
// (format when blank, mount at StagingPath, bind for publish).
type NodeStageRequest struct {
	Volume VolumeRef `wire:"1"`
	// PublishContext is what controller_publish returned, with the host's
	// own key wasmcsi.dev/published-node beside it.
	PublishContext map[string]string `wire:"2"`
	StagingPath    string            `wire:"3"`
	Capability     Capability        `wire:"4"`
	Secrets        map[string]string `wire:"5"`
}

// NodeStageResponse names the storage the host should use: a block Device
// (formatted and mounted by the host for mount access) or a Directory
// (bind-mounted by the host). Exactly one is set.
type NodeStageResponse struct {
	Device    string `wire:"1"`
	Directory string `wire:"2"`
	// MountFlags are added to the CO's mount flags (e.g. "nouuid" for XFS clones).
	MountFlags []string `wire:"3"`
	// Context is kept in the node's stage record and handed back to
	// node_unstage and node_expand.
	Context map[string]string `wire:"4"`
}

// NodeUnstageRequest runs after the host has unmounted the staging path;
// the module releases the storage (detach a loop device, log out).
type NodeUnstageRequest struct {
	Volume       VolumeRef         `wire:"1"`
	Device       string            `wire:"2"`
	Directory    string            `wire:"3"`
	StageContext map[string]string `wire:"4"`
}

// NodeExpandRequest asks the module to make the node's device show the new
// size (loop capacity, iSCSI rescan); the host then grows the filesystem.
type NodeExpandRequest struct {
	Volume        VolumeRef         `wire:"1"`
	Device        string            `wire:"2"`
	RequiredBytes int64             `wire:"3"`
	StageContext  map[string]string `wire:"4"`
}

// NodeExpandResponse reports the device's size after the module's step.
type NodeExpandResponse struct {
	CapacityBytes int64 `wire:"1"`
}

// SnapshotDataRequest asks where a snapshot's data can be read, for the
// SnapshotMetadata service.
type SnapshotDataRequest struct {
	Snapshot SnapshotRef `wire:"1"`
}

// SnapshotDataResponse says where a snapshot's data is, for the host to
// compute its allocated ranges and the ranges changed since an older
// snapshot: either a file in a granted root (Path), whose data segments
// and differing blocks the host reads, or a thin device of a
// device-mapper thin pool the module opened (ThinPool and ThinID, with the
// dm grant), whose mapped and changed blocks the host reads from the
// pool's metadata; ranges then come in the pool's blocks and BlockSize is
// ignored. Changed ranges are computed only between two snapshots of the
// same kind (and, for thin devices, of one pool).
type SnapshotDataResponse struct {
	Path      string `wire:"1"`
	SizeBytes int64  `wire:"2"`
	// BlockSize is the granularity of a file's reported ranges; 0 = 4096.
	BlockSize int64  `wire:"3"`
	ThinPool  string `wire:"4"`
	ThinID    uint32 `wire:"5"`
}
