package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// GrowOffline grows the unmounted ext4 filesystem on device to fill the
// device, so that a kill at any point leaves a filesystem the next call
// can use. resize2fs rewrites group descriptors and the resize inode in
// place and is not atomic: killed half-way it leaves a filesystem that
// e2fsck's preen refuses ("Resize inode not valid"). So it runs with the
// undo file undo (on another filesystem, one per volume: clones share
// their source's UUID, so the file is the caller's to name), removed once
// it finished; a call that finds it left behind first rolls the
// unfinished resize back with e2undo (which refuses an undo file that does
// not match the filesystem, one changed since), then checks and grows
// again. The device must already have its new size.
func GrowOffline(ctx context.Context, device, undo string) error {
	if err := checkDevice(device); err != nil {
		return fmt.Errorf("grow %s: %w", device, err)
	}
	if err := os.MkdirAll(filepath.Dir(undo), 0o700); err != nil {
		return fmt.Errorf("grow ext4 %s offline: %w", device, err)
	}
	if _, err := os.Stat(undo); err == nil {
		// A resize of this volume was cut off: undo what it wrote.
		// e2undo refuses a file that does not match the filesystem (the
		// resize had written nothing yet), which leaves it as it was.
		if _, uerr := run(ctx, "e2undo", undo, device); uerr != nil && ctx.Err() != nil {
			return fmt.Errorf("grow ext4 %s offline: roll back an unfinished resize: %w", device, uerr)
		}
		if err := removeDurably(undo); err != nil {
			return fmt.Errorf("grow ext4 %s offline: %w", device, err)
		}
	}
	if err := preen(ctx, device); err != nil {
		return fmt.Errorf("grow ext4 %s offline: %w", device, err)
	}
	if _, err := run(ctx, "resize2fs", "-z", undo, device); err != nil {
		return fmt.Errorf("grow ext4 %s: %w", device, err)
	}
	if err := removeDurably(undo); err != nil {
		return fmt.Errorf("grow ext4 %s offline: %w", device, err)
	}
	return nil
}

// removeDurably removes path (gone already is fine) and syncs its folder,
// so that a roll-back never runs for a resize that finished.
func removeDurably(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}
