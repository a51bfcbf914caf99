package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the mount host calls.
const Family = "mount"

// Bindings returns the "mount" host calls (see abi/hc_mount.go). The
// caller's roots are the folders (and device folders) it may mount in and
// from. A path must lie inside a root as written and again with its
// symlinks resolved, so a symlink inside a root (a volume's content is the
// workload's to write) cannot point a mount elsewhere, also when one is
// swapped in after that check: the mount goes by descriptors, the source
// opened beneath its root and the target checked as its descriptor shows
// it (BindBeneath).
func Bindings() []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallMountBind, bindCall),
		hostcalls.Typed(Family, abi.HostCallMountUnmount, unmountCall),
		hostcalls.Typed(Family, abi.HostCallMountInfo, infoCall),
	}
}

func bindCall(ctx context.Context, env *hostcalls.Env, req *abi.MountBindRequest) (*abi.MountChange, error) {
	src, err := confine(env.Roots, req.Source)
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", req.Source, err)
	}
	target, err := confine(env.Roots, req.Target)
	if err != nil {
		return nil, fmt.Errorf("bind on %s: %w", req.Target, err)
	}
	// The checks above read paths; the mount goes by descriptors opened
	// beneath the roots, so a link swapped in since cannot lead it out.
	did, err := BindBeneath(ctx, env.Roots, src, target, req.ReadOnly)
	if err != nil {
		return nil, err
	}
	if env.Log != nil && did {
		env.Log.Info("bind mounted", "source", src, "target", target, "read_only", req.ReadOnly)
	}
	return &abi.MountChange{Changed: did}, nil
}

func unmountCall(ctx context.Context, env *hostcalls.Env, req *abi.MountUnmountRequest) (*abi.MountChange, error) {
	target, err := confine(env.Roots, req.Target)
	if err != nil {
		return nil, fmt.Errorf("unmount %s: %w", req.Target, err)
	}
	unmount := Unmount
	if req.Lazy {
		unmount = UnmountLazy
	}
	did, err := unmount(ctx, target)
	if err != nil {
		return nil, err
	}
	if env.Log != nil && did {
		env.Log.Info("unmounted", "target", target, "lazy", req.Lazy)
	}
	return &abi.MountChange{Changed: did}, nil
}

func infoCall(ctx context.Context, env *hostcalls.Env, req *abi.MountInfoRequest) (*abi.MountInfo, error) {
	target, err := confine(env.Roots, req.Target)
	if err != nil {
		return nil, fmt.Errorf("mount info of %s: %w", req.Target, err)
	}
	e, err := Info(target)
	if abi.CodeOf(err) == abi.NotFound {
		return &abi.MountInfo{}, nil // not a mount point, or not there
	}
	if err != nil {
		return nil, err
	}
	// A mount point now: a block device node there is a bind of one.
	block, err := isBlockDevice(target)
	if err != nil {
		return nil, err
	}
	return &abi.MountInfo{
		Mounted: true, Source: e.Source, Root: e.Root, FSType: e.FSType,
		Options: e.Options, SuperOptions: e.SuperOptions, ReadOnly: e.ReadOnly, BlockDevice: block,
	}, nil
}

// confine checks path against roots as written, then resolves the symlinks
// of its longest existing prefix and checks the result against the roots
// and their own resolved forms. It returns the resolved path.
func confine(roots []string, path string) (string, error) {
	clean, err := hostcalls.Confine(roots, path, false)
	if err != nil {
		return "", err
	}
	real, err := resolveExisting(clean)
	if err != nil {
		return "", fail("resolve", clean, err)
	}
	all := append([]string(nil), roots...)
	for _, r := range roots {
		if rr, err := filepath.EvalSymlinks(r); err == nil && rr != filepath.Clean(r) {
			all = append(all, rr)
		}
	}
	if _, err := hostcalls.Confine(all, real, false); err != nil {
		return "", abi.Errorf(abi.PermissionDenied, "path %q resolves to %q, outside the granted roots", path, real)
	}
	return real, nil
}

// resolveExisting resolves the symlinks of the longest existing prefix of
// an absolute, clean path and appends the rest, which does not exist yet.
func resolveExisting(path string) (string, error) {
	rest := ""
	for p := path; ; p = filepath.Dir(p) {
		real, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(real, rest), nil
		}
		if !errors.Is(err, os.ErrNotExist) || p == "/" {
			return "", err
		}
		rest = filepath.Join(filepath.Base(p), rest)
	}
}
