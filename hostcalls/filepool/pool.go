package filepool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/scratch"
)

const (
	// fileMode is the mode of every volume file: only the daemon reads
	// and writes volumes.
	fileMode = 0o600
	maxName  = 255
)

// Pool is an open pool root. Its methods may be called concurrently; two
// calls on the same name are serialised by the filesystem, not by Pool.
type Pool struct {
	root string
	dir  *os.File
	// noTmpfile is set once the root's filesystem refused O_TMPFILE.
	noTmpfile atomic.Bool
	// ordered is set when the root's filesystem makes metadata changes
	// durable in the order they were made (xfs, ext4 with a journal:
	// hostcalls.JournalsMetadata; see build).
	ordered bool
}

// Open opens the pool rooted at the existing folder root, an absolute path.
func Open(root string) (*Pool, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("open pool %s: %w", root, abi.Errorf(abi.InvalidArgument, "root is not absolute"))
	}
	root = filepath.Clean(root)
	dir, err := os.OpenFile(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open pool %s: %w", root, codeErr(err, err.Error()))
	}
	p := &Pool{root: root, dir: dir}
	p.ordered = hostcalls.JournalsMetadata(int(dir.Fd()))
	// Best effort: a temporary that cannot go now is tried again by the
	// next Open, and takes nothing but space meanwhile.
	_, _ = p.Sweep(context.Background())
	return p, nil
}

// Sweep removes the named temporaries (see tempFile) of builds whose
// process died and returns how many it removed. A build in progress, in
// this process or another, is left alone. Pools on filesystems with
// O_TMPFILE never have any: an unnamed file dies with its process.
func (p *Pool) Sweep(ctx context.Context) (int, error) {
	n, err := scratch.Sweep(ctx, p.dirFD(), func(dir int, name string) error {
		err := unix.Unlinkat(dir, name, 0)
		if errors.Is(err, unix.EISDIR) {
			err = unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
		}
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	})
	if err != nil {
		return n, fmt.Errorf("sweep %s: %w", p.root, err)
	}
	return n, nil
}

// Close releases the root descriptor.
func (p *Pool) Close() error { return p.dir.Close() }

// Root returns the pool's root folder.
func (p *Pool) Root() string { return p.root }

// Path returns the absolute path of the volume file name, for logs and for
// tools that take a path. Code that opens the file should use OpenFile,
// which cannot be redirected.
func (p *Pool) Path(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return p.root + "/" + name, nil
}

// OpenFile opens the volume file name for reading, and writing unless
// readOnly, confined to the pool. The caller closes the file.
func (p *Pool) OpenFile(ctx context.Context, name string, readOnly bool) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	flags := unix.O_RDWR
	if readOnly {
		flags = unix.O_RDONLY
	}
	f, err := p.openRegular(name, flags)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return f, nil
}

// Create makes the volume file name of size bytes: sparse (ftruncate), or
// with every block allocated when prealloc (fallocate), so that writes to it
// cannot fail for lack of space. If name exists with this size, Create does
// nothing; with another size, it fails with abi.AlreadyExists.
func (p *Pool) Create(ctx context.Context, name string, size int64, prealloc bool) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	if size <= 0 {
		return fmt.Errorf("create %s: %w", name, abi.Errorf(abi.InvalidArgument, "size must be positive"))
	}
	exists, err := p.exists(name, size)
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	if exists {
		return p.syncRoot(ctx, "create "+name)
	}
	err = p.build(ctx, name, true, func(tmp *os.File) error {
		if prealloc {
			return allocate(tmp, 0, size)
		}
		return tmp.Truncate(size)
	})
	if abi.CodeOf(err) == abi.AlreadyExists {
		// Someone created it meanwhile: answer as if they had been first.
		_, err = p.exists(name, size)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	return nil
}

