package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
)

// nodeSteps are the generic node steps every backend shares. They are
// idempotent: each checks what is already there before it acts, so a repeat
// after a crash or restart converges instead of stacking mounts.
type nodeSteps struct {
	log *slog.Logger
}

func newNodeSteps(log *slog.Logger) *nodeSteps { return &nodeSteps{log: log} }

// formatAndMount puts a filesystem on a blank device (never on one that
// holds any signature) and mounts it at target. A filesystem smaller than
// its device (a restore or clone into a larger volume) is grown first, see
// growToDevice.
func (n *nodeSteps) formatAndMount(ctx context.Context, dev, target, fstype string, flags []string, readOnly bool) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("create staging path %s: %w", target, err)
	}
	found, err := fs.Probe(ctx, dev)
	if err != nil {
		return fmt.Errorf("probe %s: %w", dev, err)
	}
	switch {
	case found == "" && readOnly:
		return errf(codes.FailedPrecondition, "device %s is blank and the volume is read-only: nothing to mount", dev)
	case found == "":
		if fstype == "" {
			fstype = "ext4"
		}
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
		if growMounted, err = n.growToDevice(ctx, dev, fstype); err != nil {
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
	if _, err = mount.Mount(ctx, dev, target, fstype, flags); err != nil || !growMounted {
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
// grow after mounting.
func (n *nodeSteps) growToDevice(ctx context.Context, dev, fstype string) (mounted bool, err error) {
	size, ok, err := fs.ReadSize(ctx, dev)
	if err != nil {
		return false, fmt.Errorf("read filesystem size on %s: %w", dev, err)
	}
	if !ok || size.Type != fstype || !size.Growable() {
		return false, nil
	}
	n.log.Info("growing filesystem to its device", "device", dev, "fstype", fstype, "bytes", size.Bytes, "device_bytes", size.DeviceBytes)
	if fstype != fs.Ext4 {
		return true, nil
	}
	if err := fs.Grow(ctx, dev, "", fstype); err != nil {
		return false, fmt.Errorf("grow %s on %s to its device: %w", fstype, dev, err)
	}
	return false, nil
}

// bind bind-mounts src at target; file is true for a block device node.
func (n *nodeSteps) bind(ctx context.Context, src, target string, readOnly, file bool) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return fmt.Errorf("create parent of %s: %w", target, err)
	}
	_, err := mount.Bind(ctx, src, target, readOnly)
	return err
}

// readOnlyDevice returns a read-only loop device over dev, attaching one
// when there is none yet: the device a read-only block publication binds.
// Every read-only publication of a volume shares it (AttachDevice finds
// the one already over dev). Direct I/O keeps the data out of a second
// page cache; reads stay coherent with writes through dev, whose cached
// pages a direct read flushes first.
func (n *nodeSteps) readOnlyDevice(ctx context.Context, dev string) (string, error) {
	d, err := loop.AttachDevice(ctx, dev, loop.Options{ReadOnly: true, DirectIO: true})
	if err != nil {
		return "", fmt.Errorf("read-only device over %s: %w", dev, err)
	}
	return d.Path, nil
}

// readOnlyOver returns the read-only loop device over dev, if any; it
// tries the recorded device first (one device to read, where a search
// walks every loop device when this process has not seen it yet).
func (n *nodeSteps) readOnlyOver(ctx context.Context, dev, recorded string) (loop.Device, bool, error) {
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

// releaseReadOnlyDevice detaches the read-only loop device over dev, if
// there is one; recorded is where the publication record saw it.
func (n *nodeSteps) releaseReadOnlyDevice(ctx context.Context, dev, recorded string) error {
	d, ok, err := n.readOnlyOver(ctx, dev, recorded)
	if err != nil || !ok {
		return err
	}
	if err := loop.Detach(ctx, d.Path); err != nil {
		return fmt.Errorf("release read-only device over %s: %w", dev, err)
	}
	return nil
}

// resizeReadOnlyDevice makes the read-only loop device over dev, if any,
// take dev's new size after an expansion.
func (n *nodeSteps) resizeReadOnlyDevice(ctx context.Context, dev string) error {
	d, ok, err := n.readOnlyOver(ctx, dev, "")
	if err != nil || !ok {
		return err
	}
	if _, err := loop.Resize(ctx, d.Path); err != nil {
		return fmt.Errorf("resize read-only device over %s: %w", dev, err)
	}
	return nil
}

// checkDevice checks that a block device node exists.
func (n *nodeSteps) checkDevice(dev string) error {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return fmt.Errorf("device %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return errf(codes.Internal, "%s is not a block device", dev)
	}
	return nil
}

// unmount unmounts path if it is mounted.
func (n *nodeSteps) unmount(ctx context.Context, path string) error {
	_, err := mount.Unmount(ctx, path)
	return err
}

// unpublish unmounts a target and removes the directory or file the
// publication created.
func (n *nodeSteps) unpublish(ctx context.Context, target string) error {
	if _, err := mount.Unmount(ctx, target); err != nil {
		return err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove target %s: %w", target, err)
	}
	return nil
}

func (n *nodeSteps) deviceSize(dev string) (int64, error) {
	return fs.DeviceSize(context.Background(), dev)
}

func (n *nodeSteps) usage(path string) ([]*csi.VolumeUsage, error) {
	st, err := fs.Stats(context.Background(), path)
	if err != nil {
		return nil, err
	}
	return []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Available: st.AvailableBytes, Used: st.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Available: st.FreeInodes, Used: st.UsedInodes},
	}, nil
}

func (n *nodeSteps) growFS(ctx context.Context, dev, mountPath, fstype string) error {
	return fs.Grow(ctx, dev, mountPath, fstype)
}
