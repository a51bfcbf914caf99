// Package config loads the daemon's configuration with koanf: the embedded
// defaults (default.yaml, which documents every key), then an optional YAML
// file, then WASMCSI_* environment variables, then command-line flags, and
// finally CSI_ENDPOINT as the CSI spec asks. It only reads; it never creates
// folders or touches the system.
package config

import (
	_ "embed"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultYAML returns the embedded default configuration, which documents
// every key.
func DefaultYAML() []byte { return append([]byte(nil), defaultYAML...) }

// Config is the daemon's whole configuration.
type Config struct {
	DriverName       string            `koanf:"driver_name"`
	Endpoint         string            `koanf:"endpoint"`
	SocketGroup      string            `koanf:"socket_group"`
	NodeID           string            `koanf:"node_id"`
	Role             string            `koanf:"role"`
	StateDir         string            `koanf:"state_dir"`
	ModuleDir        string            `koanf:"module_dir"`
	CacheDir         string            `koanf:"cache_dir"`
	PreferTinyGo     bool              `koanf:"prefer_tinygo"`
	WatchModules     bool              `koanf:"watch_modules"`
	MetricsAddress   string            `koanf:"metrics_address"`
	BackendParameter string            `koanf:"backend_parameter"`
	DefaultBackend   string            `koanf:"default_backend"`
	LogLevel         string            `koanf:"log_level"`
	LogFormat        string            `koanf:"log_format"`
	Limits           Limits            `koanf:"limits"`
	Reconcile        Reconcile         `koanf:"reconcile"`
	Node             NodePaths         `koanf:"node"`
	GroupSnapshot    GroupSnapshot     `koanf:"group_snapshot"`
	OCI              OCI               `koanf:"oci"`
	Modules          map[string]Module `koanf:"modules"`

	// MemoryBudgetPages bounds the linear memory of all module instances
	// together, in 64 KiB pages.
	MemoryBudgetPages uint32 `koanf:"memory_budget_pages"`
}

// Limits bound every module call.
type Limits struct {
	CallTimeout    time.Duration `koanf:"call_timeout"`
	MemoryPages    uint32        `koanf:"memory_pages"`
	PoolSize       int           `koanf:"pool_size"`
	AcquireTimeout time.Duration `koanf:"acquire_timeout"`
	// IdleMemoryPages is the most memory an instance keeps in the pool.
	IdleMemoryPages uint32 `koanf:"idle_memory_pages"`
}

// Reconcile says what to do at start-up with attachments and mounts that no
// record explains (Clean), and with module storage no record explains
// (CleanStorage: a module's list_owned, e.g. LVM volumes).
type Reconcile struct {
	Clean        bool `koanf:"clean"`
	CleanStorage bool `koanf:"clean_storage"`
}

// NodePaths confines the staging and target paths the CO names.
type NodePaths struct {
	// PathRoots, when not empty, are the only folders staging and target
	// paths may lie in (the kubelet's folder, Nomad's
	// stage_publish_base_dir); a node call naming another path is
	// INVALID_ARGUMENT.
	PathRoots []string `koanf:"path_roots"`
}

// GroupSnapshot bounds how long a group snapshot may pause the writes of
// its members (host/RATIONALE.md, "Group snapshots").
type GroupSnapshot struct {
	FreezeTimeout time.Duration `koanf:"freeze_timeout"`
}

// OCI configures the modules pulled from OCI registries (modules whose
// source is oci://...).
type OCI struct {
	// Key is the PEM ECDSA P-256 public key (cosign.pub) a module's
	// signature must verify with, unless the module names its own.
	Key string `koanf:"key"`
	// Interval is how often tags are resolved again (SIGHUP also does).
	Interval time.Duration `koanf:"interval"`
	// PlainHTTP lists registries (host:port) reached without TLS.
	PlainHTTP []string `koanf:"plain_http"`
	// AuthFile is a Docker config.json with registry credentials.
	AuthFile string `koanf:"auth_file"`
}

// Module is the operator's grant for one module.
type Module struct {
	// Disabled leaves the module's file in the folder unloaded.
	Disabled bool `koanf:"disabled"`
	// Source, when set, is where the module comes from instead of the
	// module folder: oci://REGISTRY/REPO:TAG or oci://REGISTRY/REPO@sha256:...
	Source string `koanf:"source"`
	// Key is the public key of a Source module (default: oci.key).
	Key       string            `koanf:"key"`
	SHA256    string            `koanf:"sha256"`
	HostCalls []string          `koanf:"hostcalls"`
	Roots     []string          `koanf:"roots"`
	Config    map[string]string `koanf:"config"`
	Limits    *Limits           `koanf:"limits"`
}

// Roles.
const (
	RoleAll        = "all"
	RoleController = "controller"
	RoleNode       = "node"
)

// Flags declares the command-line flags that override configuration keys.
func Flags(fs *pflag.FlagSet) {
	fs.String("config", "", "YAML configuration file (see the embedded defaults: wasmcsi config)")
	fs.String("endpoint", "", "CSI endpoint, e.g. unix:///run/wasmcsi/csi.sock (CSI_ENDPOINT wins)")
	fs.String("node_id", "", "node name reported by NodeGetInfo")
	fs.String("role", "", "all, controller or node")
	fs.String("state_dir", "", "folder of durable records")
	fs.String("module_dir", "", "folder of backend modules (*.wasm)")
	fs.String("metrics_address", "", "serve Prometheus metrics on this address")
	fs.String("log_level", "", "debug, info, warn or error")
}

// Load builds the configuration. fs may be nil; only flags the user set
// override the lower layers. environ is usually os.Environ().
func Load(fs *pflag.FlagSet, environ []string) (*Config, error) {
	k := koanf.New(".")
	if err := k.Load(rawbytes.Provider(defaultYAML), yaml.Parser()); err != nil {
		return nil, fmt.Errorf("embedded defaults: %w", err)
	}
	if fs != nil {
		if path, _ := fs.GetString("config"); path != "" {
			fk := koanf.New(".")
			if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
				return nil, fmt.Errorf("config file %s: %w", path, err)
			}
			// An operator's module list replaces the embedded one instead
			// of merging with it: a module the file does not grant must not
			// be granted by the defaults.
			if fk.Exists("modules") {
				k.Delete("modules")
			}
			if err := k.Merge(fk); err != nil {
				return nil, fmt.Errorf("config file %s: %w", path, err)
			}
		}
	}
	lookup := map[string]string{}
	for _, kv := range environ {
		if i := strings.IndexByte(kv, '='); i > 0 {
			lookup[kv[:i]] = kv[i+1:]
		}
	}
	// WASMCSI_LIMITS__CALL_TIMEOUT=3s -> limits.call_timeout: a double
	// underscore separates levels because keys contain single underscores.
	envProvider := env.Provider(".", env.Opt{
		Prefix: "WASMCSI_",
		TransformFunc: func(key, value string) (string, any) {
			key = strings.ToLower(strings.TrimPrefix(key, "WASMCSI_"))
			return strings.ReplaceAll(key, "__", "."), value
		},
		EnvironFunc: func() []string { return environ },
	})
	if err := k.Load(envProvider, nil); err != nil {
		return nil, fmt.Errorf("environment: %w", err)
	}
	if fs != nil {
		if err := k.Load(posflag.ProviderWithFlag(fs, ".", k, func(f *pflag.Flag) (string, any) {
			if !f.Changed || f.Name == "config" {
				return "", nil
			}
			return f.Name, posflag.FlagVal(fs, f)
		}), nil); err != nil {
			return nil, fmt.Errorf("flags: %w", err)
		}
	}
	if ep := lookup["CSI_ENDPOINT"]; ep != "" {
		_ = k.Set("endpoint", ep)
	}
	var c Config
	if err := k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{Tag: "koanf"}); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := c.normalize(); err != nil {
		return nil, err
	}
	return &c, nil
}

