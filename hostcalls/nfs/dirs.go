package nfs

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/dirpool"
)

// DefaultDirTimeout bounds the short folder calls on a share.
const DefaultDirTimeout = 30 * time.Second

// share opens the NFS mount at req.Target as a dirpool: its folders are
// the volumes. The open itself is bounded: a dead server answers
// UNAVAILABLE.
func share(ctx context.Context, env *hostcalls.Env, req *abi.NfsDirRequest) (*dirpool.Pool, error) {
	t, err := target(env, req.Target)
	if err != nil {
		return nil, err
	}
	if _, ok, err := Find(t); err != nil {
		return nil, err
	} else if !ok {
		return nil, abi.Errorf(abi.NotFound, "nfs: nothing is mounted at %s (nfs_mount first)", t)
	}
	if err := dirpool.ValidName(req.Name); err != nil {
		return nil, err
	}
	if req.NewName != "" {
		if err := dirpool.ValidName(req.NewName); err != nil {
			return nil, err
		}
	}
	var p *dirpool.Pool
	err = boundedCode(ctx, dirTimeout(req), "open share "+t, func() (err error) {
		p, err = dirpool.Open(t)
		return err
	})
	return p, err
}

func dirTimeout(req *abi.NfsDirRequest) time.Duration {
	if req.TimeoutMillis > 0 {
		return millis(req.TimeoutMillis)
	}
	return DefaultDirTimeout
}

// boundedCode is bounded with the timeout as UNAVAILABLE.
func boundedCode(ctx context.Context, timeout time.Duration, what string, fn func() error) error {
	err := bounded(ctx, timeout, fn)
	if errors.Is(err, errTimeout) {
		return abi.Errorf(abi.Unavailable, "nfs: %s: the server did not answer within %v", what, timeout)
	}
	return err
}

// unbounded runs a long call (a copy, a removal of a large tree) on a
// goroutine of its own, for as long as ctx allows.
func unbounded(ctx context.Context, what string, fn func() error) error {
	return boundedCode(ctx, 24*time.Hour, what, fn)
}

func dirCreate(ctx context.Context, env *hostcalls.Env, req *abi.NfsDirRequest) (*abi.Empty, error) {
	p, err := share(ctx, env, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	err = boundedCode(ctx, dirTimeout(req), "create "+req.Name, func() error { _, err := p.Create(ctx, req.Name, 0); return err })
	return &abi.Empty{}, err
}

func dirRemove(ctx context.Context, env *hostcalls.Env, req *abi.NfsDirRequest) (*abi.Empty, error) {
	p, err := share(ctx, env, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return &abi.Empty{}, unbounded(ctx, "remove "+req.Name, func() error { return p.Remove(ctx, req.Name) })
}

func dirCopy(ctx context.Context, env *hostcalls.Env, req *abi.NfsDirRequest) (*abi.Empty, error) {
	if req.NewName == "" {
		return nil, abi.Errorf(abi.InvalidArgument, "nfs_dir_copy: no NewName")
	}
	p, err := share(ctx, env, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return &abi.Empty{}, unbounded(ctx, "copy "+req.Name, func() error { return p.Copy(ctx, req.Name, req.NewName) })
}

func dirRename(ctx context.Context, env *hostcalls.Env, req *abi.NfsDirRequest) (*abi.Empty, error) {
	if req.NewName == "" {
		return nil, abi.Errorf(abi.InvalidArgument, "nfs_dir_rename: no NewName")
	}
	p, err := share(ctx, env, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	root := p.Root()
	err = boundedCode(ctx, dirTimeout(req), "rename "+req.Name, func() error {
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		switch err := unix.Fstatat(fd, req.NewName, &st, unix.AT_SYMLINK_NOFOLLOW); {
		case err == nil:
			if serr := unix.Fstatat(fd, req.Name, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(serr, unix.ENOENT) {
				return nil // renamed by an earlier attempt
			}
			return abi.Errorf(abi.AlreadyExists, "nfs_dir_rename: %s exists", req.NewName)
		case !errors.Is(err, unix.ENOENT):
			return err
		}
		if err := unix.Fstatat(fd, req.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return abi.Errorf(abi.NotFound, "nfs_dir_rename: %s does not exist", req.Name)
			}
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return abi.Errorf(abi.InvalidArgument, "nfs_dir_rename: %s is not a folder", req.Name)
		}
		// NFS has no RENAME_NOREPLACE; the check above and the host's
		// serialization per volume stand for it.
		if err := unix.Renameat(fd, req.Name, fd, req.NewName); err != nil {
			return err
		}
		return unix.Fsync(fd)
	})
	if err != nil && abi.CodeOf(err) == abi.Internal && !isABI(err) {
		err = abi.Errorf(abi.Internal, "nfs_dir_rename %s: %v", req.Name, err)
	}
	return &abi.Empty{}, err
}

func isABI(err error) bool {
	var e *abi.Error
	return errors.As(err, &e)
}

func dirUsage(ctx context.Context, env *hostcalls.Env, req *abi.NfsDirRequest) (*abi.NfsDirUsage, error) {
	p, err := share(ctx, env, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	out := &abi.NfsDirUsage{}
	err = boundedCode(ctx, dirTimeout(req), "usage of "+req.Name, func() error {
		if !p.Exists(ctx, req.Name) {
			return nil
		}
		out.Exists = true
		b, i, err := p.Usage(ctx, req.Name)
		out.UsedBytes, out.UsedInodes = b, i
		return err
	})
	return out, err
}
