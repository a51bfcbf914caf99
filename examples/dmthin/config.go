package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// Module config keys (the operator's `config:` of this module; see README).
const (
	configPool      = "pool"            // dm name of the thin pool, under a granted prefix
	configData      = "data_device"     // block device, or a file attached as a loop device
	configMeta      = "metadata_device" // block device, or a file attached as a loop device
	configBlockSize = "block_size"      // data block size: bytes or with Ki/Mi/Gi; 64Ki to 1Gi
	configFsType    = "fs_type"         // default filesystem of mount volumes
	configDataSize  = "data_size"       // create the data file of this size when missing (development)
	configMetaSize  = "metadata_size"   // create the metadata file of this size when missing
)

// TopologyKey is the segment that pins a volume to the node holding its pool.
const TopologyKey = "topology.wasmcsi.dev/node"

// Size units.
const (
	kib = sdk.KiB
	mib = sdk.MiB
	gib = sdk.GiB
)

const (
	sectorSize = 512
	// Data block sizes a thin pool accepts: multiples of 64 KiB from
	// 64 KiB to 1 GiB.
	minBlockBytes     = 64 * kib
	maxBlockBytes     = 1 * gib
	defaultBlockBytes = minBlockBytes
	defaultSizeBytes  = 1 * gib
	// minVolumeBytes keeps block volumes usable; mount volumes are also
	// raised to their filesystem's minimum (fsMinimum).
	minVolumeBytes = 1 * mib
)

// fsTypes are the filesystems the host can make, in the order offered.
var fsTypes = []string{"ext4", "xfs", "btrfs"}

// fsMinimum is the smallest device each filesystem's mkfs accepts (the
// host refuses to format a smaller one). A thin volume's virtual size costs
// nothing until written, so CreateVolume raises mount volumes to it.
func fsMinimum(fs string) int64 {
	switch fs {
	case "xfs":
		return 300 * mib
	case "btrfs":
		return 109 * mib
	}
	return minVolumeBytes
}

// config is the module's checked configuration.
type config struct {
	state     string // the first granted root: the record folder
	pool      string
	data      string // as configured; a bare file name is in the state folder
	meta      string
	dataSize  int64 // > 0: create the data file when missing
	metaSize  int64
	blockSize int64 // 0: the pool's own (or the default for a new pool)
	fsType    string
	node      string
	prefixes  []string // granted dm name prefixes
}

// Backend is the dmthin backend. It keeps only its configuration and the
// pool's block size: every volume's state lives in the pool's metadata and
// in the record files of the state folder, so nothing is lost when an
// instance goes.
type Backend struct {
	cfg        config
	blockBytes int64 // the open pool's data block size
	configured bool
}

// New returns an unconfigured backend; configure supplies the pool.
func New() *Backend {
	return &Backend{cfg: config{fsType: "ext4"}, blockBytes: defaultBlockBytes}
}

// Configure checks the operator's configuration and opens the pool:
// devices that are files are attached as loop devices first, and the pool is
// created when its metadata device is blank and reopened as it is
// otherwise, so a restart or a reload keeps every volume. Any unknown key
// or bad value refuses the module (INVALID_ARGUMENT), so a typo never falls
// back to a default.
func (b *Backend) Configure(req *abi.ConfigureRequest) error {
	c, err := parseConfig(req)
	if err != nil {
		return err
	}
	data, err := attachDevice(c.data, configData, c.dataSize)
	if err != nil {
		return err
	}
	meta, err := attachDevice(c.meta, configMeta, c.metaSize)
	if err != nil {
		releaseDevice(c.data, data)
		return err
	}
	resp, err := openPool(c, data, meta)
	if err != nil {
		// A refused module leaves no loop devices behind; a pool that is
		// open holds its devices, and loop_detach refuses those.
		releaseDevice(c.data, data)
		releaseDevice(c.meta, meta)
		return wrap(err, "open thin pool ", c.pool, " (data ", data, ", metadata ", meta, ")")
	}
	if resp.BlockSectors == 0 {
		return errorf(abi.Internal, "open thin pool ", c.pool, ": the host reports no block size")
	}
	b.cfg, b.blockBytes, b.configured = c, int64(resp.BlockSectors)*sectorSize, true
	// Configure runs again on every new instance; a new pool is news.
	st, level, how := resp.Status, abi.LogDebug, "opened"
	if resp.Formatted {
		level, how = abi.LogInfo, "created"
	}
	hostcall.Logf(level, "dmthin: pool ", c.pool, " ", how, " on data ", data, " and metadata ", meta,
		": block ", strconv.FormatInt(b.blockBytes, 10), " bytes, data blocks ", u64(st.UsedDataBlocks), "/", u64(st.TotalDataBlocks),
		", metadata blocks ", u64(st.UsedMetaBlocks), "/", u64(st.TotalMetaBlocks))
	return nil
}

