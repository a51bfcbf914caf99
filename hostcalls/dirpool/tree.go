package dirpool

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Tree walks hold one descriptor per directory level and open every child
// with openBeneath relative to its parent, so a concurrent rename or a
// symlink swapped in by a workload cannot move the walk elsewhere.

// eachName calls fn for every entry of the directory open at fd, except "."
// and "..". It reads in batches, so fn may unlink the entries it is given.
func eachName(ctx context.Context, fd int, fn func(name string) error) error {
	buf := make([]byte, 8<<10)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("getdents: %w", err)
		}
		if n <= 0 {
			return nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(name); err != nil {
				return err
			}
		}
	}
}

// removeTree removes name (relative to parent) and everything below it.
// Entries that vanish meanwhile are fine. A directory that another writer
// refills while we empty it is emptied again, a bounded number of times.
func removeTree(ctx context.Context, parent int, name string) error {
	for attempt := 0; ; attempt++ {
		fd, err := openBeneath(parent, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		switch {
		case errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
			// Replaced by a file or symlink since the caller looked.
			return unlinkIfExists(parent, name, 0)
		case errors.Is(err, unix.EXDEV):
			return fmt.Errorf("%s is a mount point: %w", name, unix.EBUSY)
		case err != nil:
			return fmt.Errorf("open %s: %w", name, err)
		}
		err = emptyDir(ctx, fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		err = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
		if errors.Is(err, unix.ENOTEMPTY) && attempt < 8 {
			continue
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("rmdir %s: %w", name, err)
		}
		return nil
	}
}

func emptyDir(ctx context.Context, fd int) error {
	return eachName(ctx, fd, func(child string) error {
		var st unix.Stat_t
		err := unix.Fstatat(fd, child, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("stat %s: %w", child, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return removeTree(ctx, fd, child)
		}
		return unlinkIfExists(fd, child, 0)
	})
}

func unlinkIfExists(dirfd int, name string, flags int) error {
	err := unix.Unlinkat(dirfd, name, flags)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlink %s: %w", name, err)
	}
	return nil
}

// usageWalk adds up the allocated bytes (st_blocks, as du does) and the
// inodes of the tree at fd, counting hard-linked files once and skipping
// whatever is mounted inside it.
type usageWalk struct {
	dev    uint64
	bytes  int64
	inodes int64
	seen   map[[2]uint64]struct{}
}

func (w *usageWalk) add(st *unix.Stat_t) {
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		key := [2]uint64{st.Dev, st.Ino}
		if _, dup := w.seen[key]; dup {
			return
		}
		if w.seen == nil {
			w.seen = make(map[[2]uint64]struct{})
		}
		w.seen[key] = struct{}{}
	}
	w.bytes += st.Blocks * 512
	w.inodes++
}

func (w *usageWalk) dir(ctx context.Context, fd int) error {
	return eachName(ctx, fd, func(name string) error {
		var st unix.Stat_t
		err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("stat %s: %w", name, err)
		}
		if st.Dev != w.dev {
			return nil // a mount inside the volume is not the volume's usage
		}
		w.add(&st)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return nil
		}
		child, err := openBeneath(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EXDEV) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", name, err)
		}
		defer unix.Close(child)
		if err := w.dir(ctx, child); err != nil {
			return fmt.Errorf("%s/%w", name, err)
		}
		return nil
	})
}

// Usage returns the bytes and inodes the directory name uses. With project
// quotas on and a project ID of its own, the filesystem's accounting answers
// at once; otherwise the tree is walked (allocated blocks, hard links once,
// nothing below a mount point).
func (p *Pool) Usage(ctx context.Context, name string) (bytes, inodes int64, err error) {
	if err := ValidName(name); err != nil {
		return 0, 0, err
	}
	fd, err := p.openVolume(name)
	if err != nil {
		return 0, 0, wrap("usage", name, err)
	}
	defer unix.Close(fd)
	if p.quota != quotaNone {
		if proj, ok := p.projectOf(fd); ok {
			u, err := p.getQuota(proj)
			if err != nil {
				return 0, 0, wrap("usage", name, err)
			}
			return u.bytes, u.inodes, nil
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, wrap("usage", name, err)
	}
	w := usageWalk{dev: st.Dev}
	w.add(&st)
	if err := w.dir(ctx, fd); err != nil {
		return 0, 0, wrap("usage", name, err)
	}
	return w.bytes, w.inodes, nil
}
