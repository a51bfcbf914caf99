package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// Module config keys (the operator's `config:` of this module).
const (
	configServer  = "server"         // the address nodes mount server-mode volumes from; a granted server root on nodes
	configPool    = "pool"           // server mode's pool folder; a granted root; default: the first folder root
	configMounts  = "mounts"         // the folder NFS mounts go in (nodes; the controller in client mode); a granted root
	configClient  = "client_address" // this node's address as the server sees it; default: the source address of the route to server
	configQuota   = "quota"          // auto | required | off, as localdir's
	configVersion = "version"        // NFS version: 4.2 | 4.1 | "" (4.2, else 4.1)
)

var configKeys = []string{configServer, configPool, configMounts, configClient, configQuota, configVersion}

// StorageClass parameters.
const (
	paramMode     = "mode"
	paramServer   = "server"
	paramShare    = "share"
	paramOnDelete = "onDelete"
)

// Modes.
const (
	modeServer = "server"
	modeClient = "client"
)

// onDelete values of client mode.
const (
	onDeleteDelete  = "delete"
	onDeleteRetain  = "retain"
	onDeleteArchive = "archive"
)

// Parameters are the StorageClass parameters (README.md).
var Parameters = []abi.ParameterSpec{
	{Name: paramMode, Default: modeServer, Allowed: []string{modeServer, modeClient},
		Description: "server: folders this host exports itself, capacity enforced; client: folders of an existing export"},
	{Name: paramServer, Description: "client mode: the NFS server (IP address or host name), a granted server root"},
	{Name: paramShare, Description: "client mode: the export on the server that holds the volumes' folders (absolute path)"},
	{Name: paramOnDelete, Default: onDeleteDelete, Allowed: []string{onDeleteDelete, onDeleteRetain, onDeleteArchive},
		Description: "client mode: what DeleteVolume does with the folder: remove it, keep it, or rename it archived-<name>"},
}

// Volume context keys: everything a node needs to mount the volume, so
// node operations need no controller record.
const (
	ctxMode     = "mode"
	ctxServer   = "server"
	ctxExport   = "export"   // the path nodes mount: the volume's own folder
	ctxShare    = "share"    // client mode: the export holding the folder
	ctxFolder   = "folder"   // client mode: the folder's name in the share
	ctxOnDelete = "onDelete" // client mode
	// ctxCapacity says whether the capacity is "enforced" (project
	// quota) or "advisory" (client mode, or a pool without quotas).
	ctxCapacity = "capacity"
)

// Publish context keys.
const (
	pubServer = "server"
	pubExport = "export"
)

// NodeContextClient is the key under which node_info reports the node's
// address; ControllerPublish reads it back from the node ID and adds it to
// the export's clients.
const NodeContextClient = "nfs_client"

// Sizes.
const (
	minSizeBytes     = 1 * sdk.MiB
	defaultSizeBytes = 1 * sdk.GiB
	granularity      = 4096
)

// Local ID prefixes: server-mode volumes and snapshots are folders of the
// pool; client-mode ones are folders of an operator's share.
const (
	prefixVolume         = "v-"
	prefixSnapshot       = "s-"
	prefixClientVolume   = "c-"
	prefixClientSnapshot = "cs-"
	prefixArchived       = "archived-"
)

// config is the module's checked configuration.
type config struct {
	role    string
	server  string
	pool    string
	mounts  string
	client  string
	quota   string
	version string
	roots   []string
}

// Backend is the nfs backend. It keeps only its configuration: a volume is
// its folder and its export record on the host.
type Backend struct {
	cfg        config
	configured bool
	enforced   bool   // the pool enforces quotas
	why        string // why not
}

// New returns an unconfigured backend.
func New() *Backend { return &Backend{} }

