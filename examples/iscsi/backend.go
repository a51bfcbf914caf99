package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Module config keys (the operator's `config:` of this module).
const (
	configPortal     = "portal"      // the portal nodes log in to, e.g. 192.0.2.5:3260; a granted root
	configListen     = "listen"      // portals LIO listens on, comma-separated; default: portal
	configTargetIQN  = "target_iqn"  // the shared target, under a granted IQN prefix
	configPool       = "pool"        // folder of the volume files; a granted root; default: the first folder root
	configChapUser   = "chap_user"   // one-way CHAP user (optional, with chap_secret)
	configChapSecret = "chap_secret" // one-way CHAP secret: 12-255 printable ASCII characters without spaces
	configFsType     = "fs_type"     // default filesystem of mount volumes: ext4 | xfs | btrfs
)

var configKeys = []string{configPortal, configListen, configTargetIQN, configPool, configChapUser, configChapSecret, configFsType}

// StorageClass parameters. Keys under kubernetesPrefix are metadata the
// CO's sidecars add (PVC name, namespace...); they are accepted and ignored.
const (
	// paramWriteCache ("true"/"false") makes the volume's LUN report a
	// write-back cache; also a mutable parameter.
	paramWriteCache  = "writeCache"
	kubernetesPrefix = "csi.storage.k8s.io/"
)

// Volume context keys. The context travels with the volume to nodes, so
// node operations need no controller record.
const (
	ctxTarget = "target" // the target's IQN
	ctxPortal = "portal" // the portal nodes log in to
	ctxLUN    = "lun"    // the volume's LUN number
	ctxPath   = "path"   // the volume's or snapshot's file on the target host
	ctxFsType = "fsType" // the filesystem mount access uses (absent for block-only volumes)
	// ctxWriteCache is "true" when the volume's LUN reports a write-back
	// cache; ModifyVolume changes it.
	ctxWriteCache = "writeCache"
)

// Publish and stage context keys: where a node finds the volume's LUN.
const (
	pubPortal = "portal"
	pubTarget = "target"
	pubLUN    = "lun"
)

// NodeContextInitiator is the key under which node_info reports the node's
// initiator name; ControllerPublish reads it back from the node ID.
const NodeContextInitiator = "iscsi_initiator"

// Sizes the module offers.
const (
	minSizeBytes     = 1 * sdk.MiB
	defaultSizeBytes = 1 * sdk.GiB
	granularity      = 1 * sdk.MiB // LIO counts in 512-byte blocks, filesystems in 4 KiB: 1 MiB suits both
)

// maxLUN is the highest LUN of the shared target: one volume per LUN, so a
// target holds at most maxLUN+1 volumes.
const maxLUN = 255

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

// chap is one-way CHAP credentials.
type chap struct {
	user, secret string
}

// config is the module's checked configuration. Controller fields (target,
// pool, listen) are empty on a node-only daemon, which needs none of them.
type config struct {
	role   string
	portal string   // canonical "ip:port"
	listen []string // canonical portals LIO listens on
	target string
	pool   string
	chap   *chap
	fsType string
}

// Backend is the iscsi backend. It holds only its configuration: a
// volume's state is its file (whose name carries its LUN) and LIO's
// configuration, so nothing is lost when an instance goes.
type Backend struct {
	cfg        config
	configured bool
}

// New returns an unconfigured backend; the host's configure supplies the
// portal, target and pool.
func New() *Backend { return &Backend{cfg: config{fsType: "ext4"}} }

// Configure checks the operator's configuration and keeps it. Any unknown
// key or bad value refuses the module at load (INVALID_ARGUMENT), so a typo
// never silently falls back to a default. A controller (role "controller"
// or "all") needs portal and target_iqn; a node needs nothing but reads
// the CHAP credentials it logs in with.
func (b *Backend) Configure(req *abi.ConfigureRequest) error {
	c := config{role: req.Role, fsType: "ext4"}
	for k, v := range req.Config {
		switch k {
		case configPortal:
			p, ok := canonicalPortal(v)
			if !ok {
				return sdk.Error(abi.InvalidArgument, "config ", configPortal, " = ", strconv.Quote(v), ": want ip:port, e.g. 192.0.2.5:3260 or [fd00::5]:3260")
			}
			if !grantedPortal(req.Roots, p) {
				return sdk.Error(abi.InvalidArgument, "config ", configPortal, " = ", p, " is not a granted root: grant it exactly as ip:port")
			}
			c.portal = p
		case configListen:
			for _, s := range strings.Split(v, ",") {
				p, ok := canonicalPortal(strings.TrimSpace(s))
				if !ok {
					return sdk.Error(abi.InvalidArgument, "config ", configListen, " = ", strconv.Quote(v), ": want comma-separated ip:port portals, e.g. 0.0.0.0:3260")
				}
				if !grantedPortal(req.Roots, p) {
					return sdk.Error(abi.InvalidArgument, "config ", configListen, ": portal ", p, " is not a granted root")
				}
				c.listen = append(c.listen, p)
			}
		case configTargetIQN:
			if why := checkIQN(v); why != "" {
				return sdk.Error(abi.InvalidArgument, "config ", configTargetIQN, " = ", strconv.Quote(v), ": ", why)
			}
			if !grantedTarget(req.Roots, v) {
				return sdk.Error(abi.InvalidArgument, "config ", configTargetIQN, " = ", v, " does not extend a granted IQN prefix root")
			}
			c.target = v
		case configPool:
			pool, err := sdk.PoolRoot(v)
			if err != nil {
				return err
			}
			if !hasRoot(req.Roots, pool) {
				return sdk.Error(abi.InvalidArgument, "config ", configPool, " = ", pool, " is not a granted root: volume files live directly in a granted folder")
			}
			c.pool = pool
		case configChapUser, configChapSecret:
			// Checked together below.
		case configFsType:
			if !isFsType(v) {
				return sdk.Error(abi.InvalidArgument, "config ", configFsType, " = ", strconv.Quote(v), ": want one of ", strings.Join(fsTypes, ", "))
			}
			c.fsType = v
		default:
			return sdk.Error(abi.InvalidArgument, "unknown config key ", strconv.Quote(k), " (known: ", strings.Join(configKeys, ", "), ")")
		}
	}
	user, secret := req.Config[configChapUser], req.Config[configChapSecret]
	switch {
	case user == "" && secret == "":
	case user == "" || secret == "":
		return sdk.Error(abi.InvalidArgument, "config ", configChapUser, " and ", configChapSecret, " go together")
	case len(user) > 255 || !printableNoSpace(user):
		return sdk.Error(abi.InvalidArgument, "config ", configChapUser, ": want 1-255 printable ASCII characters without spaces")
	case len(secret) < 12 || len(secret) > 255 || !printableNoSpace(secret):
		// Never quote the secret.
		return sdk.Error(abi.InvalidArgument, "config ", configChapSecret, ": want 12-255 printable ASCII characters without spaces")
	default:
		c.chap = &chap{user: user, secret: secret}
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
	if len(c.listen) == 0 && c.portal != "" {
		c.listen = []string{c.portal}
	}
	if req.Role != "node" {
		switch {
		case c.portal == "":
			return sdk.Error(abi.InvalidArgument, "config ", configPortal, " is required: the portal nodes log in to (a granted root, e.g. 192.0.2.5:3260)")
		case c.target == "":
			return sdk.Error(abi.InvalidArgument, "config ", configTargetIQN, " is required: the target every volume is a LUN of")
		case c.pool == "":
			return sdk.Error(abi.InvalidArgument, "iscsi needs a granted folder root for its volume files (config ", configPool, ")")
		}
	}
	b.cfg, b.configured = c, true
	return nil
}

// Info describes the backend; DefaultFsType follows the configuration (the
// host calls configure before backend_info).
func (b *Backend) Info() abi.BackendInfo {
	return abi.BackendInfo{
		Name:        "iscsi",
		Version:     "1.0.0",
		Description: "LUNs of a shared LIO target backed by files in a pool folder, reached by nodes over iSCSI; reflink snapshots and clones",
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
		Granularity:      granularity,
		MinSizeBytes:     minSizeBytes,
		DefaultSizeBytes: defaultSizeBytes,
		Clone:            true,
		Restore:          true,
		NodeExpansion:    true,
		// writeCache is also a StorageClass parameter; as a mutable one
		// (VolumeAttributesClass) it wins over the StorageClass's.
		MutableParameters:  []string{paramWriteCache},
		DeclaresParameters: true,
		Parameters:         Parameters,
	}
}

// Parameters are iscsi's StorageClass parameters (README.md shows them).
var Parameters = []abi.ParameterSpec{
	{Name: paramWriteCache, Type: abi.ParamBool, Default: "false", Mutable: true,
		Description: "the LUN reports a write-back cache"},
}

// ready fails operations on an instance the host never configured.
func (b *Backend) ready() error {
	if !b.configured {
		return sdk.Error(abi.Unavailable, "iscsi instance is not configured: the host did not call configure on it")
	}
	return nil
}

// controller fails controller operations on a node-only daemon.
func (b *Backend) controller() error {
	if err := b.ready(); err != nil {
		return err
	}
	if b.cfg.target == "" || b.cfg.pool == "" {
		return sdk.Error(abi.FailedPrecondition, "this iscsi module is configured as a node: it serves no target")
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

// checkParameters accepts only the CO's own metadata keys: snapshot
// classes take no parameters of their own.
func checkParameters(params map[string]string) error {
	for k := range params {
		if !strings.HasPrefix(k, kubernetesPrefix) {
			return sdk.Error(abi.InvalidArgument, "unknown parameter ", strconv.Quote(k), " (iscsi snapshots take none)")
		}
	}
	return nil
}

// volumeParameters reads a StorageClass's parameters and then the mutable
// ones (a VolumeAttributesClass, which win): writeCache, and the CO's
// metadata keys, which are ignored. Anything else is INVALID_ARGUMENT.
func volumeParameters(params, mutable map[string]string) (writeCache bool, err error) {
	for k, v := range params {
		switch {
		case k == paramWriteCache:
			if writeCache, err = parseBool(k, v); err != nil {
				return false, err
			}
		case strings.HasPrefix(k, kubernetesPrefix):
		default:
			return false, sdk.Error(abi.InvalidArgument, "unknown parameter ", strconv.Quote(k), " (iscsi knows: ", paramWriteCache, ")")
		}
	}
	return mutableWriteCache(mutable, writeCache)
}

// mutableWriteCache applies mutable parameters to writeCache: the host let
// only writeCache through, so only its value can be wrong.
func mutableWriteCache(mutable map[string]string, writeCache bool) (bool, error) {
	v, ok := mutable[paramWriteCache]
	if !ok {
		return writeCache, nil
	}
	return parseBool(paramWriteCache, v)
}

func parseBool(key, v string) (bool, error) {
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, sdk.Error(abi.InvalidArgument, "parameter ", key, " = ", strconv.Quote(v), ": want true or false")
	}
	return on, nil
}
