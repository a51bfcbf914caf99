package main

import (
	"sort"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// Module config keys (the operator's `config:` of this module; see README).
const (
	// configClassPrefix starts a device class: class.<name> = VG, or
	// VG/POOL for thin volumes in thin pool POOL, then optional
	// ",stripes=N", ",stripe_size=SIZE", ",mirrors=N" (thick only).
	configClassPrefix = "class."
	configDefault     = "default_class" // the class of a StorageClass that names none
	configFsType      = "fs_type"       // default filesystem of mount volumes
)

// StorageClass parameters.
const paramDeviceClass = "deviceClass"

// Parameters are the module's StorageClass parameters (README.md).
var Parameters = []abi.ParameterSpec{
	{Name: paramDeviceClass, Default: "the config's default_class",
		Description: "the device class (a volume group, thick or thin in a named thin pool) of the module's config that holds the volume"},
}

// TopologyKey is the segment that pins a volume to the node of its VG.
const TopologyKey = "topology.wasmcsi.dev/node"

// rootPrefix starts the lvm family's roots: lvm:VG, lvm:VG:POOL.
const rootPrefix = "lvm:"

const (
	kib = sdk.KiB
	mib = sdk.MiB
	gib = sdk.GiB

	defaultSizeBytes = 1 * gib
	minVolumeBytes   = 1 * mib
	// granularity is what the host rounds sizes to; the module rounds
	// further, to the VG's extent size, and answers the size LVM made.
	granularity = 1 * mib
	// nearlyFullPercent is the share of a thin pool's data or metadata
	// from which its volumes report themselves degraded.
	nearlyFullPercent = 90
)

// fsTypes are the filesystems the host can make, in the order offered.
var fsTypes = []string{"ext4", "xfs", "btrfs"}

// fsMinimum is the smallest device each filesystem's mkfs accepts.
func fsMinimum(fs string) int64 {
	switch fs {
	case "xfs":
		return 300 * mib
	case "btrfs":
		return 109 * mib
	}
	return minVolumeBytes
}

// class is one device class.
type class struct {
	name        string
	vg          string
	pool        string // "" for thick
	stripes     int32
	stripeBytes int64
	mirrors     int32
}

func (c *class) thin() bool { return c.pool != "" }

// where names the class's storage for messages.
func (c *class) where() string {
	if c.thin() {
		return "thin pool " + c.vg + "/" + c.pool
	}
	return "volume group " + c.vg
}

// config is the module's checked configuration.
type config struct {
	classes      map[string]*class
	names        []string // sorted
	defaultClass string
	fsType       string
	node         string
}

// Backend is the lvm backend. It keeps only its configuration: every
// volume's state is its LV, which LVM keeps.
type Backend struct {
	cfg        config
	configured bool
}

// New returns an unconfigured backend.
func New() *Backend { return &Backend{cfg: config{fsType: "ext4"}} }

// Configure checks the operator's configuration and that every device
// class's VG (and thin pool) is granted and there. Any unknown key, bad
// value, class outside the grants or missing VG refuses the module, so a
// typo never falls back to a default.
func (b *Backend) Configure(req *abi.ConfigureRequest) error {
	c, err := parseConfig(req)
	if err != nil {
		return err
	}
	for _, n := range c.names {
		cl := c.classes[n]
		if cl.thin() {
			if _, err := hostcall.LvmPoolStatus(&abi.LvmPoolRequest{VG: cl.vg, Pool: cl.pool}); err != nil {
				return wrap(err, "device class ", n, ": ", cl.where())
			}
		} else if _, err := hostcall.LvmVgStatus(&abi.LvmVgRequest{VG: cl.vg}); err != nil {
			return wrap(err, "device class ", n, ": ", cl.where())
		}
	}
	b.cfg, b.configured = c, true
	return nil
}

// parseConfig reads ConfigureRequest into a config without touching the
// system.
func parseConfig(req *abi.ConfigureRequest) (config, error) {
	c := config{fsType: "ext4", node: req.NodeID, classes: map[string]*class{}}
	if req.NodeID == "" {
		return c, errorf(abi.InvalidArgument, "lvm needs the node ID: volumes are pinned to the node of their volume group")
	}
	for k, v := range req.Config {
		switch {
		case strings.HasPrefix(k, configClassPrefix):
			cl, err := parseClass(strings.TrimPrefix(k, configClassPrefix), v)
			if err != nil {
				return c, err
			}
			c.classes[cl.name] = cl
		case k == configDefault:
			c.defaultClass = v
		case k == configFsType:
			if !isFsType(v) {
				return c, errorf(abi.InvalidArgument, "config ", configFsType, " = ", strconv.Quote(v), ": want one of ", strings.Join(fsTypes, ", "))
			}
			c.fsType = v
		default:
			return c, errorf(abi.InvalidArgument, "unknown config key ", strconv.Quote(k), " (known: ", configClassPrefix, "<name>, ", configDefault, ", ", configFsType, ")")
		}
	}
	if len(c.classes) == 0 {
		return c, errorf(abi.InvalidArgument, "no device class: add config ", configClassPrefix, "<name>: VG (thick) or VG/POOL (thin)")
	}
	for n := range c.classes {
		c.names = append(c.names, n)
	}
	sort.Strings(c.names)
	if c.defaultClass == "" && len(c.names) == 1 {
		c.defaultClass = c.names[0]
	}
	if c.defaultClass != "" && c.classes[c.defaultClass] == nil {
		return c, errorf(abi.InvalidArgument, "config ", configDefault, " = ", strconv.Quote(c.defaultClass), " is no device class (classes: ", strings.Join(c.names, ", "), ")")
	}
	for _, n := range c.names {
		cl := c.classes[n]
		root := rootPrefix + cl.vg
		if cl.thin() {
			root += ":" + cl.pool
		}
		if !hasRoot(req.Roots, root) {
			return c, errorf(abi.InvalidArgument, "device class ", n, ": ", cl.where(), " is not granted (add the root ", root, ")")
		}
	}
	return c, nil
}

func hasRoot(roots []string, root string) bool {
	for _, r := range roots {
		if r == root {
			return true
		}
	}
	return false
}

// parseClass reads "VG[/POOL][,key=value...]".
func parseClass(name, v string) (*class, error) {
	bad := func(why ...string) error {
		return errorf(abi.InvalidArgument, "config ", configClassPrefix+name, " = ", strconv.Quote(v), ": ", strings.Join(why, ""))
	}
	if !validName(name) {
		return nil, bad("a class name is 1 to 63 bytes of A-Z a-z 0-9 _ . -")
	}
	parts := strings.Split(v, ",")
	cl := &class{name: name}
	cl.vg, cl.pool, _ = strings.Cut(strings.TrimSpace(parts[0]), "/")
	if !validName(cl.vg) || cl.pool != "" && !validName(cl.pool) || strings.Contains(cl.pool, "/") {
		return nil, bad("want VG (thick) or VG/POOL (thin), LVM names")
	}
	for _, p := range parts[1:] {
		k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
		switch k {
		case "stripes", "mirrors":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || k == "stripes" && n > 128 || k == "mirrors" && n > 9 {
				return nil, bad(k, " wants a number (stripes 1-128, mirrors 0-9)")
			}
			if k == "stripes" {
				cl.stripes = int32(n)
			} else {
				cl.mirrors = int32(n)
			}
		case "stripe_size":
			n, ok := sdk.ParseSize(val)
			if !ok || n < 4*kib || n&(n-1) != 0 {
				return nil, bad("stripe_size wants a power of two from 4Ki")
			}
			cl.stripeBytes = n
		default:
			return nil, bad("unknown option ", strconv.Quote(k), " (known: stripes, stripe_size, mirrors)")
		}
	}
	if cl.thin() && (cl.stripes > 1 || cl.mirrors > 0 || cl.stripeBytes > 0) {
		return nil, bad("stripes and mirrors are the thin pool's own: give them to thick classes only")
	}
	return cl, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' || c == '+') {
			return false
		}
	}
	return true
}