// Configure checks the operator's configuration. A controller of server
// mode needs server and a pool; a node needs mounts and, unless
// client_address is set, a server to find its own address toward.
func (b *Backend) Configure(req *abi.ConfigureRequest) error {
	c := config{role: req.Role, quota: "auto", roots: req.Roots}
	for k, v := range req.Config {
		switch k {
		case configServer:
			c.server = v
		case configPool:
			p, err := sdk.PoolRoot(v)
			if err != nil {
				return err
			}
			if !hasRoot(req.Roots, p) {
				return sdk.Error(abi.InvalidArgument, "config ", configPool, " = ", p, " is not a granted root")
			}
			c.pool = p
		case configMounts:
			p, err := sdk.PoolRoot(v)
			if err != nil {
				return err
			}
			if !hasRoot(req.Roots, p) {
				return sdk.Error(abi.InvalidArgument, "config ", configMounts, " = ", p, " is not a granted root")
			}
			c.mounts = p
		case configClient:
			if !isAddress(v) {
				return sdk.Error(abi.InvalidArgument, "config ", configClient, " = ", strconv.Quote(v), ": want an IP address")
			}
			c.client = v
		case configQuota:
			if v != "auto" && v != "required" && v != "off" {
				return sdk.Error(abi.InvalidArgument, "config ", configQuota, " = ", strconv.Quote(v), ": want auto, required or off")
			}
			c.quota = v
		case configVersion:
			if v != "" && v != "4.1" && v != "4.2" {
				return sdk.Error(abi.InvalidArgument, "config ", configVersion, " = ", strconv.Quote(v), ": want 4.2, 4.1 or empty")
			}
			c.version = v
		default:
			return sdk.Error(abi.InvalidArgument, "unknown config key ", strconv.Quote(k), " (known: ", strings.Join(configKeys, ", "), ")")
		}
	}
	if c.pool == "" && req.Role != "node" {
		for _, r := range req.Roots {
			if strings.HasPrefix(r, "/") && r != c.mounts {
				p, err := sdk.PoolRoot(r)
				if err != nil {
					return err
				}
				c.pool = p
				break
			}
		}
	}
	if c.mounts == "" && req.Role == "node" {
		for _, r := range req.Roots {
			if strings.HasPrefix(r, "/") {
				c.mounts = strings.TrimSuffix(r, "/")
				break
			}
		}
	}
	b.cfg, b.configured = c, true
	b.enforced, b.why = false, "quotas turned off by config"
	if req.Role != "node" && c.pool != "" && c.quota != "off" {
		q, err := hostcall.DirQuotaSupported(c.pool)
		if err != nil {
			return err
		}
		b.enforced, b.why = q.Supported, q.Reason
		if c.quota == "required" && !q.Supported {
			return sdk.Error(abi.FailedPrecondition, "config quota=required but pool ", c.pool, " enforces no quotas: ", q.Reason)
		}
		if !q.Supported {
			hostcall.Log(abi.LogWarn, "nfs: pool "+c.pool+" enforces no quotas ("+q.Reason+"): server-mode capacity is advisory")
		}
	}
	return nil
}

// Info describes the backend.
func (b *Backend) Info() abi.BackendInfo {
	return abi.BackendInfo{
		Name: "nfs", Version: "1.0.0",
		Description: "shared filesystems over NFSv4: folders this host exports per volume to the nodes it is published to, or folders of an existing export",
		Mount:       true,
		AccessModes: []int64{
			int64(abi.AccessSingleNodeWriter), int64(abi.AccessSingleNodeReadOnly),
			int64(abi.AccessSingleNodeSingleWriter), int64(abi.AccessSingleNodeMultiWriter),
			int64(abi.AccessMultiNodeReadOnly), int64(abi.AccessMultiNodeSingleWriter), int64(abi.AccessMultiNodeMultiWriter),
		},
		Granularity:        granularity,
		MinSizeBytes:       minSizeBytes,
		DefaultSizeBytes:   defaultSizeBytes,
		Clone:              true,
		Restore:            true,
		DeclaresParameters: true,
		Parameters:         Parameters,
	}
}

// ready fails operations on an instance the host never configured.
func (b *Backend) ready() error {
	if !b.configured {
		return sdk.Error(abi.Unavailable, "nfs instance is not configured: the host did not call configure on it")
	}
	return nil
}

func hasRoot(roots []string, p string) bool {
	for _, r := range roots {
		if strings.TrimSuffix(r, "/") == p {
			return true
		}
	}
	return false
}

// isAddress is a cheap IP address check (TinyGo has net/netip, but this
// needs none of it).
func isAddress(s string) bool {
	if s == "" || len(s) > 45 {
		return false
	}
	dots, colons := 0, 0
	for _, r := range s {
		switch {
		case r == '.':
			dots++
		case r == ':':
			colons++
		case r >= '0' && r <= '9', r >= 'a' && r <= 'f', r >= 'A' && r <= 'F':
		default:
			return false
		}
	}
	return dots == 3 && colons == 0 || colons >= 2 && dots == 0
}

// mode reads the mode parameter.
func mode(params map[string]string) string {
	if m := params[paramMode]; m != "" {
		return m
	}
	return modeServer
}

func unhealthy(status abi.HealthStatus, reason, msg string) *abi.HealthResponse {
	return &abi.HealthResponse{Entries: []abi.HealthEntry{{Status: status, Reason: reason, Message: msg}}}
}
