package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// GrowOffline grows the unmounted ext4 filesystem on device to fill the
// device, so that a kill at any point leaves a filesystem the next call
// can use. resize2fs rewrites group descriptors and the resize inode in
// place and is not atomic: killed half-way it leaves a filesystem that
// e2fsck's preen refuses ("Resize inode not valid"). So the file marker
// (on another filesystem, one per volume, the caller's to name) exists,
// durably, exactly while resize2fs runs; a call that finds it left behind
// knows the filesystem's trouble is its own unfinished resize and repairs
// it with a full e2fsck (-y: it recreates the resize inode and the group
// counts; growing within the reserved descriptor blocks, as a volume's
// growth does, moves no data), then grows again. A filesystem broken for
// any other reason is never repaired unasked: preen refuses it as before.
// (resize2fs's own undo file, -z, is no help: e2fsprogs 1.47.0 leaves a
// filesystem grown with it with an invalid resize inode.) The device must
// already have its new size.
func GrowOffline(ctx context.Context, device, marker string) error {
	if err := checkDevice(device); err != nil {
		return fmt.Errorf("grow %s: %w", device, err)
	}
	if err := os.MkdirAll(filepath.Dir(marker), 0o700); err != nil {
		return fmt.Errorf("grow ext4 %s offline: %w", device, err)
	}
	// The repair and the resize are not cut off by the call's deadline: a
	// resize killed half-way is what the marker is for, and a repair cut
	// off on a large filesystem would never finish on any retry. They get
	// a bound of their own instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resizeTimeout)
	defer cancel()
	if _, err := os.Stat(marker); err == nil {
		if err := repair(ctx, device); err != nil {
			return fmt.Errorf("grow ext4 %s offline: repair after a resize that was cut off: %w", device, err)
		}
	} else if err := preen(ctx, device); err != nil {
		return fmt.Errorf("grow ext4 %s offline: %w", device, err)
	}
	if err := createDurably(marker); err != nil {
		return fmt.Errorf("grow ext4 %s offline: %w", device, err)
	}
	if _, err := run(ctx, "resize2fs", device); err != nil {
		return fmt.Errorf("grow ext4 %s: %w", device, err)
	}
	if err := removeDurably(marker); err != nil {
		return fmt.Errorf("grow ext4 %s offline: %w", device, err)
	}
	return nil
}

// resizeTimeout bounds an offline repair and resize.
const resizeTimeout = 30 * time.Minute

// ClearResizeMark removes the marker of a resize that finished before its
// marker could go (a kill just after resize2fs): the filesystem is whole
// if preen passes. GrowOffline's caller calls it when the filesystem
// needs no growing, so that a later grow does not repair what is fine.
func ClearResizeMark(ctx context.Context, device, marker string) error {
	if _, err := os.Stat(marker); err != nil {
		return nil
	}
	if err := preen(ctx, device); err != nil {
		return fmt.Errorf("check ext4 %s after a resize: %w", device, err)
	}
	return removeDurably(marker)
}

// repair runs the forced check that fixes whatever it finds (exit status
// 1: fixed).
func repair(ctx context.Context, device string) error {
	_, err := run(ctx, "e2fsck", "-f", "-y", device)
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 {
		return nil
	}
	return err
}

// createDurably creates the empty file path (there already is fine) and
// syncs its folder.
func createDurably(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// removeDurably removes path (gone already is fine) and syncs its folder,
// so that a repair never runs for a resize that finished.
func removeDurably(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}