// exists reports whether name is a regular file of size bytes. A name taken
// by anything else is abi.AlreadyExists.
func (p *Pool) exists(name string, size int64) (bool, error) {
	f, err := p.openRegular(name, unix.O_PATH)
	switch abi.CodeOf(err) {
	case abi.OK:
	case abi.NotFound:
		return false, nil
	case abi.InvalidArgument:
		return false, abi.Errorf(abi.AlreadyExists, "exists and is not a regular file")
	default:
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	if fi.Size() != size {
		return false, abi.Errorf(abi.AlreadyExists, "exists with size %d, not %d", fi.Size(), size)
	}
	return true, nil
}

// Resize grows the volume file name to size bytes. With prealloc, every
// block of the file is allocated afterwards, the old part's holes too (a
// sparse volume switched to preallocation, a clone's holes), so that no
// write to it can fail for lack of space; written data is never touched.
// The same size is then not a no-op but fills the holes. A smaller size is
// abi.InvalidArgument, because shrinking would cut a volume's data. The
// new size (and allocation) is durable before Resize returns: the file is
// synced, also when it already had the size.
func (p *Pool) Resize(ctx context.Context, name string, size int64, prealloc bool) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("resize %s: %w", name, err)
	}
	f, err := p.openRegular(name, unix.O_RDWR)
	if err != nil {
		return fmt.Errorf("resize %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("resize %s: %w", name, err)
	}
	cur := fi.Size()
	switch {
	case size < cur:
		return fmt.Errorf("resize %s: %w", name, abi.Errorf(abi.InvalidArgument, "cannot shrink from %d to %d bytes", cur, size))
	case prealloc:
		err = allocate(f, 0, size)
	case size > cur:
		err = f.Truncate(size)
	}
	// Also when the file already has the size: an earlier call cut off
	// between its truncate and its sync left the size in the page cache
	// only, and this answer tells the caller it is on disk. A file with
	// nothing unwritten costs no journal commit.
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return fmt.Errorf("resize %s: %w", name, err)
	}
	return nil
}

// Remove deletes the volume file name. A missing file is not an error.
func (p *Pool) Remove(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	// unlinkat never follows a symlink in its last (here: only) component.
	err := unix.Unlinkat(p.dirFD(), name, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return p.syncRoot(ctx, "remove "+name)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("remove %s: %w", name, abi.Errorf(abi.InvalidArgument, "not a file"))
	case err != nil:
		return fmt.Errorf("remove %s: %w", name, codeErr(err, err.Error()))
	}
	return p.syncRoot(ctx, "remove "+name)
}

// syncRoot makes a change to the root's entries durable, now or, when ctx
// carries hostcalls.DirSyncs, in its owner's batch. A call that found its
// change already made (the file there, or gone) syncs too: it may be the
// retry of a call cut off before its sync, and its answer says the change
// is on disk. A folder with nothing unwritten costs no journal commit.
func (p *Pool) syncRoot(ctx context.Context, what string) error {
	if err := hostcalls.SyncDir(ctx, p.dirFD(), p.root); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Stat returns the apparent size of the volume file name and the bytes the
// filesystem allocated to it (st_blocks × 512), which is less for a sparse
// file and may be shared with clones.
func (p *Pool) Stat(ctx context.Context, name string) (size, allocated int64, err error) {
	if err := checkName(name); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", name, err)
	}
	f, err := p.openRegular(name, unix.O_PATH)
	if err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", name, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", name, err)
	}
	return st.Size, st.Blocks * 512, nil
}

// Statfs returns the usage of the filesystem that holds the pool.
func (p *Pool) Statfs(ctx context.Context) (fs.Usage, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(p.dirFD(), &st); err != nil {
		return fs.Usage{}, fmt.Errorf("statfs %s: %w", p.root, err)
	}
	return fs.UsageOf(&st), nil
}

func (p *Pool) dirFD() int { return int(p.dir.Fd()) }

// openRegular opens name beneath the root and checks it is a regular file.
func (p *Pool) openRegular(name string, flags int) (*os.File, error) {
	f, err := p.openBeneath(name, flags, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, abi.Errorf(abi.InvalidArgument, "not a regular file")
	}
	return f, nil
}

// openBeneath opens path relative to the root without leaving it: no "..",
// no symlinks, no mount crossings.
func (p *Pool) openBeneath(path string, flags int, mode uint32) (*os.File, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	var fd int
	var err error
	for range 8 {
		fd, err = unix.Openat2(p.dirFD(), path, &how)
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			break // EAGAIN: a concurrent rename elsewhere; the kernel asks for a retry
		}
	}
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// openat2 filtered out (seccomp): one component with O_NOFOLLOW
		// cannot leave the root either.
		fd, err = unix.Openat(p.dirFD(), path, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, mode)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return nil, abi.Errorf(abi.PermissionDenied, "%q is a symlink or mount point", path)
		}
		return nil, codeErr(err, strconv.Quote(path)+": "+err.Error())
	}
	return os.NewFile(uintptr(fd), p.root+"/"+path), nil
}

// build makes a complete file and then gives it the name: fill writes the
// contents into an unnamed file in the root, which is synced, linked to name
// without replacing anything (abi.AlreadyExists if name exists) and made
// durable by syncing the root.
//
// metadataOnly says fill wrote no data, only a size or an allocation
// (ftruncate, fallocate). On xfs and on ext4 with a journal the file's own
// sync is then left out: their journal makes metadata changes durable in the order they were
// made, so the root's sync after the link also makes the earlier size
// change durable, and the name never reaches the disk without it. That
// saves one journal commit per volume created. Files with data, and other
// filesystems, are synced before they are linked.
func (p *Pool) build(ctx context.Context, name string, metadataOnly bool, fill func(tmp *os.File) error) error {
	tmp, err := p.tempFile()
	if err != nil {
		return fmt.Errorf("temporary file: %w", err)
	}
	defer tmp.close()
	if err := fill(tmp.f); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !metadataOnly || !p.ordered {
		if err := tmp.f.Sync(); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
	}
	if err := p.link(tmp, name); err != nil {
		return err
	}
	return p.syncRoot(ctx, "sync root")
}