// normalize checks values and makes every path absolute, so that nothing
// later depends on the working directory.
func (c *Config) normalize() error {
	switch c.Role {
	case RoleAll, RoleController, RoleNode:
	default:
		return fmt.Errorf("config: role %q: want all, controller or node", c.Role)
	}
	if c.DriverName == "" {
		return fmt.Errorf("config: driver_name is empty")
	}
	if c.NodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("config: node_id empty and no host name: %w", err)
		}
		c.NodeID = h
	}
	if c.Limits.CallTimeout <= 0 || c.Limits.PoolSize <= 0 || c.Limits.MemoryPages == 0 || c.Limits.AcquireTimeout <= 0 || c.Limits.IdleMemoryPages == 0 {
		return fmt.Errorf("config: limits must all be positive: %+v", c.Limits)
	}
	if c.GroupSnapshot.FreezeTimeout <= 0 {
		return fmt.Errorf("config: group_snapshot.freeze_timeout must be positive: %s", c.GroupSnapshot.FreezeTimeout)
	}
	if c.MemoryBudgetPages == 0 {
		return fmt.Errorf("config: memory_budget_pages must be positive")
	}
	var err error
	for _, p := range []*string{&c.StateDir, &c.ModuleDir, &c.CacheDir, &c.OCI.Key, &c.OCI.AuthFile} {
		if *p, err = abs(*p); err != nil {
			return err
		}
	}
	for _, r := range c.Node.PathRoots {
		if !filepath.IsAbs(r) || filepath.Clean(r) != r {
			return fmt.Errorf("config: node.path_roots: %q is not an absolute, clean path", r)
		}
	}
	c.Endpoint, err = normalizeEndpoint(c.Endpoint)
	if err != nil {
		return err
	}
	ociModules := false
	for name, m := range c.Modules {
		if m.Source != "" {
			if !strings.HasPrefix(m.Source, "oci://") {
				return fmt.Errorf("config: modules.%s.source %q: want oci://REGISTRY/REPO:TAG or oci://REGISTRY/REPO@sha256:DIGEST", name, m.Source)
			}
			if m.Key == "" && c.OCI.Key == "" {
				return fmt.Errorf("config: modules.%s.source is an OCI reference but neither modules.%s.key nor oci.key names the public key that signs it", name, name)
			}
			ociModules = ociModules || !m.Disabled
		}
		if m.Key != "" {
			if m.Key, err = abs(m.Key); err != nil {
				return err
			}
		}
		for i, r := range m.Roots {
			// Roots are paths for the dir, file and loop families, but a
			// device-mapper name prefix or an iSCSI portal for others: only
			// what looks like a path (contains a slash) is made absolute.
			if isPathRoot(r) {
				if m.Roots[i], err = abs(r); err != nil {
					return err
				}
			}
		}
		if m.Config == nil {
			m.Config = map[string]string{}
		}
		c.Modules[name] = m
	}
	if ociModules && c.OCI.Interval <= 0 {
		return fmt.Errorf("config: oci.interval must be positive: %s", c.OCI.Interval)
	}
	return nil
}