// parseConfig reads ConfigureRequest into a config without touching the
// system.
func parseConfig(req *abi.ConfigureRequest) (config, error) {
	c := config{fsType: "ext4", node: req.NodeID}
	if len(req.Roots) == 0 || !strings.HasPrefix(req.Roots[0], "/") || strings.HasPrefix(req.Roots[0], "/dev/") {
		return c, errorf(abi.InvalidArgument, "dmthin needs its state folder as the first granted root (an absolute folder outside /dev)")
	}
	state, err := cleanRoot(req.Roots[0])
	if err != nil {
		return c, err
	}
	c.state = state
	for _, r := range req.Roots {
		if !strings.Contains(r, "/") {
			c.prefixes = append(c.prefixes, r)
		}
	}
	if req.NodeID == "" {
		return c, errorf(abi.InvalidArgument, "dmthin needs the node ID: volumes are pinned to the node that holds their pool")
	}
	for k, v := range req.Config {
		switch k {
		case configPool:
			c.pool = v
		case configData:
			c.data = v
		case configMeta:
			c.meta = v
		case configBlockSize:
			n, ok := sdk.ParseSize(v)
			if !ok || n < minBlockBytes || n > maxBlockBytes || n%minBlockBytes != 0 {
				return c, errorf(abi.InvalidArgument, "config ", configBlockSize, " = ", strconv.Quote(v),
					": want a multiple of 64Ki from 64Ki to 1Gi (e.g. 64Ki, 1Mi)")
			}
			c.blockSize = n
		case configDataSize, configMetaSize:
			n, ok := sdk.ParseSize(v)
			if !ok || n < 2*sdk.MiB {
				return c, errorf(abi.InvalidArgument, "config ", k, " = ", strconv.Quote(v), ": want a size of at least 2Mi (e.g. 1Gi)")
			}
			if k == configDataSize {
				c.dataSize = n
			} else {
				c.metaSize = n
			}
		case configFsType:
			if !isFsType(v) {
				return c, errorf(abi.InvalidArgument, "config ", configFsType, " = ", strconv.Quote(v), ": want one of ", strings.Join(fsTypes, ", "))
			}
			c.fsType = v
		default:
			return c, errorf(abi.InvalidArgument, "unknown config key ", strconv.Quote(k), " (known: ",
				configPool, ", ", configData, ", ", configMeta, ", ", configDataSize, ", ", configMetaSize, ", ", configBlockSize, ", ", configFsType, ")")
		}
	}
	if err := checkPoolName(c.pool, c.prefixes); err != nil {
		return c, err
	}
	// A bare file name is a file in the state folder (development pools).
	for _, p := range []*string{&c.data, &c.meta} {
		if *p != "" && !strings.Contains(*p, "/") {
			*p = c.state + "/" + *p
		}
	}
	for _, d := range []struct{ key, path string }{{configData, c.data}, {configMeta, c.meta}} {
		if d.path == "" || !strings.HasPrefix(d.path, "/") || cleanPath(d.path) != d.path {
			return c, errorf(abi.InvalidArgument, "config ", d.key, " = ", strconv.Quote(d.path), ": want a clean absolute path of a block device or of a file in a granted folder")
		}
	}
	if c.data == c.meta {
		return c, errorf(abi.InvalidArgument, "config ", configData, " and ", configMeta, " are both ", c.data, ": a pool needs two devices")
	}
	return c, nil
}

// checkPoolName accepts a device-mapper name under a granted prefix that
// leaves room for "-<thin id>" and makes a good file name prefix.
func checkPoolName(pool string, prefixes []string) error {
	if pool == "" {
		return errorf(abi.InvalidArgument, "config ", configPool, " is required: the device-mapper name of the thin pool")
	}
	if len(pool) > 110 || pool[0] == '.' || pool[0] == '-' {
		return errorf(abi.InvalidArgument, "config ", configPool, " = ", strconv.Quote(pool), ": want 1 to 110 bytes, not starting with . or -")
	}
	for i := 0; i < len(pool); i++ {
		c := pool[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("#+-.:=@_", c) >= 0) {
			return errorf(abi.InvalidArgument, "config ", configPool, " = ", strconv.Quote(pool), ": byte ", strconv.QuoteRune(rune(c)), " is outside [A-Za-z0-9#+-.:=@_]")
		}
	}
	for _, p := range prefixes {
		if strings.HasPrefix(pool, p) {
			return nil
		}
	}
	return errorf(abi.PermissionDenied, "config ", configPool, " = ", strconv.Quote(pool), " is under no granted device-mapper prefix (granted: ",
		strings.Join(prefixes, ", "), "); grant a root without a leading slash, e.g. wasmcsi-")
}

