package mount

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Entry describes the mount on top of a mount point, in the terms of
// /proc/self/mountinfo.
type Entry struct {
	// Target is the mount point, with symlinks resolved.
	Target string
	// Source is what was mounted as the kernel shows it: the device for
	// block filesystems (also for bind mounts, whose Root then says which
	// directory of it), or a name like "tmpfs".
	Source string
	// Root is the path inside the source filesystem that is mounted at
	// Target: "/" for a whole filesystem, the source directory or file for
	// a bind mount.
	Root string
	// FSType is the filesystem type, e.g. "xfs".
	FSType string
	// Options are the per-mount options ("ro", "nosuid", "relatime", ...),
	// SuperOptions those of the filesystem ("nouuid", "prjquota", ...).
	Options, SuperOptions []string
	// ReadOnly reports whether the mount itself is read-only.
	ReadOnly bool
	// Major and Minor are the device number of the filesystem.
	Major, Minor int
}

// IsMountPoint reports whether target is a mount point, bind mounts of
// files and directories included. A target that does not exist is not.
func IsMountPoint(target string) (bool, error) {
	if err := checkPath("target", target); err != nil {
		return false, err
	}
	mounted, err := mountinfo.Mounted(target)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fail("check mount point", target, err)
	}
	return mounted, nil
}

// Info describes the mount on top of target, following symlinks. A target
// that is not a mount point is NotFound. It asks the kernel about that one
// mount (statmount) where it can, and reads the whole mount table
// (/proc/self/mountinfo) on kernels older than Linux 6.15.
func Info(target string) (Entry, error) {
	if err := checkPath("target", target); err != nil {
		return Entry{}, err
	}
	if statmountWorks() {
		return infoStatmount(target)
	}
	return infoMountinfo(target)
}

// infoMountinfo is Info from /proc/self/mountinfo.
func infoMountinfo(target string) (Entry, error) {
	real, err := filepath.EvalSymlinks(target)
	if err != nil {
		return Entry{}, fail("mount info of", target, err)
	}
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != real, false
	})
	if err != nil {
		return Entry{}, fail("mount info of", target, err)
	}
	if len(mounts) == 0 {
		return Entry{}, notMountPoint(target)
	}
	// mountinfo lists mounts in the order they were made: the last one at a
	// mount point is on top.
	return entryOf(mounts[len(mounts)-1]), nil
}

// entryOf is the Entry of a mountinfo line.
func entryOf(m *mountinfo.Info) Entry {
	opts := splitOptions(m.Options)
	return Entry{
		Target:       m.Mountpoint,
		Source:       m.Source,
		Root:         m.Root,
		FSType:       m.FSType,
		Options:      opts,
		SuperOptions: splitOptions(m.VFSOptions),
		ReadOnly:     slices.Contains(opts, "ro"),
		Major:        m.Major,
		Minor:        m.Minor,
	}
}

// IsBlockBindMount reports whether target is a mount point with a block
// device node bound on it: a published raw block volume.
func IsBlockBindMount(target string) (bool, error) {
	mounted, err := IsMountPoint(target)
	if err != nil || !mounted {
		return false, err
	}
	return isBlockDevice(target)
}

// isBlockDevice reports whether target, followed through symlinks, is a
// block device node.
func isBlockDevice(target string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		return false, fail("stat", target, err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFBLK, nil
}

// splitOptions splits a comma-separated option list as mountinfo and
// statmount give it.
func splitOptions(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
