package nfs

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the nfs host calls.
const Family = "nfs"

// Bindings returns the "nfs" host calls (abi/hc_nfs.go). The caller's
// roots are told apart by form: absolute folders to mount in, and servers
// (addresses, prefixes, host names), each optionally ":/export".
func Bindings() []hostcalls.Func {
	// No Available: a controller loads the same module without an NFS
	// client; the calls answer FAILED_PRECONDITION there.
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallNfsMount, mountCall),
		hostcalls.Typed(Family, abi.HostCallNfsUnmount, unmountCall),
		hostcalls.Typed(Family, abi.HostCallNfsStat, statCall),
		hostcalls.Typed(Family, abi.HostCallNfsDirCreate, dirCreate),
		hostcalls.Typed(Family, abi.HostCallNfsDirRemove, dirRemove),
		hostcalls.Typed(Family, abi.HostCallNfsDirRename, dirRename),
		hostcalls.Typed(Family, abi.HostCallNfsDirCopy, dirCopy),
		hostcalls.Typed(Family, abi.HostCallNfsDirUsage, dirUsage),
	}
}

// target confines a mount folder: directly in a granted folder root, its
// parent's links resolved (the folder itself is never touched: a dead
// server would hold the caller).
func target(env *hostcalls.Env, t string) (string, error) {
	var folders []string
	for _, r := range env.Roots {
		if strings.HasPrefix(r, "/") {
			folders = append(folders, r)
		}
	}
	clean, err := hostcalls.Confine(folders, t, false)
	if err != nil {
		return "", err
	}
	parent, name := filepath.Dir(clean), filepath.Base(clean)
	if !hostcalls.IsRoot(&hostcalls.Env{Roots: folders}, parent) {
		return "", abi.Errorf(abi.InvalidArgument, "nfs: mount folder %s is not directly in a granted folder", clean)
	}
	if strings.HasPrefix(name, ".") {
		return "", abi.Errorf(abi.InvalidArgument, "nfs: mount folder %s starts with a dot", clean)
	}
	real, err := filepath.EvalSymlinks(parent)
	if err != nil {
		return "", abi.Errorf(abi.NotFound, "nfs: folder %s: %v", parent, err)
	}
	return filepath.Join(real, name), nil
}

// GrantedServer reports whether roots allow mounting server:export. A
// server root always names its exports, "server:/path" ("server:/" for all
// of them), so that it is never confused with the address or prefix roots
// other families of the same module use (nfsd's clients).
func GrantedServer(roots []string, server, export string) bool {
	addr, isIP := netip.Addr{}, false
	if a, err := netip.ParseAddr(server); err == nil {
		addr, isIP = a, true
	}
	for _, r := range roots {
		if strings.HasPrefix(r, "/") {
			continue
		}
		var host, path string
		if strings.HasPrefix(r, "[") { // "[fd00::5]:/x", "[fd00::/64]:/"
			j := strings.Index(r, "]:/")
			if j < 0 {
				continue
			}
			host, path = r[1:j], r[j+2:]
		} else {
			i := strings.Index(r, ":/")
			if i <= 0 {
				continue
			}
			host, path = r[:i], r[i+1:]
		}
		ok := false
		if p, err := netip.ParsePrefix(host); err == nil {
			ok = isIP && p.Masked().Contains(addr)
		} else if a, err := netip.ParseAddr(host); err == nil {
			ok = isIP && a.Unmap() == addr
		} else {
			ok = !isIP && strings.EqualFold(host, server)
		}
		if ok && (path == "/" || export == path || strings.HasPrefix(export, strings.TrimSuffix(path, "/")+"/")) {
			return true
		}
	}
	return false
}

func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

func mountCall(ctx context.Context, env *hostcalls.Env, req *abi.NfsMountRequest) (*abi.NfsMount, error) {
	server, err := ParseServer(req.Server)
	if err != nil {
		return nil, err
	}
	if !filepath.IsAbs(req.Export) || filepath.Clean(req.Export) != req.Export || strings.ContainsAny(req.Export, ", \t\n\x00") {
		return nil, abi.Errorf(abi.InvalidArgument, "nfs_mount: export %q is not an absolute, clean path", req.Export)
	}
	if !GrantedServer(env.Roots, server, req.Export) {
		return nil, abi.Errorf(abi.PermissionDenied, "nfs_mount: server %s:%s is not granted", server, req.Export)
	}
	switch req.Version {
	case "", "4.1", "4.2":
	default:
		return nil, abi.Errorf(abi.InvalidArgument, "nfs_mount: version %q: want 4.2, 4.1 or empty", req.Version)
	}
	if err := CheckOptions(req.Options); err != nil {
		return nil, err
	}
	t, err := target(env, req.Target)
	if err != nil {
		return nil, err
	}
	m, err := MountNFS(ctx, server, req.Export, t, req.Version, req.Options, req.ReadOnly, millis(req.TimeoutMillis))
	if err != nil {
		return nil, err
	}
	if env.Log != nil {
		env.Log.Info("nfs mounted", "server", server, "export", req.Export, "target", t, "version", m.Version)
	}
	return &abi.NfsMount{Server: m.Server, Export: m.Export, Target: t, Version: m.Version, Reachable: true}, nil
}

func unmountCall(ctx context.Context, env *hostcalls.Env, req *abi.NfsTargetRequest) (*abi.Empty, error) {
	t, err := target(env, req.Target)
	if err != nil {
		return nil, err
	}
	lazy, err := Unmount(ctx, t, millis(req.TimeoutMillis))
	if err != nil {
		return nil, err
	}
	if lazy && env.Log != nil {
		env.Log.Warn("nfs server did not answer: mount detached lazily", "target", t)
	}
	return &abi.Empty{}, nil
}

func statCall(ctx context.Context, env *hostcalls.Env, req *abi.NfsTargetRequest) (*abi.NfsMount, error) {
	t, err := target(env, req.Target)
	if err != nil {
		return nil, err
	}
	m, u, why, err := Stat(ctx, t, millis(req.TimeoutMillis))
	if err != nil {
		return nil, err
	}
	return &abi.NfsMount{Server: m.Server, Export: m.Export, Target: t, Version: m.Version, Reachable: why == "",
		TotalBytes: u.Total, AvailableBytes: u.Available, UsedBytes: u.Used, Error: why}, nil
}
