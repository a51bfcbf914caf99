package nvmet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/netaddr"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
	"github.com/wasmcsi/wasmcsi/hostcalls/nvme"
)

// Family is the grant that allows the nvmet host calls.
const Family = "nvmet"

// Bindings returns the "nvmet" host calls (see abi/hc_nvmet.go) on the
// nvmet tree at DefaultRoot. The caller's roots are told apart by form:
//
//   - "nqn." prefixes: the subsystems it may manage;
//   - absolute paths: folders or device paths its backing stores must lie
//     in (as written; a file's resolved path too, while a block device's
//     resolved node must be under /dev with the device number of the
//     path named, and neither mounted nor held on this host);
//   - addresses ("0.0.0.0:4420", "[::]:4420", "192.0.2.5:4420"): where
//     its subsystems may listen.
func Bindings() []hostcalls.Func { return bindingsOn(New(DefaultRoot)) }

func bindingsOn(t *Target) []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallNvmetNamespaceCreate, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmetNamespaceCreateRequest) (*abi.Empty, error) {
			if err := grantedSubsystem(env.Roots, req.Subsystem); err != nil {
				return nil, err
			}
			u, err := nvme.ParseUUID(req.UUID)
			if err != nil {
				return nil, err
			}
			if err := checkNSID(int(req.NSID)); err != nil {
				return nil, err
			}
			if err := grantedBacking(env.Roots, req.Path); err != nil {
				return nil, err
			}
			if len(req.Ports) == 0 {
				return nil, abi.Errorf(abi.InvalidArgument, "nvmet_namespace_create: no ports")
			}
			ports, err := grantedPorts(env.Roots, req.Ports)
			if err != nil {
				return nil, err
			}
			if err := t.CreateNamespace(ctx, Namespace{Subsystem: req.Subsystem, NSID: int(req.NSID), Path: req.Path, UUID: u,
				Ports: ports, BufferedIO: req.BufferedIO}); err != nil {
				return nil, err
			}
			if env.Log != nil {
				env.Log.Info("nvmet namespace created", "subsystem", req.Subsystem, "nsid", req.NSID, "path", req.Path)
			}
			return &abi.Empty{}, nil
		}),
		hostcalls.Typed(Family, abi.HostCallNvmetNamespaceDelete, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmetNamespaceRequest) (*abi.Empty, error) {
			if err := grantedSubsystem(env.Roots, req.Subsystem); err != nil {
				return nil, err
			}
			return &abi.Empty{}, t.DeleteNamespace(ctx, req.Subsystem, int(req.NSID), req.Path)
		}),
		hostcalls.Typed(Family, abi.HostCallNvmetNamespaceResize, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmetNamespaceRequest) (*abi.NvmetNamespaceResizeResponse, error) {
			if err := grantedSubsystem(env.Roots, req.Subsystem); err != nil {
				return nil, err
			}
			size, err := t.ResizeNamespace(ctx, req.Subsystem, int(req.NSID))
			if err != nil {
				return nil, err
			}
			return &abi.NvmetNamespaceResizeResponse{SizeBytes: size}, nil
		}),
		hostcalls.Typed(Family, abi.HostCallNvmetHostAllow, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmetHostRequest) (*abi.Empty, error) {
			if err := grantedSubsystem(env.Roots, req.Subsystem); err != nil {
				return nil, err
			}
			if req.DHChapKey != "" {
				return nil, abi.Errorf(abi.Unimplemented, "nvmet_host_allow: DH-HMAC-CHAP is not supported yet")
			}
			return &abi.Empty{}, t.AllowHost(ctx, req.Subsystem, req.Host)
		}),
		hostcalls.Typed(Family, abi.HostCallNvmetHostDeny, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmetHostRequest) (*abi.Empty, error) {
			if err := grantedSubsystem(env.Roots, req.Subsystem); err != nil {
				return nil, err
			}
			ports, err := grantedPorts(env.Roots, req.Ports)
			if err != nil {
				return nil, err
			}
			return &abi.Empty{}, t.DenyHost(ctx, req.Subsystem, req.Host, ports)
		}),
	}
}

func isNameRoot(r string) bool { return strings.HasPrefix(r, "nqn.") }

