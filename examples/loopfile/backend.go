package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Module config keys (the operator's `config:` of this module).
const (
	configFsType      = "fs_type"     // default filesystem of mount volumes: ext4 | xfs | btrfs
	configPrealloc    = "prealloc"    // allocate every block of new volumes (bool)
	configDirectIO    = "direct_io"   // attach loop devices with direct I/O (bool)
	configGranularity = "granularity" // allocation unit: bytes, or with Ki/Mi/Gi
)

// StorageClass parameters. Keys under kubernetesPrefix are metadata the
// CO's sidecars add (PVC name, namespace...); they are accepted and ignored.
const (
	paramPrealloc    = "prealloc"
	kubernetesPrefix = "csi.storage.k8s.io/"
)

// Volume and snapshot context keys. The context travels with the volume to
// nodes, so node operations need no controller record.
const (
	ctxPath     = "path"     // the volume's or snapshot's file
	ctxFsType   = "fsType"   // the filesystem mount access uses (absent for block-only volumes)
	ctxNode     = "node"     // the node whose pool holds the file
	ctxPrealloc = "prealloc" // "true" when the volume's blocks are allocated
	stageDevice = "device"   // stage context: the loop device
)

// TopologyKey is the segment that pins a volume to the node holding its file.
const TopologyKey = "topology.wasmcsi.dev/node"

// Sizes the module offers.
const (
	minSizeBytes     = 1 * sdk.MiB
	defaultSizeBytes = 1 * sdk.GiB
	defaultUnit      = 1 * sdk.MiB
	maxUnit          = 1 * sdk.GiB
	// blockUnit: loop devices count in 512-byte sectors and filesystems
	// in 4 KiB blocks, so every size is a multiple of 4 KiB.
	blockUnit = 4 * sdk.KiB
	// snapshotBlockSize is the granularity of SnapshotMetadata ranges.
	snapshotBlockSize = 4096
)

// fsTypes are the filesystems the host can make, in the order offered.
var fsTypes = []string{"ext4", "xfs", "btrfs"}

// fsMinimum is the smallest device each filesystem's mkfs accepts
// (xfsprogs 5.19 and later refuse below 300 MiB; btrfs-progs needs 109 MiB
// for one device with the default profiles). The host does not check it, so
// CreateVolume rounds mount volumes up to it.
func fsMinimum(fs string) int64 {
	switch fs {
	case "xfs":
		return 300 * sdk.MiB
	case "btrfs":
		return 109 * sdk.MiB
	}
	return minSizeBytes
}

// config is the module's checked configuration.
type config struct {
	pool        string // first granted root, cleaned
	nodeID      string
	fsType      string
	prealloc    bool
	directIO    bool
	granularity int64
}

// Backend is the loopfile backend. It holds only its configuration: every
// volume's state is its file, so nothing is lost when an instance goes.
type Backend struct {
	cfg        config
	configured bool
}

// New returns a backend with the default configuration and no pool; the
// host's configure supplies the pool and the node.
func New() *Backend {
	return &Backend{cfg: config{fsType: "ext4", directIO: true, granularity: defaultUnit}}
}

// Configure checks the operator's configuration and keeps it. Any unknown
// key or bad value refuses the module at load (INVALID_ARGUMENT), so a typo
// never silently falls back to a default.
func (b *Backend) Configure(req *abi.ConfigureRequest) error {
	c := config{fsType: "ext4", directIO: true, granularity: defaultUnit}
	if len(req.Roots) == 0 {
		return sdk.Error(abi.InvalidArgument, "loopfile needs a granted root: its first root is the pool folder")
	}
	pool, err := sdk.PoolRoot(req.Roots[0])
	if err != nil {
		return err
	}
	c.pool = pool
	if req.NodeID == "" {
		return sdk.Error(abi.InvalidArgument, "loopfile needs the node ID: volumes are pinned to the node that holds their file")
	}
	c.nodeID = req.NodeID
	for k, v := range req.Config {
		switch k {
		case configFsType:
			if !isFsType(v) {
				return sdk.Error(abi.InvalidArgument, "config ", configFsType, " = ", strconv.Quote(v), ": want one of ", strings.Join(fsTypes, ", "))
			}
			c.fsType = v
		case configPrealloc, configDirectIO:
			on, err := strconv.ParseBool(v)
			if err != nil {
				return sdk.Error(abi.InvalidArgument, "config ", k, " = ", strconv.Quote(v), ": want true or false")
			}
			if k == configPrealloc {
				c.prealloc = on
			} else {
				c.directIO = on
			}
		case configGranularity:
			n, ok := sdk.ParseSize(v)
			if !ok || n < blockUnit || n > maxUnit || n%blockUnit != 0 {
				return sdk.Error(abi.InvalidArgument, "config ", configGranularity, " = ", strconv.Quote(v),
					": want a multiple of 4096 bytes from 4Ki to 1Gi (e.g. 1Mi)")
			}
			c.granularity = n
		default:
			return sdk.Error(abi.InvalidArgument, "unknown config key ", strconv.Quote(k),
				" (known: ", configFsType, ", ", configPrealloc, ", ", configDirectIO, ", ", configGranularity, ")")
		}
	}
	b.cfg, b.configured = c, true
	return nil
}

// Info describes the backend; DefaultFsType and Granularity follow the
// configuration (the host calls configure before backend_info).
func (b *Backend) Info() abi.BackendInfo {
	g := b.cfg.granularity
	return abi.BackendInfo{
		Name:        "loopfile",
		Version:     "1.0.0",
		Description: "files in a pool folder attached as loop devices; reflink snapshots and clones",
		AccessModes: []int64{
			int64(abi.AccessSingleNodeWriter),
			int64(abi.AccessSingleNodeReadOnly),
			int64(abi.AccessSingleNodeSingleWriter),
			int64(abi.AccessSingleNodeMultiWriter),
		},
		Mount:            true,
		Block:            true,
		FsTypes:          append([]string(nil), fsTypes...),
		DefaultFsType:    b.cfg.fsType,
		Granularity:      g,
		MinSizeBytes:     sdk.RoundUp(minSizeBytes, g),
		DefaultSizeBytes: sdk.RoundUp(defaultSizeBytes, g),
		TopologyKeys:     []string{TopologyKey},
		Clone:            true,
		Restore:          true,
		NodeExpansion:    true,
		// prealloc is also a StorageClass parameter; as a mutable one
		// (VolumeAttributesClass) it wins over the StorageClass's.
		MutableParameters: []string{paramPrealloc},
		// The pool is this node's: a node daemon can create inline
		// ephemeral volumes by itself.
		Ephemeral:          true,
		DeclaresParameters: true,
		Parameters:         Parameters,
	}
}

// Parameters are loopfile's StorageClass parameters (README.md shows them).
var Parameters = []abi.ParameterSpec{
	{Name: paramPrealloc, Type: abi.ParamBool, DefaultNote: "the config's prealloc (false)", Mutable: true,
		Description: "allocate every block of the volume's file at creation (and on a change to true)"},
}

func isFsType(s string) bool {
	for _, f := range fsTypes {
		if f == s {
			return true
		}
	}
	return false
}

// ready fails operations that need the pool or the node ID on an instance
// the host never configured.
func (b *Backend) ready() error {
	if !b.configured {
		return sdk.Error(abi.Unavailable, "loopfile instance is not configured: the host did not call configure on it")
	}
	return nil
}

// preallocFor reads the StorageClass parameters: prealloc overrides the
// module's default; keys under csi.storage.k8s.io/ are ignored; anything
// else is INVALID_ARGUMENT.
func (b *Backend) preallocFor(params map[string]string) (bool, error) {
	prealloc := b.cfg.prealloc
	for k, v := range params {
		switch {
		case k == paramPrealloc:
			on, err := strconv.ParseBool(v)
			if err != nil {
				return false, sdk.Error(abi.InvalidArgument, "parameter ", paramPrealloc, " = ", strconv.Quote(v), ": want true or false")
			}
			prealloc = on
		case strings.HasPrefix(k, kubernetesPrefix):
		default:
			return false, sdk.Error(abi.InvalidArgument, "unknown parameter ", strconv.Quote(k), " (loopfile knows: ", paramPrealloc, ")")
		}
	}
	return prealloc, nil
}

// mutablePrealloc applies the mutable parameters (VolumeAttributesClass)
// to prealloc: the host let only prealloc through, so only its value can
// be wrong.
func mutablePrealloc(params map[string]string, prealloc bool) (bool, error) {
	v, ok := params[paramPrealloc]
	if !ok {
		return prealloc, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, sdk.Error(abi.InvalidArgument, "mutable parameter ", paramPrealloc, " = ", strconv.Quote(v), ": want true or false")
	}
	return on, nil
}

// volumePath is the file of a volume: the context's path when it names the
// volume's own file, else the file in this node's pool.
func (b *Backend) volumePath(ref *abi.VolumeRef) (string, error) {
	return b.filePath(ref.LocalID, ref.Context, volumeSuffix, "volume")
}

// snapshotPath is the file of a snapshot.
func (b *Backend) snapshotPath(ref *abi.SnapshotRef) (string, error) {
	return b.filePath(ref.LocalID, ref.Context, snapshotSuffix, "snapshot")
}

func (b *Backend) filePath(id string, ctx map[string]string, suffix, what string) (string, error) {
	if !sdk.ValidNameID(id) {
		return "", sdk.Error(abi.NotFound, what, " ", strconv.Quote(id), " is not a loopfile ", what, " ID")
	}
	name := id + suffix
	if p := ctx[ctxPath]; p != "" {
		if !strings.HasPrefix(p, "/") || baseOf(p) != name {
			return "", sdk.Error(abi.InvalidArgument, what, " context path ", strconv.Quote(p), " does not name the ", what, "'s file ", name)
		}
		return p, nil
	}
	if err := b.ready(); err != nil {
		return "", err
	}
	return joinPath(b.cfg.pool, name), nil
}

// nodeOf is the node a volume's file lives on.
func (b *Backend) nodeOf(ctx map[string]string) string {
	if n := ctx[ctxNode]; n != "" {
		return n
	}
	return b.cfg.nodeID
}

// topology is the accessible topology of everything in this node's pool.
func topology(node string) []abi.Topology {
	return []abi.Topology{{Segments: map[string]string{TopologyKey: node}}}
}
