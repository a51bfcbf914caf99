package dirpool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/scratch"
)

// Copy copies the directory src of the pool to a new directory dst of the
// pool: the clone or snapshot of a volume. It keeps file contents (reflinked
// where the filesystem can, holes kept otherwise), modes, timestamps,
// extended attributes the target filesystem accepts, hard links, symlinks as
// symlinks (never followed), FIFOs and device nodes, and ownership when run
// as root. dst must not exist (AlreadyExists). A mount point inside src
// fails the copy (FailedPrecondition) rather than copying another
// filesystem.
//
// dst never names a partial copy: the copy is built under a temporary name
// in the pool's scratch folder and renamed to dst (renameat2 with
// RENAME_NOREPLACE, so nothing is ever replaced) only once it is complete
// and durable. On any error, cancellation included, the temporary is
// removed; one left by a process that died is removed by the next Open or
// Copy, whose own copy then starts from scratch.
//
// Durability costs one fsync of the pool root where the filesystem is ext4
// or xfs: their journal commits metadata in the order it was made, so once
// every copied file's data has been written back (started file by file as
// the copy goes, and waited for a window of files behind), syncing the root
// after the rename makes the whole tree durable with its name. Elsewhere a
// syncfs(2) of the pool's filesystem precedes the rename.
//
// Project IDs are not copied: the copy is charged to the pool root's
// project until SetQuota gives it one of its own.
func (p *Pool) Copy(ctx context.Context, src, dst string) error {
	if err := ValidName(src); err != nil {
		return err
	}
	if err := ValidName(dst); err != nil {
		return err
	}
	if src == dst {
		return abi.Errorf(abi.InvalidArgument, "dirpool: copy %q onto itself", src)
	}
	if err := ctx.Err(); err != nil {
		return wrap("copy", src, err)
	}
	sfd, err := p.openVolume(src)
	if err != nil {
		return wrap("copy", src, err)
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return wrap("copy", src, err)
	}
	// Fail before copying gigabytes; the rename at the end still decides.
	var dstSt unix.Stat_t
	switch err := unix.Fstatat(p.fd, dst, &dstSt, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		return wrap("copy", src, fmt.Errorf("to %q: %w", dst, unix.EEXIST))
	case !errors.Is(err, unix.ENOENT):
		return wrap("copy", src, fmt.Errorf("to %q: %w", dst, err))
	}
	// A copy a dead process left behind goes first: its space is this
	// copy's to use. Failing that is no reason to fail this copy.
	_, _ = p.Sweep(ctx)
	tmp, err := scratch.Create(p.fd, func(dir int, name string) (int, error) {
		if err := unix.Mkdirat(dir, name, 0o700); err != nil {
			return -1, err
		}
		return openBeneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	})
	if err != nil {
		return wrap("copy", src, err)
	}
	defer tmp.Close() // after the removal below: the lock keeps sweeps away
	err = p.copyInto(ctx, sfd, tmp, &st)
	if err == nil {
		err = p.rename(tmp, dst)
	}
	if err != nil {
		if rerr := removeTree(context.Background(), tmp.Dir, tmp.Name); rerr != nil {
			err = fmt.Errorf("%w (and removing the partial copy: %v)", err, rerr)
		}
		return wrap("copy", src, fmt.Errorf("to %q: %w", dst, err))
	}
	return nil
}

// copyInto fills the temporary directory tmp with a copy of the directory
// open at sfd and makes it durable.
func (p *Pool) copyInto(ctx context.Context, sfd int, tmp *scratch.Temp, st *unix.Stat_t) error {
	c := copier{ctx: ctx, dev: st.Dev, dstRoot: tmp.FD, asRoot: os.Geteuid() == 0, ordered: p.ordered}
	defer c.abandon()
	if err := c.dir(sfd, tmp.FD, ""); err != nil {
		return err
	}
	if err := c.attrs(sfd, tmp.FD, st); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(tmp.Dir, tmp.Name, times(st), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimens: %w", err)
	}
	if p.ordered {
		return c.drain()
	}
	if err := unix.Syncfs(tmp.FD); err != nil {
		return fmt.Errorf("syncfs: %w", err)
	}
	return nil
}