// temp is a file being built: unnamed (O_TMPFILE), or where the filesystem
// has none a named temporary in the pool's scratch folder, locked while it
// is built (see hostcalls/internal/scratch).
type temp struct {
	f     *os.File
	named *scratch.Temp // nil for an unnamed file
}

// close removes the temporary's name (the file lives on under its final
// name if link gave it one) and releases the file, and with it the lock.
func (t *temp) close() {
	if t.named != nil {
		unix.Unlinkat(t.named.Dir, t.named.Name, 0)
	}
	t.f.Close()
	if t.named != nil {
		t.named.Close()
	}
}

// tempFile returns an unnamed O_TMPFILE in the root, or where the
// filesystem has none a new named file in the pool's scratch folder.
func (p *Pool) tempFile() (*temp, error) {
	if !p.noTmpfile.Load() {
		f, err := p.openBeneath(".", unix.O_RDWR|unix.O_TMPFILE, fileMode)
		if err == nil {
			return &temp{f: f}, nil
		}
		// EOPNOTSUPP: no O_TMPFILE in this filesystem; EISDIR (mapped to
		// InvalidArgument): none in this kernel.
		if !errors.Is(err, unix.EOPNOTSUPP) && abi.CodeOf(err) != abi.InvalidArgument {
			return nil, err
		}
		p.noTmpfile.Store(true)
	}
	named, err := scratch.Create(p.dirFD(), func(dir int, name string) (int, error) {
		return unix.Openat(dir, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, fileMode)
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(named.FD), p.root+"/"+scratch.Dir+"/"+named.Name)
	named.FD = -1 // f owns it now
	return &temp{f: f, named: named}, nil
}

// link gives tmp the name, failing with abi.AlreadyExists when it is taken.
func (p *Pool) link(tmp *temp, name string) error {
	var err error
	if tmp.named != nil {
		err = unix.Linkat(tmp.named.Dir, tmp.named.Name, p.dirFD(), name, 0)
	} else {
		// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc/self/fd does not.
		fd := int(tmp.f.Fd())
		err = unix.Linkat(fd, "", p.dirFD(), name, unix.AT_EMPTY_PATH)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOENT) {
			err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd),
				p.dirFD(), name, unix.AT_SYMLINK_FOLLOW)
		}
	}
	if errors.Is(err, unix.EEXIST) {
		return abi.Errorf(abi.AlreadyExists, "exists")
	}
	if err != nil {
		return fmt.Errorf("link: %w", err)
	}
	return nil
}

// allocate allocates [off, off+length) of f, extending it.
func allocate(f *os.File, off, length int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, off, length)
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EFBIG):
		return abi.Errorf(abi.ResourceExhausted, "preallocate %d bytes: %v", length, err)
	case errors.Is(err, unix.EOPNOTSUPP):
		return abi.Errorf(abi.FailedPrecondition, "the pool's filesystem cannot preallocate")
	case err != nil:
		return fmt.Errorf("fallocate: %w", err)
	}
	return nil
}

// checkName enforces the pool's naming rule (see the package comment).
func checkName(name string) error {
	switch {
	case name == "":
		return abi.Errorf(abi.InvalidArgument, "empty file name")
	case len(name) > maxName:
		return abi.Errorf(abi.InvalidArgument, "file name longer than %d bytes", maxName)
	case strings.ContainsAny(name, "/\x00"):
		return abi.Errorf(abi.InvalidArgument, "file name %q contains / or NUL", name)
	case name[0] == '.':
		return abi.Errorf(abi.InvalidArgument, "file name %q starts with a dot", name)
	}
	return nil
}

// codeErr gives an errno the abi code a caller can act on.
func codeErr(err error, msg string) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return &abi.Error{Code: abi.NotFound, Message: msg}
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return &abi.Error{Code: abi.PermissionDenied, Message: msg}
	case errors.Is(err, unix.EROFS):
		// The pool's filesystem, not the caller: remounted read-only, or
		// made so by the kernel after a write error (as dirpool says).
		return &abi.Error{Code: abi.FailedPrecondition, Message: msg}
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return &abi.Error{Code: abi.ResourceExhausted, Message: msg}
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR):
		return &abi.Error{Code: abi.InvalidArgument, Message: msg}
	}
	return err
}
