package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
)

// The generic node steps every backend shares. They are idempotent: each
// checks what is already there before it acts, so a repeat after a crash or
// restart converges instead of stacking mounts.

// FormatAndMount puts a filesystem on a blank device (never on one that
// holds any signature) and mounts it at target. A filesystem smaller than
// its device (a restore or clone into a larger volume) is grown first, see
// growToDevice.
func (n *Node) FormatAndMount(ctx context.Context, dev, target, fstype string, flags []string, readOnly bool) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("create staging path %s: %w", target, err)
	}
	// One read of the device tells what it holds and its size; the
	// device stays open until the mount, which then finds its superblock
	// in memory.
	in, err := fs.Inspect(ctx, dev)
	if err != nil {
		return fmt.Errorf("probe %s: %w", dev, err)
	}
	defer in.Close()
	found := in.Type
	switch {
	case found == "" && readOnly:
		return errf(codes.FailedPrecondition, "device %s is blank and the volume is read-only: nothing to mount", dev)
	case found == "":
		if fstype == "" {
			fstype = "ext4"
		}
		in.Close() // mkfs wants the device to itself
		if err := fs.Make(ctx, dev, fstype, fs.MakeOptions{}); err != nil {
			return fmt.Errorf("make %s on %s: %w", fstype, dev, err)
		}
	case fstype != "" && found != fstype:
		return errf(codes.FailedPrecondition, "device %s holds %s, not the requested %s: refusing to format it", dev, found, fstype)
	default:
		fstype = found
	}
	growMounted := false
	if found != "" && !readOnly && !slices.Contains(flags, "ro") {
		if growMounted, err = n.growToDevice(ctx, in, dev, target, fstype); err != nil {
			return err
		}
	}
	if readOnly && !slices.Contains(flags, "ro") {
		flags = append(slices.Clone(flags), "ro")
	}
	if fstype == "xfs" && !slices.Contains(flags, "nouuid") {
		// Clones and restored snapshots share their origin's UUID; XFS
		// refuses a second mount of one UUID without nouuid.
		flags = append(slices.Clone(flags), "nouuid")
	}
	_, err = mount.Mount(ctx, dev, target, fstype, flags)
	in.Close()
	if err != nil || !growMounted {
		return err
	}
	if err := fs.Grow(ctx, dev, target, fstype); err != nil {
		if _, uerr := mount.Unmount(ctx, target); uerr != nil {
			n.log.Warn("unmount after failed grow", "path", target, "err", uerr)
		}
		return fmt.Errorf("grow %s on %s to its device: %w", fstype, dev, err)
	}
	return nil
}

// growToDevice grows the filesystem on an unmounted device when the device
// is larger than it (by what the filesystem's own tool would add, at least
// 1 MiB): a volume restored from a snapshot or cloned into a larger size
// holds the source's filesystem. ext4 grows here, offline (a forced check,
// then resize2fs), which needs no CAP_SYS_RESOURCE, unlike online growth;
// xfs and btrfs grow only mounted, so mounted reports that the caller must
// grow after mounting. in is the device's inspection; an offline grow
// closes it, as the tools want the device to themselves.
func (n *Node) growToDevice(ctx context.Context, in *fs.Inspection, dev, target, fstype string) (mounted bool, err error) {
	size := in.Size
	if !in.SizeOK || size.Type != fstype || !size.Growable() {
		if n.resizeDir != "" && fstype == fs.Ext4 && fileExists(n.resizeMarker(target)) {
			// A resize that finished just before a kill left its marker.
			in.Close()
			if err := fs.ClearResizeMark(ctx, dev, n.resizeMarker(target)); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	n.log.Info("growing filesystem to its device", "device", dev, "fstype", fstype, "bytes", size.Bytes, "device_bytes", size.DeviceBytes)
	if fstype != fs.Ext4 {
		return true, nil
	}
	in.Close()
	if err := n.growOffline(ctx, dev, target); err != nil {
		return false, fmt.Errorf("grow %s on %s to its device: %w", fstype, dev, err)
	}
	return false, nil
}

// Bind bind-mounts src at target; file is true for a block device node.
func (n *Node) Bind(ctx context.Context, src, target string, readOnly, file bool) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return fmt.Errorf("create parent of %s: %w", target, err)
	}
	_, err := mount.Bind(ctx, src, target, readOnly)
	return err
}

// BindDirectory bind-mounts dir, a directory ConfineDirectory accepted, at
// target. dir is opened beneath its root (mount.OpenBeneath) and mounted
// by that descriptor: a symlink swapped into its path since the check (a
// workload that controls a folder on the way) cannot lead the mount out
// of the roots.
func (n *Node) BindDirectory(ctx context.Context, who string, roots []string, dir, target string, readOnly bool) error {
	src, err := mount.OpenBeneath(roots, dir)
	if err != nil {
		if abi.CodeOf(err) == abi.PermissionDenied {
			return errf(codes.Internal, "%s directory %q resolves outside its roots: %v", who, dir, err)
		}
		return err
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return fmt.Errorf("create parent of %s: %w", target, err)
	}
	_, err = mount.BindFrom(ctx, src, target, readOnly)
	return err
}

