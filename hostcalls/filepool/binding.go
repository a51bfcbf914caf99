package filepool

import (
	"context"
	"fmt"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// Family is the grant that allows the file host calls.
const Family = "file"

// pools holds the open pool of every root a file host call has used, so a
// call does not reopen its root, and what a pool learns about its
// filesystem (no O_TMPFILE, say) is learnt once.
var pools = hostcalls.NewPools(Open, (*Pool).Close)

// Bindings returns the "file" host calls (see abi/hc_file.go). The caller's
// roots are pool folders; every file a call names lives directly in one.
func Bindings() []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallFileCreate, createCall),
		hostcalls.Typed(Family, abi.HostCallFileResize, resizeCall),
		hostcalls.Typed(Family, abi.HostCallFileRemove, removeCall),
		hostcalls.Typed(Family, abi.HostCallFileClone, cloneCall),
		hostcalls.Typed(Family, abi.HostCallFileStat, statCall),
		hostcalls.Typed(Family, abi.HostCallFileStatfs, statfsCall),
		hostcalls.Typed(Family, abi.HostCallFileList, listCall),
	}
}

// listCall answers a page of the pool's volume files (regular files only).
func listCall(ctx context.Context, env *hostcalls.Env, req *abi.ListRequest) (*abi.ListPage, error) {
	return hostcalls.WithRoot(pools, env, req.Pool, "list", func(p *Pool) (*abi.ListPage, error) {
		return hostcalls.ListPage(ctx, p.dirFD(), req, 0, checkName)
	})
}

func createCall(ctx context.Context, env *hostcalls.Env, req *abi.FileCreateRequest) (*abi.Empty, error) {
	return withFile(env, req.Path, func(p *Pool, name string) (*abi.Empty, error) {
		return &abi.Empty{}, p.Create(ctx, name, req.SizeBytes, req.Prealloc)
	})
}

func resizeCall(ctx context.Context, env *hostcalls.Env, req *abi.FileResizeRequest) (*abi.Empty, error) {
	return withFile(env, req.Path, func(p *Pool, name string) (*abi.Empty, error) {
		return &abi.Empty{}, p.Resize(ctx, name, req.SizeBytes, req.Prealloc)
	})
}

func removeCall(ctx context.Context, env *hostcalls.Env, req *abi.FileRequest) (*abi.Empty, error) {
	return withFile(env, req.Path, func(p *Pool, name string) (*abi.Empty, error) {
		// Removing an attached file would leave a loop device over a
		// deleted file, holding its space until someone detaches it.
		f, err := p.OpenFile(ctx, name, true)
		if abi.CodeOf(err) == abi.NotFound {
			return &abi.Empty{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("remove %s: %w", name, err)
		}
		d, attached, err := loop.FindFile(ctx, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("remove %s: %w", name, err)
		}
		if attached {
			return nil, fmt.Errorf("remove %s: %w", name, abi.Errorf(abi.FailedPrecondition, "attached to %s; detach it first", d.Path))
		}
		return &abi.Empty{}, p.Remove(ctx, name)
	})
}

func cloneCall(ctx context.Context, env *hostcalls.Env, req *abi.FileCloneRequest) (*abi.Empty, error) {
	err := hostcalls.WithPair(pools, env, req.Source, req.Target, "file", "clone", checkName, func(p *Pool, src, dst string) error {
		return p.Clone(ctx, src, dst)
	})
	if err != nil {
		return nil, err
	}
	return &abi.Empty{}, nil
}

func statCall(ctx context.Context, env *hostcalls.Env, req *abi.FileRequest) (*abi.FileStat, error) {
	return withFile(env, req.Path, func(p *Pool, name string) (*abi.FileStat, error) {
		size, allocated, err := p.Stat(ctx, name)
		if err != nil {
			return nil, err
		}
		return &abi.FileStat{SizeBytes: size, AllocatedBytes: allocated}, nil
	})
}

func statfsCall(ctx context.Context, env *hostcalls.Env, req *abi.FileRequest) (*abi.FileStatfs, error) {
	return hostcalls.WithRoot(pools, env, req.Path, "statfs", func(p *Pool) (*abi.FileStatfs, error) {
		u, err := p.Statfs(ctx)
		if err != nil {
			return nil, err
		}
		return &abi.FileStatfs{
			TotalBytes: u.TotalBytes, AvailableBytes: u.AvailableBytes, UsedBytes: u.UsedBytes,
			TotalInodes: u.TotalInodes, FreeInodes: u.FreeInodes, UsedInodes: u.UsedInodes,
		}, nil
	})
}

// withFile acquires the pool that holds path and runs fn with the file's name.
func withFile[R any](env *hostcalls.Env, path string, fn func(p *Pool, name string) (*R, error)) (*R, error) {
	return hostcalls.WithVolume(pools, env, path, "file", checkName, fn)
}
