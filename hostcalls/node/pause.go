package node

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
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

// Flush writes out what the page cache holds of the staged device dev:
// for block access the device's own cache (a workload that keeps the
// device open leaves its writes there; only its last close writes them
// out), else the filesystem mounted from it at mountPath, data and
// metadata. A copy or clone of what backs the device then holds them. A
// device-mapper device is left alone: its backend's snapshot suspends it,
// which writes it out, and a suspended one would hold the flush until it
// is resumed. A flush the kernel cannot finish (a dead path) is abandoned
// when ctx ends.
func (n *Node) Flush(ctx context.Context, dev, mountPath string, block bool) error {
	if _, mapped, err := dm.DeviceName(dev); err != nil || mapped {
		return err
	}
	done := make(chan error, 1)
	go func() {
		if block {
			done <- flushDevice(dev)
		} else {
			done <- syncFilesystem(mountPath)
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		code := abi.DeadlineExceeded
		if errors.Is(ctx.Err(), context.Canceled) {
			code = abi.Canceled
		}
		return abi.Errorf(code, "write out %s: %v", dev, ctx.Err())
	}
}

// flushDevice fsyncs the block device dev.
func flushDevice(dev string) error {
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

// syncFilesystem syncfs the filesystem mounted at path.
func syncFilesystem(path string) error {
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
