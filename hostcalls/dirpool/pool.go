// Package dirpool keeps volumes as directories under one pool root that the
// operator granted: create, remove, copy (clone and snapshot), capacity,
// usage and per-directory project quotas on xfs and ext4. It is the storage
// primitive of the localdir backend.
//
// A directory appears under its name only when it is complete: Copy builds
// the copy in the pool's scratch folder (".wasmcsi-tmp", see
// hostcalls/internal/scratch), makes it durable and renames it into place.
// A daemon killed during a copy leaves no partial copy under the target's
// name, so a repeated call starts afresh; Open and Copy remove the
// temporaries of copies whose process died. Names starting with "." are
// refused, so no caller reaches the scratch folder.
//
// Create and Remove fsync the root after their mkdir or rmdir, and also
// when they find the folder already made or gone (the retry of a call cut
// off before its sync), unless the caller passes hostcalls.DirSyncs in the
// context and makes that fsync itself, later, in a batch.
//
// Every path it touches is opened relative to a file descriptor of the root
// with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV), so no
// name, symlink planted inside the pool, or mount inside a volume can lead an
// operation outside the pool. It must never follow a symlink, cross a mount
// point, or accept a name that is more than one path component.
package dirpool

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/scratch"
)

// Pool is a directory whose direct children are volumes (or snapshots). It
// holds an open descriptor of the root; Close releases it. A Pool is safe
// for concurrent use; callers serialize operations on one name.
type Pool struct {
	root string
	fd   int

	quota    quotaKind
	noQuota  string // why quotas are unsupported, for the error message
	rootProj uint32 // project ID of the root itself; never handed out

	// ordered is set when the root's filesystem journals metadata and
	// commits it in the order it was made (xfs, ext4 with a journal:
	// hostcalls.JournalsMetadata): see Copy.
	ordered bool

	mu sync.Mutex // serializes project ID allocation
}

// Stats is the capacity of a filesystem as statfs(2) reports it, in bytes
// and inodes.
type Stats struct {
	TotalBytes  int64
	FreeBytes   int64 // free for root
	AvailBytes  int64 // free for unprivileged users
	TotalInodes int64
	FreeInodes  int64
}

// dirMode is the mode of a new volume directory, set exactly (not through
// the umask). The CO's fsGroup handling widens group access when wanted.
const dirMode = 0o755

// resolve confines every lookup: below the starting descriptor, no symlink
// in any component, no mount crossing, no /proc magic links.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS |
	unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_MAGICLINKS

// Open opens the pool rooted at root, an absolute path to an existing
// directory, probes whether it supports project quotas, and removes the
// temporaries of copies whose process died (see Sweep).
func Open(root string) (*Pool, error) {
	if root == "" || !filepath.IsAbs(root) || strings.IndexByte(root, 0) >= 0 {
		return nil, abi.Errorf(abi.InvalidArgument, "dirpool: root %q is not an absolute path", root)
	}
	root = filepath.Clean(root)
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, wrap("open pool", root, err)
	}
	p := &Pool{root: root, fd: fd}
	p.ordered = hostcalls.JournalsMetadata(fd)
	p.probeQuota()
	// Best effort: a temporary that cannot go now is tried again by the
	// next Open or Copy, and takes nothing but space meanwhile.
	_, _ = p.Sweep(context.Background())
	return p, nil
}

// Sweep removes the temporaries of copies whose process died (a daemon
// killed during a copy) and returns how many it removed. A copy in
// progress, in this process or another, is left alone.
func (p *Pool) Sweep(ctx context.Context) (int, error) {
	n, err := scratch.Sweep(ctx, p.fd, func(dir int, name string) error {
		return removeTree(ctx, dir, name)
	})
	if err != nil {
		return n, wrap("sweep", scratch.Dir, err)
	}
	return n, nil
}

// Close releases the pool's descriptor.
func (p *Pool) Close() error {
	if p.fd < 0 {
		return nil
	}
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}

// Root returns the pool's root path.
func (p *Pool) Root() string { return p.root }

