package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/internal/netblock"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// defaultPort is the NVMe/TCP port (IANA 4420).
const defaultPort = "4420"

// Module config keys (the operator's `config:` of this module).
const (
	configAddress    = "address"          // where nodes connect, e.g. 192.0.2.5:4420; a granted root
	configListen     = "listen"           // addresses nvmet listens on, comma-separated; default: address
	configNQNPrefix  = "subsystem_prefix" // every volume's subsystem is this plus its ID; under a granted NQN prefix
	configPool       = "pool"             // folder of the volume files; a granted root; default: the first folder root
	configBufferedIO = "buffered_io"      // serve files through the page cache (true for pools on tmpfs)
	configFsType     = "fs_type"          // default filesystem of mount volumes: ext4 | xfs | btrfs
)

var configKeys = []string{configAddress, configListen, configNQNPrefix, configPool, configBufferedIO, configFsType}

// StorageClass parameters. Keys under the CO's prefix are metadata its
// sidecars add (PVC name, namespace...); they are accepted and ignored.
const (
	// paramSource names where a volume's blocks live. "file" (the only
	// source so far): a file in the pool folder. The value is a block
	// source kind, later followed by ":" and a name, such as
	// "lvm:<device class>", so StorageClasses written today stay valid.
	paramSource = "source"
	sourceFile  = "file"
)

// Volume context keys. The context travels with the volume to nodes, so
// node operations need no controller record.
const (
	ctxSubsystem = "subsystem" // the volume's subsystem NQN
	ctxAddress   = "address"   // where nodes connect
	ctxUUID      = "uuid"      // the namespace's UUID, by which the node finds its disk
	ctxPath      = "path"      // the volume's or snapshot's file on the storage host
	ctxFsType    = "fsType"    // the filesystem mount access uses (absent for block-only volumes)
)

// Publish and stage context keys: where a node finds the volume's
// namespace.
const (
	pubAddress   = "address"
	pubSubsystem = "subsystem"
	pubUUID      = "uuid"
)

// NodeContextHostNQN is the key under which node_info reports the node's
// host NQN; ControllerPublish reads it back from the node ID.
const NodeContextHostNQN = "nvme_host_nqn"

// Sizes the module offers.
const (
	minSizeBytes     = 1 * sdk.MiB
	defaultSizeBytes = 1 * sdk.GiB
	granularity      = 1 * sdk.MiB // namespaces count in 512-byte blocks, filesystems in 4 KiB: 1 MiB suits both
)

// fsTypes are the filesystems the host can make, in the order offered.
var fsTypes = []string{"ext4", "xfs", "btrfs"}

// fsMinimum is the smallest device each filesystem's mkfs accepts
// (xfsprogs 5.19 and later refuse below 300 MiB; btrfs-progs needs 109 MiB
// for one device with the default profiles).
func fsMinimum(fs string) int64 {
	switch fs {
	case "xfs":
		return 300 * sdk.MiB
	case "btrfs":
		return 109 * sdk.MiB
	}
	return minSizeBytes
}

// config is the module's checked configuration. Controller fields (prefix,
// pool, listen) are empty on a node-only daemon, which needs none of them.
type config struct {
	role       string
	address    string   // canonical "ip:port"
	listen     []string // canonical addresses nvmet listens on
	prefix     string
	pool       string
	bufferedIO bool
	fsType     string
}

// Backend is the nvmeof backend. It holds only its configuration: a
// volume's state is its file and nvmet's configuration, so nothing is lost
// when an instance goes.
type Backend struct {
	cfg        config
	configured bool
}

// New returns an unconfigured backend; the host's configure supplies the
// address, prefix and pool.
func New() *Backend { return &Backend{cfg: config{fsType: "ext4"}} }