// isPathRoot tells a path root (anything with a slash that is not a
// network prefix such as 192.0.2.0/24) from a name prefix or a portal.
func isPathRoot(r string) bool {
	if _, err := netip.ParsePrefix(r); err == nil {
		return false
	}
	// An NFS server with the export it confines mounts to
	// ("192.0.2.5:/srv/nfs", "nfs.example:/export").
	if i := strings.Index(r, ":/"); i > 0 && !strings.Contains(r[:i], "/") {
		return false
	}
	return strings.Contains(r, "/")
}

// SocketPath returns the filesystem path of a unix endpoint.
func (c *Config) SocketPath() string { return strings.TrimPrefix(c.Endpoint, "unix://") }

func normalizeEndpoint(ep string) (string, error) {
	path := ep
	switch {
	case strings.HasPrefix(ep, "unix://"):
		path = strings.TrimPrefix(ep, "unix://")
	case strings.Contains(ep, "://"):
		return "", fmt.Errorf("config: endpoint %q: only unix sockets are served", ep)
	}
	if path == "" {
		return "", fmt.Errorf("config: endpoint is empty")
	}
	p, err := abs(path)
	if err != nil {
		return "", err
	}
	return "unix://" + p, nil
}

func abs(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("config: path %q: %w", p, err)
	}
	return a, nil
}
