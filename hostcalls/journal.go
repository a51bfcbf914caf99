package hostcalls

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
)

// JournalsMetadata reports whether the filesystem holding the open file fd
// journals its metadata, so that metadata changes reach the disk in the
// order they were made: xfs always does; ext4 only when it has a journal.
// The ext4 driver also mounts ext2 and ext4 made without has_journal,
// under the same magic number, and those write their metadata back in any
// order. Every other filesystem, and an ext4 whose journal the kernel does
// not show, answers false: the caller then syncs each file itself.
func JournalsMetadata(fd int) bool {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil {
		return false
	}
	switch sfs.Type {
	case unix.XFS_SUPER_MAGIC:
		return true
	case unix.EXT4_SUPER_MAGIC:
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			return false
		}
		return ext4Journaled(unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	return false
}

// ext4Journaled reads the ext4 filesystem's journal thread from sysfs,
// under the name of its block device: a process ID when it has a journal,
// "<none>" when it has none.
func ext4Journaled(major, minor uint32) bool {
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor))
	if err != nil {
		return false
	}
	v, err := sysattr.Read(filepath.Join("/sys/fs/ext4", filepath.Base(link), "journal_task"))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(v)
	return err == nil && pid > 0
}