// Info describes the backend.
func (b *Backend) Info() abi.BackendInfo {
	return abi.BackendInfo{
		Name:        "lvm",
		Version:     "1.0.0",
		Description: "logical volumes on the node's LVM volume groups, thick or thin by device class; thin snapshots, restores and clones",
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
		MinSizeBytes:       minVolumeBytes,
		DefaultSizeBytes:   defaultSizeBytes,
		TopologyKeys:       []string{TopologyKey},
		Clone:              true,
		Restore:            true,
		NodeExpansion:      true,
		DeclaresParameters: true,
		Parameters:         Parameters,
	}
}

// ready fails operations on an instance the host never configured.
func (b *Backend) ready() error {
	if !b.configured {
		return errorf(abi.Unavailable, "lvm instance is not configured: the host did not call configure on it")
	}
	return nil
}

// classFor picks the device class a StorageClass's parameters name.
func (b *Backend) classFor(params map[string]string) (*class, error) {
	if err := abi.CheckParameters(Parameters, params); err != nil {
		return nil, err
	}
	name, ok := params[paramDeviceClass]
	if !ok || name == "" {
		name = b.cfg.defaultClass
	}
	if name == "" {
		return nil, errorf(abi.InvalidArgument, "parameter ", paramDeviceClass, " is required: this module has no default_class (classes: ", strings.Join(b.cfg.names, ", "), ")")
	}
	cl := b.cfg.classes[name]
	if cl == nil {
		return nil, errorf(abi.InvalidArgument, "unknown device class ", strconv.Quote(name), " (classes: ", strings.Join(b.cfg.names, ", "), ")")
	}
	return cl, nil
}

func isFsType(s string) bool {
	for _, f := range fsTypes {
		if f == s {
			return true
		}
	}
	return false
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

func i64(v int64) string { return strconv.FormatInt(v, 10) }