// attachDevice returns the block device for a configured path: a path
// under /dev/ is used as it is; anything else is a file in a granted
// folder, attached as a loop device (or found attached already).
func attachDevice(path, key string, size int64) (string, error) {
	if strings.HasPrefix(path, "/dev/") {
		return path, nil
	}
	if size > 0 {
		// Sparse; a file already there of that size is fine.
		err := hostcall.FileCreate(&abi.FileCreateRequest{Path: path, SizeBytes: size})
		if err != nil && abi.CodeOf(err) != abi.AlreadyExists {
			return "", wrap(err, "config ", key, ": create ", path)
		}
	}
	d, err := hostcall.LoopAttach(&abi.LoopAttachRequest{File: path, DirectIO: true})
	if err != nil {
		return "", wrap(err, "config ", key, ": attach ", path, " as a loop device")
	}
	return d.Path, nil
}

// releaseDevice detaches the loop device attachDevice made for a file.
func releaseDevice(path, dev string) {
	if !strings.HasPrefix(path, "/dev/") && dev != path {
		_ = hostcall.LoopDetach(dev)
	}
}

// openPool opens the pool, creating it when its metadata is blank. With no
// configured block size an existing pool keeps its own and a new one gets
// the default.
func openPool(c config, data, meta string) (*abi.DmPoolOpenResponse, error) {
	req := &abi.DmPoolOpenRequest{Pool: c.pool, DataDev: data, MetaDev: meta, BlockSectors: uint64(c.blockSize / sectorSize), Format: true}
	if c.blockSize == 0 {
		req.Format = false
		resp, err := hostcall.DmPoolOpen(req)
		if abi.CodeOf(err) != abi.FailedPrecondition {
			return resp, err
		}
		// No pool on the metadata device yet (or a device in use, which
		// the formatting open reports again).
		req.BlockSectors, req.Format = uint64(defaultBlockBytes/sectorSize), true
	}
	return hostcall.DmPoolOpen(req)
}

// Info describes the backend. Granularity is the pool's block size, known
// once configure has opened the pool.
func (b *Backend) Info() abi.BackendInfo {
	g := b.blockBytes
	return abi.BackendInfo{
		Name:        "dmthin",
		Version:     "1.0.0",
		Description: "thin volumes in a node-local device-mapper thin pool; instant snapshots and clones that share blocks",
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
		MinSizeBytes:     sdk.RoundUp(minVolumeBytes, g),
		DefaultSizeBytes: sdk.RoundUp(defaultSizeBytes, g),
		TopologyKeys:     []string{TopologyKey},
		Clone:            true,
		Restore:          true,
		NodeExpansion:    true,
		// dmthin takes no StorageClass parameters: the host refuses any.
		DeclaresParameters: true,
		Parameters:         Parameters,
	}
}

// Parameters are dmthin's StorageClass parameters: none (README.md).
var Parameters []abi.ParameterSpec

// ready fails operations on an instance the host never configured: it
// would not know its pool.
func (b *Backend) ready() error {
	if !b.configured {
		return errorf(abi.Unavailable, "dmthin instance is not configured: the host did not call configure on it")
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

// cleanRoot checks the state folder: a clean absolute folder path other
// than "/", without trailing slashes.
func cleanRoot(root string) (string, error) {
	root, err := sdk.PoolRoot(root)
	if err == nil && cleanPath(root) != root {
		err = errorf(abi.InvalidArgument, "state folder ", strconv.Quote(root), " is not a clean path")
	}
	return root, err
}

// cleanPath reports the path with empty, "." and ".." elements resolved
// lexically, so a configured path can be compared with its clean form.
func cleanPath(p string) string {
	var out []string
	for _, e := range strings.Split(p, "/") {
		switch e {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, e)
		}
	}
	return "/" + strings.Join(out, "/")
}

// errorf builds an error with a code from parts, without fmt.
func errorf(code abi.Code, parts ...string) error { return sdk.Error(code, parts...) }

// wrap adds what the module was doing to a host call's error and keeps its
// code.
func wrap(err error, what ...string) error { return sdk.Wrap(err, strings.Join(what, "")) }

// message is an error's text without its code prefix.
func message(err error) string {
	if e, ok := err.(*abi.Error); ok {
		return e.Message
	}
	return err.Error()
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }
func i64(v int64) string  { return strconv.FormatInt(v, 10) }
