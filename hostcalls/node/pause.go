package node

import (
	"fmt"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
)

// WritePause returns what pauses the writes to the staged device dev of
// volume (mounted at stagingPath unless block): a device-mapper device
// itself, whose suspend flushes it and freezes a filesystem on it, or else
// the filesystem mounted from it. nil when neither can: a raw block
// device other than device-mapper.
func (n *Node) WritePause(dev, stagingPath string, block bool, volume string) (*quiesce.Target, error) {
	name, mapped, err := dm.DeviceName(dev)
	if err != nil {
		return nil, err
	}
	if mapped {
		return &quiesce.Target{Kind: quiesce.Mapped, Name: name, Volume: volume}, nil
	}
	if block {
		return nil, nil
	}
	st, err := fs.DeviceOf(stagingPath)
	if err != nil {
		return nil, err
	}
	return &quiesce.Target{Kind: quiesce.Filesystem, Path: stagingPath, Dev: st, Volume: volume}, nil
}

// FlushDevice writes out what the page cache holds of the block device
// dev and has the device flush its own cache. A workload that keeps the
// device open leaves its writes there (only the last close writes them
// out), where a copy or clone of what backs the device does not see them.
func (n *Node) FlushDevice(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return errf(codes.Internal, "%s is not a block device", dev)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("flush %s: %w", dev, err)
	}
	return nil
}

// SyncFilesystem writes out what the page cache holds of the filesystem
// mounted at path, its data and its metadata.
func (n *Node) SyncFilesystem(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync the filesystem at %s: %w", path, err)
	}
	return nil
}