// Path returns the absolute path of the volume name, without touching it.
func (p *Pool) Path(name string) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	return filepath.Join(p.root, name), nil
}

// ValidName returns an InvalidArgument error unless name is one path
// component that stays inside the pool: not empty, not starting with "."
// (which rules out "." and ".." and keeps the pool's scratch folder out of
// reach), no "/" or NUL, at most 255 bytes.
func ValidName(name string) error {
	switch {
	case name == "", name[0] == '.':
		return abi.Errorf(abi.InvalidArgument, "dirpool: invalid name %q (empty, or starts with a dot)", name)
	case strings.ContainsAny(name, "/\x00"):
		return abi.Errorf(abi.InvalidArgument, "dirpool: name %q must be a single path component", name)
	case len(name) > 255:
		return abi.Errorf(abi.InvalidArgument, "dirpool: name %.32q... is longer than 255 bytes", name)
	}
	return nil
}

// Create makes the directory name in the pool and returns its path. An
// existing directory is fine (the call is idempotent); an existing entry of
// another kind is AlreadyExists. A quotaBytes above zero also sets a project
// quota (see SetQuota) and fails with FailedPrecondition before creating
// anything when the pool has no quota support.
func (p *Pool) Create(ctx context.Context, name string, quotaBytes int64) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	if quotaBytes < 0 {
		return "", abi.Errorf(abi.InvalidArgument, "dirpool: create %q: negative quota %d", name, quotaBytes)
	}
	if quotaBytes > 0 && p.quota == quotaNone {
		return "", p.unsupported("create " + quoteName(name))
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	created := false
	err := unix.Mkdirat(p.fd, name, dirMode)
	switch {
	case err == nil:
		created = true
	case errors.Is(err, unix.EEXIST):
	default:
		return "", wrap("create", name, err)
	}
	fd, err := p.openVolume(name)
	if err != nil {
		if !created && (errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)) {
			return "", abi.Errorf(abi.AlreadyExists, "dirpool: create %q: exists and is not a directory", name)
		}
		return "", wrap("create", name, err)
	}
	defer unix.Close(fd)
	if created {
		// Mkdirat applied the umask; the mode is part of the contract.
		if err := unix.Fchmod(fd, dirMode); err != nil {
			p.removeQuietly(name)
			return "", wrap("create", name, err)
		}
	}
	// A repeat syncs (or, with hostcalls.DirSyncs, records) the root too:
	// the earlier call's mkdir may have been cut off before its sync, or
	// still wait for its batch.
	if err := hostcalls.SyncDir(ctx, p.fd, p.root); err != nil {
		if created {
			p.removeQuietly(name)
		}
		return "", wrap("create", name, err)
	}
	if quotaBytes > 0 {
		if err := p.setQuota(ctx, name, fd, quotaBytes); err != nil {
			if created {
				p.removeQuietly(name)
			}
			return "", err
		}
	}
	return filepath.Join(p.root, name), nil
}