// ReadOnlyDevice returns a read-only loop device over dev, attaching one
// when there is none yet: the device a read-only block publication binds.
// Every read-only publication of a volume shares it (AttachDevice finds
// the one already over dev). Direct I/O keeps the data out of a second
// page cache; reads stay coherent with writes through dev, whose cached
// pages a direct read flushes first.
func (n *Node) ReadOnlyDevice(ctx context.Context, dev string) (string, error) {
	d, err := loop.AttachDevice(ctx, dev, loop.Options{ReadOnly: true, DirectIO: true})
	if err != nil {
		return "", fmt.Errorf("read-only device over %s: %w", dev, err)
	}
	return d.Path, nil
}

// readOnlyOver returns the read-only loop device over dev, if any; it
// tries the recorded device first (one device to read, where a search
// walks every loop device when this process has not seen it yet).
func (n *Node) readOnlyOver(ctx context.Context, dev, recorded string) (loop.Device, bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); errors.Is(err, unix.ENOENT) {
		return loop.Device{}, false, nil // the device is gone, and with it anything over it
	} else if err != nil {
		return loop.Device{}, false, fmt.Errorf("device %s: %w", dev, err)
	}
	if recorded != "" {
		if d, bound, err := loop.Status(ctx, recorded); err == nil && bound && d.ReadOnly && d.Dev == st.Dev && d.Inode == st.Ino {
			return d, true, nil
		}
	}
	d, ok, err := loop.Find(ctx, dev)
	if err != nil || !ok || !d.ReadOnly {
		return loop.Device{}, false, err
	}
	return d, true, nil
}

// ReleaseReadOnlyDevice detaches the read-only loop device over dev, if
// there is one; recorded is where the publication record saw it.
func (n *Node) ReleaseReadOnlyDevice(ctx context.Context, dev, recorded string) error {
	d, ok, err := n.readOnlyOver(ctx, dev, recorded)
	if err != nil || !ok {
		return err
	}
	// As found: between the search and the detach, another process may
	// have detached it and bound the number to a file of its own.
	if err := loop.DetachBound(ctx, d); err != nil {
		return fmt.Errorf("release read-only device over %s: %w", dev, err)
	}
	return nil
}

// ResizeReadOnlyDevice makes the read-only loop device over dev, if any,
// take dev's new size after an expansion.
func (n *Node) ResizeReadOnlyDevice(ctx context.Context, dev string) error {
	d, ok, err := n.readOnlyOver(ctx, dev, "")
	if err != nil || !ok {
		return err
	}
	if _, err := loop.Resize(ctx, d.Path); err != nil {
		return fmt.Errorf("resize read-only device over %s: %w", dev, err)
	}
	return nil
}

// CheckDevice checks that a block device node exists.
func (n *Node) CheckDevice(dev string) error {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return fmt.Errorf("device %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return errf(codes.Internal, "%s is not a block device", dev)
	}
	return nil
}

// IsMounted reports whether path is a mount point.
func (n *Node) IsMounted(path string) (bool, error) { return mount.IsMountPoint(path) }

// Unmount unmounts path if it is mounted.
func (n *Node) Unmount(ctx context.Context, path string) error {
	_, err := mount.Unmount(ctx, path)
	return err
}

// UnmountTop unmounts the topmost mount at path only.
func (n *Node) UnmountTop(ctx context.Context, path string) error {
	_, err := mount.UnmountTop(ctx, path)
	return err
}

// Unpublish unmounts a target and removes the directory or file the
// publication created.
func (n *Node) Unpublish(ctx context.Context, target string) error {
	if _, err := mount.Unmount(ctx, target); err != nil {
		return err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove target %s: %w", target, err)
	}
	return nil
}

// DeviceSize returns a block device's size in bytes.
func (n *Node) DeviceSize(dev string) (int64, error) {
	return fs.DeviceSize(context.Background(), dev)
}

// Usage is a filesystem's space and inode counts.
type Usage = fs.Usage

// Usage returns the usage of the filesystem that holds path.
func (n *Node) Usage(path string) (Usage, error) {
	return fs.Stats(context.Background(), path)
}

// GrowFS grows the filesystem on dev, mounted at mountPath ("" when it
// is not mounted), to its device.
func (n *Node) GrowFS(ctx context.Context, dev, mountPath, fstype string) error {
	return fs.Grow(ctx, dev, mountPath, fstype)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