// rename gives the complete copy tmp its name dst, never replacing an
// entry dst (EEXIST), and makes the name durable.
func (p *Pool) rename(tmp *scratch.Temp, dst string) error {
	err := unix.Renameat2(tmp.Dir, tmp.Name, p.fd, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// No RENAME_NOREPLACE here. A plain rename could replace an empty
		// directory dst, so look first; callers serialize calls on one name.
		var st unix.Stat_t
		if err = unix.Fstatat(p.fd, dst, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			err = unix.EEXIST
		} else if errors.Is(err, unix.ENOENT) {
			err = unix.Renameat(tmp.Dir, tmp.Name, p.fd, dst)
		}
	}
	if err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	if !p.ordered {
		// Without an ordered journal the two folders reach the disk on
		// their own. The one the copy left goes first: a crash between
		// the syncs then loses the copy, which the retry makes again,
		// instead of leaving it under two names, one of them swept.
		if err := unix.Fsync(tmp.Dir); err != nil {
			return fmt.Errorf("fsync %s: %w", scratch.Dir, err)
		}
	}
	if err := unix.Fsync(p.fd); err != nil {
		return fmt.Errorf("fsync pool: %w", err)
	}
	return nil
}

type copier struct {
	ctx     context.Context
	dev     uint64 // the source filesystem; anything else is a mount
	dstRoot int
	asRoot  bool
	links   map[[2]uint64]string // source (dev, ino) -> first copy, relative to dstRoot

	// ordered: make files durable by write-back (see Copy); pending are
	// the open files whose write-back started and was not yet waited for.
	ordered bool
	pending []int
}

// inFlight bounds the files whose write-back a copy has started and not
// yet waited for: enough to keep the disk busy, few enough descriptors.
const inFlight = 64

// written takes over the copied file open at fd, dirty when the copy wrote
// its data through the page cache. Where syncfs ends the copy, or nothing
// needs writing, the file is closed. Otherwise its write-back starts now,
// and the oldest file in flight is waited for once inFlight are.
func (c *copier) written(fd int, dirty bool) error {
	if !c.ordered || !dirty {
		return unix.Close(fd)
	}
	if err := unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE); err != nil {
		unix.Close(fd)
		return fmt.Errorf("sync_file_range: %w", err)
	}
	c.pending = append(c.pending, fd)
	if len(c.pending) < inFlight {
		return nil
	}
	fd = c.pending[0]
	c.pending = c.pending[1:]
	return writeBack(fd)
}

// drain waits for the write-back of every file still in flight.
func (c *copier) drain() error {
	var first error
	for _, fd := range c.pending {
		if err := writeBack(fd); err != nil && first == nil {
			first = err
		}
	}
	c.pending = nil
	return first
}

// abandon closes the files still in flight after a failed copy.
func (c *copier) abandon() {
	for _, fd := range c.pending {
		unix.Close(fd)
	}
	c.pending = nil
}

// writeBack writes the dirty pages of the file open at fd, waits until
// they are on the device, and closes it. That is fsync without the
// journal commit, which the pool root's fsync makes once for the copy.
func writeBack(fd int) error {
	err := unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write back: %w", err)
	}
	return nil
}

// dir copies the entries of the directory sfd into dfd; rel is dfd's path
// relative to dstRoot.
func (c *copier) dir(sfd, dfd int, rel string) error {
	return eachName(c.ctx, sfd, func(name string) error {
		var st unix.Stat_t
		if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", name, err)
		}
		if st.Dev != c.dev {
			return fmt.Errorf("%s: is a mount point: %w", join(rel, name), unix.EBUSY)
		}
		var err error
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			err = c.subdir(sfd, dfd, name, rel, &st)
		case unix.S_IFREG:
			err = c.file(sfd, dfd, name, rel, &st)
		case unix.S_IFLNK:
			err = c.symlink(sfd, dfd, name, &st)
		default:
			err = c.node(dfd, name, &st)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", join(rel, name), err)
		}
		if err := unix.UtimesNanoAt(dfd, name, times(&st), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: utimens: %w", join(rel, name), err)
		}
		return nil
	})
}

func (c *copier) subdir(sfd, dfd int, name, rel string, st *unix.Stat_t) error {
	if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	s, err := openBeneath(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("is a mount point: %w", unix.EBUSY)
	}
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer unix.Close(s)
	d, err := openBeneath(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("open copy: %w", err)
	}
	defer unix.Close(d)
	if err := c.dir(s, d, join(rel, name)); err != nil {
		return err
	}
	// Attributes last: a read-only mode must not stop the children.
	return c.attrs(s, d, st)
}