// Exists reports whether name is a directory in the pool. Invalid names,
// symlinks and other kinds of entries are not.
func (p *Pool) Exists(ctx context.Context, name string) bool {
	if ValidName(name) != nil || ctx.Err() != nil {
		return false
	}
	fd, err := openBeneath(p.fd, name, unix.O_PATH, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// Remove deletes name and everything below it. A missing name is not an
// error. A symlink or file planted as name is unlinked, never followed.
// Remove refuses to descend into a mount point inside the volume
// (FailedPrecondition), so a volume that is still bind-mounted somewhere in
// its own tree cannot take foreign data with it. The project quota limit of
// the directory, if any, is cleared so the ID can be reused.
func (p *Pool) Remove(ctx context.Context, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	var st unix.Stat_t
	err := unix.Fstatat(p.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		// The root is synced (or recorded) all the same: an earlier
		// call's rmdir may have been cut off before its sync, or still
		// wait for its batch.
		return hostcalls.SyncDir(ctx, p.fd, p.root)
	}
	if err != nil {
		return wrap("remove", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(p.fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return wrap("remove", name, err)
		}
		return hostcalls.SyncDir(ctx, p.fd, p.root)
	}
	proj, hasProj := p.ownProject(name)
	if err := removeTree(ctx, p.fd, name); err != nil {
		return wrap("remove", name, err)
	}
	if err := hostcalls.SyncDir(ctx, p.fd, p.root); err != nil {
		return wrap("remove", name, err)
	}
	if hasProj {
		if err := p.releaseProject(proj); err != nil {
			return wrap("remove", name, err)
		}
	}
	return nil
}

// Statfs returns the capacity of the filesystem holding the pool.
func (p *Pool) Statfs(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	return fstatfs(p.fd, p.root)
}

// VolumeStatfs returns statfs(2) of the directory name. With a project
// quota on it, xfs and ext4 report the quota as the size and the quota's
// headroom as free space, which is what a volume's user should see.
func (p *Pool) VolumeStatfs(ctx context.Context, name string) (Stats, error) {
	if err := ValidName(name); err != nil {
		return Stats{}, err
	}
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	fd, err := p.openVolume(name)
	if err != nil {
		return Stats{}, wrap("statfs", name, err)
	}
	defer unix.Close(fd)
	return fstatfs(fd, name)
}

func fstatfs(fd int, what string) (Stats, error) {
	var s unix.Statfs_t
	if err := unix.Fstatfs(fd, &s); err != nil {
		return Stats{}, wrap("statfs", what, err)
	}
	unit := s.Frsize
	if unit == 0 {
		unit = s.Bsize
	}
	return Stats{
		TotalBytes:  int64(s.Blocks) * unit,
		FreeBytes:   int64(s.Bfree) * unit,
		AvailBytes:  int64(s.Bavail) * unit,
		TotalInodes: int64(s.Files),
		FreeInodes:  int64(s.Ffree),
	}, nil
}

// removeQuietly undoes a Create that failed half way.
func (p *Pool) removeQuietly(name string) {
	_ = removeTree(context.Background(), p.fd, name)
}

// openBeneath opens name relative to dirfd under the pool's resolve rules.
// openat2 may answer EAGAIN when a rename races the lookup; it is retried.
func openBeneath(dirfd int, name string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Mode:    uint64(mode),
		Resolve: resolve,
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < 16 {
			continue
		}
		return fd, err
	}
}

// openVolume opens the directory name of the pool for reading. A symlink
// in its place is reported as ELOOP (not the ENOTDIR openat2 gives when
// O_DIRECTORY meets a symlink), so callers see "is a symlink".
func (p *Pool) openVolume(name string) (int, error) {
	fd, err := openBeneath(p.fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(p.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			err = unix.ELOOP
		}
	}
	return fd, err
}

// wrap turns a system error into an *abi.Error with the category a caller
// can act on and a message with the operation and the name.
func wrap(op, name string, err error) error {
	var ae *abi.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("dirpool: %s %q: %w", op, name, err)
	}
	code := abi.Internal
	msg := err.Error()
	var errno unix.Errno
	switch {
	case errors.Is(err, context.Canceled):
		code = abi.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = abi.DeadlineExceeded
	case errors.As(err, &errno):
		switch errno {
		case unix.ENOENT:
			code = abi.NotFound
		case unix.EEXIST:
			code = abi.AlreadyExists
		case unix.EXDEV:
			code, msg = abi.PermissionDenied, msg+" (path leaves the pool or crosses a mount point)"
		case unix.ELOOP:
			code, msg = abi.PermissionDenied, msg+" (path is or passes a symlink)"
		case unix.EACCES, unix.EPERM:
			code = abi.PermissionDenied
		case unix.ENOSPC, unix.EDQUOT, unix.EMFILE, unix.ENFILE:
			code = abi.ResourceExhausted
		case unix.ENOTDIR, unix.EBUSY, unix.ENOTEMPTY, unix.EROFS:
			code = abi.FailedPrecondition
		case unix.ENAMETOOLONG, unix.EINVAL:
			code = abi.InvalidArgument
		}
	}
	return abi.Errorf(code, "dirpool: %s %q: %s", op, name, msg)
}

func quoteName(s string) string { return fmt.Sprintf("%q", s) }
