package dm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The kernel names a device dm-N in devtmpfs; /dev/mapper/<name> is user
// space's job. We tell udev to leave that node alone (see udevCookie) and
// keep it ourselves, so it exists whether or not udev runs, the moment
// Create returns. A node udev made anyway (a symlink to ../dm-N) is
// accepted when it leads to the right device.

// makeNode makes m.Path(name) a block node for dev unless it already leads
// to dev.
func (m *Mapper) makeNode(name string, dev uint64) error {
	if dev == 0 {
		return fmt.Errorf("dm node %s: the kernel reported no device number", name)
	}
	path := m.Path(name)
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return fmt.Errorf("dm node %s: %w", name, err)
	}
	for attempt := 0; ; attempt++ {
		var st unix.Stat_t
		err := unix.Stat(path, &st) // follows a udev symlink
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == dev {
			return nil
		}
		switch {
		case err == nil, errors.Is(err, unix.ENOENT) && isDanglingLink(path):
			// A stale node of an earlier device with this name, or junk.
			if uerr := unix.Unlink(path); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
				return fmt.Errorf("dm node %s: remove stale %s: %w", name, path, uerr)
			}
		case !errors.Is(err, unix.ENOENT):
			return fmt.Errorf("dm node %s: %w", name, err)
		}
		err = unix.Mknod(path, unix.S_IFBLK|0o600, int(dev))
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EEXIST) || attempt >= 2 {
			return fmt.Errorf("dm node %s: mknod %s: %w", name, path, err)
		}
		// udev raced us to it; look again.
	}
}

// removeNode removes m.Path(name) when it is a block node or a symlink (ours
// or udev's); anything else there is not ours to remove.
func (m *Mapper) removeNode(name string) error {
	path := m.Path(name)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("dm node %s: %w", name, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK, unix.S_IFLNK:
		if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("dm node %s: remove %s: %w", name, path, err)
		}
	}
	return nil
}

func isDanglingLink(path string) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}