// Configure checks the operator's configuration and keeps it. Any unknown
// key or bad value refuses the module at load (INVALID_ARGUMENT). A
// controller (role "controller" or "all") needs address and
// subsystem_prefix; a node needs nothing.
func (b *Backend) Configure(req *abi.ConfigureRequest) error {
	c := config{role: req.Role, fsType: "ext4"}
	for k, v := range req.Config {
		switch k {
		case configAddress:
			p, ok := netblock.CanonicalAddr(v, defaultPort)
			if !ok {
				return sdk.Error(abi.InvalidArgument, "config ", configAddress, " = ", strconv.Quote(v), ": want ip:port, e.g. 192.0.2.5:4420 or [fd00::5]:4420")
			}
			if !netblock.GrantedAddr(req.Roots, p, defaultPort) {
				return sdk.Error(abi.InvalidArgument, "config ", configAddress, " = ", p, " is not a granted root: grant it exactly as ip:port")
			}
			c.address = p
		case configListen:
			l, bad, ok := netblock.ListenAddrs(req.Roots, v, defaultPort)
			if !ok {
				return sdk.Error(abi.InvalidArgument, "config ", configListen, ": ", strconv.Quote(bad), " is not a granted ip:port root")
			}
			c.listen = l
		case configNQNPrefix:
			if why := checkNQNPrefix(v); why != "" {
				return sdk.Error(abi.InvalidArgument, "config ", configNQNPrefix, " = ", strconv.Quote(v), ": ", why)
			}
			if !grantedPrefix(req.Roots, v) {
				return sdk.Error(abi.InvalidArgument, "config ", configNQNPrefix, " = ", v, " does not extend a granted NQN prefix root")
			}
			c.prefix = v
		case configPool:
			pool, err := sdk.PoolRoot(v)
			if err != nil {
				return err
			}
			if !hasRoot(req.Roots, pool) {
				return sdk.Error(abi.InvalidArgument, "config ", configPool, " = ", pool, " is not a granted root: volume files live directly in a granted folder")
			}
			c.pool = pool
		case configBufferedIO:
			on, err := strconv.ParseBool(v)
			if err != nil {
				return sdk.Error(abi.InvalidArgument, "config ", configBufferedIO, " = ", strconv.Quote(v), ": want true or false")
			}
			c.bufferedIO = on
		case configFsType:
			if !isFsType(v) {
				return sdk.Error(abi.InvalidArgument, "config ", configFsType, " = ", strconv.Quote(v), ": want one of ", strings.Join(fsTypes, ", "))
			}
			c.fsType = v
		default:
			return sdk.Error(abi.InvalidArgument, "unknown config key ", strconv.Quote(k), " (known: ", strings.Join(configKeys, ", "), ")")
		}
	}
	if c.pool == "" {
		for _, r := range req.Roots {
			if strings.HasPrefix(r, "/") {
				pool, err := sdk.PoolRoot(r)
				if err != nil {
					return err
				}
				c.pool = pool
				break
			}
		}
	}
	if len(c.listen) == 0 && c.address != "" {
		c.listen = []string{c.address}
	}
	if req.Role != "node" {
		switch {
		case c.address == "":
			return sdk.Error(abi.InvalidArgument, "config ", configAddress, " is required: the address nodes connect to (a granted root, e.g. 192.0.2.5:4420)")
		case c.prefix == "":
			return sdk.Error(abi.InvalidArgument, "config ", configNQNPrefix, " is required: every volume's subsystem NQN starts with it")
		case c.pool == "":
			return sdk.Error(abi.InvalidArgument, "nvmeof needs a granted folder root for its volume files (config ", configPool, ")")
		}
	}
	b.cfg, b.configured = c, true
	return nil
}

// Info describes the backend; DefaultFsType follows the configuration (the
// host calls configure before backend_info).
func (b *Backend) Info() abi.BackendInfo {
	return abi.BackendInfo{
		Name:        "nvmeof",
		Version:     "1.0.0",
		Description: "namespaces of the kernel NVMe target over TCP, one subsystem per volume, backed by files in a pool folder; fencing by allowed host NQNs; reflink snapshots and clones",
		AccessModes: []int64{
			int64(abi.AccessSingleNodeWriter),
			int64(abi.AccessSingleNodeReadOnly),
			int64(abi.AccessSingleNodeSingleWriter),
			int64(abi.AccessSingleNodeMultiWriter),
		},
		Mount:              true,
		Block:              true,
		FsTypes:            append([]string(nil), fsTypes...),
		DefaultFsType:      b.cfg.fsType,
		Granularity:        granularity,
		MinSizeBytes:       minSizeBytes,
		DefaultSizeBytes:   defaultSizeBytes,
		Clone:              true,
		Restore:            true,
		NodeExpansion:      true,
		DeclaresParameters: true,
		Parameters:         Parameters,
	}
}

// Parameters are nvmeof's StorageClass parameters (README.md shows them).
var Parameters = []abi.ParameterSpec{
	{Name: paramSource, Type: abi.ParamString, Default: sourceFile, Allowed: []string{sourceFile},
		Description: "where the volume's blocks live: file (a file in the pool folder)"},
}

// ready fails operations on an instance the host never configured.
func (b *Backend) ready() error {
	if !b.configured {
		return sdk.Error(abi.Unavailable, "nvmeof instance is not configured: the host did not call configure on it")
	}
	return nil
}

// controller fails controller operations on a node-only daemon.
func (b *Backend) controller() error {
	if err := b.ready(); err != nil {
		return err
	}
	if b.cfg.prefix == "" || b.cfg.pool == "" {
		return sdk.Error(abi.FailedPrecondition, "this nvmeof module is configured as a node: it serves no subsystem")
	}
	return nil
}

func isFsType(s string) bool {
	for _, f := range fsTypes {
		if f == s {
			return true
		}
	}
	return false
}

// volumeParameters reads a StorageClass's parameters: source, and the
// CO's metadata keys, which are ignored. Anything else is
// INVALID_ARGUMENT.
func volumeParameters(params map[string]string) error {
	for k, v := range params {
		switch {
		case k == paramSource:
			if v != sourceFile {
				return sdk.Error(abi.InvalidArgument, "parameter ", paramSource, " = ", strconv.Quote(v), ": this module serves ", sourceFile, " volumes only")
			}
		case strings.HasPrefix(k, abi.COParameterPrefix):
		default:
			return sdk.Error(abi.InvalidArgument, "unknown parameter ", strconv.Quote(k), " (nvmeof knows: ", paramSource, ")")
		}
	}
	return nil
}

// checkSnapshotParameters accepts only the CO's own metadata keys:
// snapshot classes take no parameters of their own.
func checkSnapshotParameters(params map[string]string) error {
	for k := range params {
		if !strings.HasPrefix(k, abi.COParameterPrefix) {
			return sdk.Error(abi.InvalidArgument, "unknown parameter ", strconv.Quote(k), " (nvmeof snapshots take none)")
		}
	}
	return nil
}