func (c *copier) file(sfd, dfd int, name, rel string, st *unix.Stat_t) error {
	key := [2]uint64{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := c.links[key]; ok {
			if err := unix.Linkat(c.dstRoot, first, dfd, name, 0); err != nil {
				return fmt.Errorf("link to %s: %w", first, err)
			}
			return nil
		}
	}
	in, err := openBeneath(sfd, name, unix.O_RDONLY|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("is a mount point: %w", unix.EBUSY)
	}
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer unix.Close(in)
	out, err := openBeneath(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOCTTY, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	dirty, err := copyData(c.ctx, in, out, st.Size)
	if err == nil {
		err = c.attrs(in, out, st)
	}
	if err != nil {
		unix.Close(out)
		return err
	}
	if st.Nlink > 1 {
		if c.links == nil {
			c.links = make(map[[2]uint64]string)
		}
		c.links[key] = join(rel, name)
	}
	return c.written(out, dirty)
}

func (c *copier) symlink(sfd, dfd int, name string, st *unix.Stat_t) error {
	buf := make([]byte, st.Size+1)
	for {
		n, err := unix.Readlinkat(sfd, name, buf)
		if err != nil {
			return fmt.Errorf("readlink: %w", err)
		}
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf)) // the link changed meanwhile
	}
	if err := unix.Symlinkat(string(buf), dfd, name); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if c.asRoot {
		if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("lchown: %w", err)
		}
	}
	return nil
}

// node recreates a FIFO, socket or device node. Device nodes need root.
func (c *copier) node(dfd int, name string, st *unix.Stat_t) error {
	if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
		return fmt.Errorf("mknod: %w", err)
	}
	if c.asRoot {
		if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// attrs copies ownership (as root), extended attributes and mode from the
// open source to the open copy, in the order that keeps them: chown clears
// set-ID bits and file capabilities, so it comes first.
func (c *copier) attrs(in, out int, st *unix.Stat_t) error {
	if c.asRoot {
		if err := unix.Fchown(out, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := copyXattrs(in, out); err != nil {
		return err
	}
	if err := unix.Fchmod(out, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// copyXattrs copies the extended attributes (ACLs included) of in to out.
// Namespaces the target refuses (ENOTSUP, or EPERM for trusted.* without
// privilege) are skipped: they cannot be kept on that filesystem at all.
func copyXattrs(in, out int) error {
	size, err := unix.Flistxattr(in, nil)
	if errors.Is(err, unix.ENOTSUP) || size == 0 {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listxattr: %w", err)
	}
	list := make([]byte, size)
	if size, err = unix.Flistxattr(in, list); err != nil {
		return fmt.Errorf("listxattr: %w", err)
	}
	for _, attr := range bytes.Split(list[:size], []byte{0}) {
		if len(attr) == 0 {
			continue
		}
		name := string(attr)
		n, err := unix.Fgetxattr(in, name, nil)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return fmt.Errorf("getxattr %s: %w", name, err)
		}
		val := make([]byte, n)
		if n, err = unix.Fgetxattr(in, name, val); err != nil {
			return fmt.Errorf("getxattr %s: %w", name, err)
		}
		err = unix.Fsetxattr(out, name, val[:n], 0)
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
			continue
		}
		if err != nil {
			return fmt.Errorf("setxattr %s: %w", name, err)
		}
	}
	return nil
}

// copyData copies size bytes from in to out: a reflink (FICLONE) where the
// filesystem shares extents, else the data extents one by one with
// copy_file_range, leaving holes as holes. dirty says it wrote data.
func copyData(ctx context.Context, in, out int, size int64) (dirty bool, err error) {
	if size == 0 {
		return false, nil
	}
	if err := unix.IoctlFileClone(out, in); err == nil {
		return false, nil
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		hole := size
		if err != nil {
			data = off // no SEEK_DATA: treat the rest as data
		} else if h, err := unix.Seek(in, data, unix.SEEK_HOLE); err == nil {
			hole = min(h, size)
		}
		if data >= hole {
			break
		}
		if err := copyRange(ctx, in, out, data, hole-data); err != nil {
			return true, err
		}
		off = hole
	}
	if err := unix.Ftruncate(out, size); err != nil {
		return true, fmt.Errorf("truncate: %w", err)
	}
	return true, nil
}

func copyRange(ctx context.Context, in, out int, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(n, 1<<30)), 0)
		switch {
		case err == nil && m == 0:
			return nil // the source shrank
		case err == nil:
			n -= int64(m)
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL),
			errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
			return copyByBuffer(ctx, in, out, roff, n)
		default:
			return fmt.Errorf("copy_file_range: %w", err)
		}
	}
	return nil
}

func copyByBuffer(ctx context.Context, in, out int, off, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := unix.Pread(in, buf[:min(n, int64(len(buf)))], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if r == 0 {
			return nil
		}
		for w := 0; w < r; {
			k, err := unix.Pwrite(out, buf[w:r], off+int64(w))
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return fmt.Errorf("write: %w", err)
			}
			w += k
		}
		off += int64(r)
		n -= int64(r)
	}
	return nil
}

func times(st *unix.Stat_t) []unix.Timespec {
	return []unix.Timespec{st.Atim, st.Mtim}
}

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}