// grantedSubsystem checks that nqn is valid and lies strictly inside a
// granted NQN prefix, at a separator (':' or '.').
func grantedSubsystem(roots []string, nqn string) error {
	if err := nvme.ValidNQN(nqn); err != nil {
		return err
	}
	for _, r := range roots {
		// A root ends at a separator, or the name goes on with one after
		// it: "nqn…:a" grants "nqn…:a:v1", never "nqn…:ab".
		if isNameRoot(r) && strings.HasPrefix(nqn, r) && nqn != r &&
			(strings.HasSuffix(r, ":") || strings.HasSuffix(r, ".") || nqn[len(r)] == ':' || nqn[len(r)] == '.') {
			return nil
		}
	}
	return abi.Errorf(abi.PermissionDenied, "subsystem %s is outside the granted NQN prefixes", nqn)
}

// grantedPorts parses listen addresses and checks each against the
// caller's address roots.
func grantedPorts(roots []string, ps []string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, p := range ps {
		ap, err := netaddr.ParseListen("address", p, nvme.DefaultPort)
		if err != nil {
			return nil, err
		}
		ok := false
		for _, r := range roots {
			if strings.HasPrefix(r, "/") || isNameRoot(r) {
				continue
			}
			if rp, err := netaddr.ParseListen("address", r, nvme.DefaultPort); err == nil && rp == ap {
				ok = true
			}
		}
		if !ok {
			return nil, abi.Errorf(abi.PermissionDenied, "address %s is not granted", ap)
		}
		out = append(out, ap)
	}
	return out, nil
}

// grantedBacking checks path against the caller's path roots: the path
// as written must lie in one; a regular file's resolved path too; a block
// device's resolved node must be under /dev and be the device the path
// names (same device number), and must be neither mounted nor held on
// this host (serving a device in use here would corrupt it).
func grantedBacking(roots []string, path string) error {
	var paths []string
	for _, r := range roots {
		if strings.HasPrefix(r, "/") {
			paths = append(paths, r)
		}
	}
	if _, err := hostcalls.Confine(paths, path, true); err != nil {
		return err
	}
	if !validPath(path) {
		return abi.Errorf(abi.InvalidArgument, "nvmet: backing path %q has spaces, commas or control characters", path)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return abi.Errorf(abi.NotFound, "nvmet_namespace_create: backing store: %v", err)
	}
	var st, rst unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return abi.Errorf(abi.NotFound, "nvmet_namespace_create: backing store: %v", err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if _, err := hostcalls.Confine(paths, real, true); err != nil {
			return abi.Errorf(abi.PermissionDenied, "nvmet_namespace_create: %s leads outside the granted roots", path)
		}
		return nil
	case unix.S_IFBLK:
	default:
		return abi.Errorf(abi.InvalidArgument, "nvmet_namespace_create: %s is neither a block device nor a regular file", path)
	}
	if !strings.HasPrefix(real, "/dev/") || unix.Lstat(real, &rst) != nil || rst.Rdev != st.Rdev {
		return abi.Errorf(abi.PermissionDenied, "nvmet_namespace_create: %s does not lead to its device node under /dev", path)
	}
	return deviceFree(unix.Major(st.Rdev), unix.Minor(st.Rdev), path)
}

// deviceFree is FAILED_PRECONDITION when the block device is mounted or
// held (a partition of it included) on this host.
func deviceFree(major, minor uint32, path string) error {
	dev := fmt.Sprintf("%d:%d", major, minor)
	sys := filepath.Join("/sys/dev/block", dev)
	if h, _ := os.ReadDir(filepath.Join(sys, "holders")); len(h) > 0 {
		return abi.Errorf(abi.FailedPrecondition, "nvmet_namespace_create: %s is held by %s on this host", path, h[0].Name())
	}
	devs := map[string]bool{dev: true}
	if ents, err := os.ReadDir(sys); err == nil {
		for _, e := range ents {
			if d, err := sysattr.Read(filepath.Join(sys, e.Name(), "partition")); err == nil && d != "" {
				if pd, err := sysattr.Read(filepath.Join(sys, e.Name(), "dev")); err == nil {
					devs[pd] = true
				}
			}
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && devs[f[2]] {
			return abi.Errorf(abi.FailedPrecondition, "nvmet_namespace_create: %s is mounted at %s on this host", path, f[4])
		}
	}
	return nil
}
