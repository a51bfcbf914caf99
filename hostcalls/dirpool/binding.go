package dirpool

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the dir host calls.
const Family = "dir"

// pools holds the open pool of every root a dir host call has used, so a
// call neither reopens its root nor probes its quota state again, and calls
// on one root share the pool's project ID lock.
var pools = hostcalls.NewPools(Open, (*Pool).Close)

// Bindings returns the "dir" host calls (see abi/hc_dir.go). The caller's
// roots are pool folders; every directory a call names lives directly in
// one.
func Bindings() []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallDirCreate, createCall),
		hostcalls.Typed(Family, abi.HostCallDirRemove, removeCall),
		hostcalls.Typed(Family, abi.HostCallDirCopy, copyCall),
		hostcalls.Typed(Family, abi.HostCallDirStatfs, statfsCall),
		hostcalls.Typed(Family, abi.HostCallDirUsage, usageCall),
		hostcalls.Typed(Family, abi.HostCallDirSetQuota, setQuotaCall),
		hostcalls.Typed(Family, abi.HostCallDirQuotaSupported, quotaSupportedCall),
		hostcalls.Typed(Family, abi.HostCallDirExists, existsCall),
		hostcalls.Typed(Family, abi.HostCallDirList, listCall),
	}
}

// listCall answers a page of the pool's volume directories.
func listCall(ctx context.Context, env *hostcalls.Env, req *abi.ListRequest) (*abi.ListPage, error) {
	return hostcalls.WithRoot(pools, env, req.Pool, "list", func(p *Pool) (*abi.ListPage, error) {
		return hostcalls.ListPage(ctx, p.fd, req, fs.ModeDir, ValidName)
	})
}

func createCall(ctx context.Context, env *hostcalls.Env, req *abi.DirCreateRequest) (*abi.Empty, error) {
	return withDir(env, req.Path, func(p *Pool, name string) (*abi.Empty, error) {
		_, err := p.Create(ctx, name, req.QuotaBytes)
		return &abi.Empty{}, err
	})
}

func removeCall(ctx context.Context, env *hostcalls.Env, req *abi.DirRequest) (*abi.Empty, error) {
	return withDir(env, req.Path, func(p *Pool, name string) (*abi.Empty, error) {
		return &abi.Empty{}, p.Remove(ctx, name)
	})
}

func copyCall(ctx context.Context, env *hostcalls.Env, req *abi.DirCopyRequest) (*abi.Empty, error) {
	err := hostcalls.WithPair(pools, env, req.Source, req.Target, "directory", "copy", ValidName, func(p *Pool, src, dst string) error {
		return p.Copy(ctx, src, dst)
	})
	if err != nil {
		return nil, err
	}
	return &abi.Empty{}, nil
}

// statfsCall answers for the pool folder itself or for one directory in it.
func statfsCall(ctx context.Context, env *hostcalls.Env, req *abi.DirRequest) (*abi.DirStatfs, error) {
	clean, err := hostcalls.Confine(env.Roots, req.Path, true)
	if err != nil {
		return nil, fmt.Errorf("statfs %s: %w", req.Path, err)
	}
	var s Stats
	if hostcalls.IsRoot(env, clean) {
		p, release, err := pools.Acquire(clean)
		if err != nil {
			return nil, err
		}
		defer release()
		if s, err = p.Statfs(ctx); err != nil {
			return nil, err
		}
	} else {
		resp, err := withDir(env, req.Path, func(p *Pool, name string) (*Stats, error) {
			s, err := p.VolumeStatfs(ctx, name)
			return &s, err
		})
		if err != nil {
			return nil, err
		}
		s = *resp
	}
	return &abi.DirStatfs{
		TotalBytes: s.TotalBytes, FreeBytes: s.FreeBytes, AvailableBytes: s.AvailBytes,
		TotalInodes: s.TotalInodes, FreeInodes: s.FreeInodes,
	}, nil
}

func usageCall(ctx context.Context, env *hostcalls.Env, req *abi.DirRequest) (*abi.DirUsage, error) {
	return withDir(env, req.Path, func(p *Pool, name string) (*abi.DirUsage, error) {
		bytes, inodes, err := p.Usage(ctx, name)
		if err != nil {
			return nil, err
		}
		return &abi.DirUsage{UsedBytes: bytes, UsedInodes: inodes}, nil
	})
}

func setQuotaCall(ctx context.Context, env *hostcalls.Env, req *abi.DirQuotaRequest) (*abi.Empty, error) {
	return withDir(env, req.Path, func(p *Pool, name string) (*abi.Empty, error) {
		return &abi.Empty{}, p.SetQuota(ctx, name, req.QuotaBytes)
	})
}

func quotaSupportedCall(ctx context.Context, env *hostcalls.Env, req *abi.DirRequest) (*abi.DirQuotaSupport, error) {
	return hostcalls.WithRoot(pools, env, req.Path, "quota support of", func(p *Pool) (*abi.DirQuotaSupport, error) {
		return &abi.DirQuotaSupport{Supported: p.QuotaSupported(), Reason: p.noQuota}, nil
	})
}

func existsCall(ctx context.Context, env *hostcalls.Env, req *abi.DirRequest) (*abi.DirExists, error) {
	return withDir(env, req.Path, func(p *Pool, name string) (*abi.DirExists, error) {
		return &abi.DirExists{Exists: p.Exists(ctx, name)}, nil
	})
}

// withDir acquires the pool that holds path and runs fn with the directory's
// name.
func withDir[R any](env *hostcalls.Env, path string, fn func(p *Pool, name string) (*R, error)) (*R, error) {
	return hostcalls.WithVolume(pools, env, path, "directory", ValidName, fn)
}
