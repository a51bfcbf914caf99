package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
)

// Confinement of what a module's node_stage names (host/RATIONALE.md,
// "Confinement of what modules name"). who names the module in errors
// ("backend \"x\"").

// ConfineDirectory checks that dir lies inside roots, also once its links
// are resolved, and returns its real path.
func (n *Node) ConfineDirectory(who string, roots []string, dir string) (string, error) {
	clean, err := hostcalls.Confine(roots, dir, false)
	if err != nil {
		return "", errf(codes.Internal, "%s named directory %q outside its roots", who, dir)
	}
	real, err := filepath.EvalSymlinks(clean)
	if err != nil {
		return "", fmt.Errorf("directory %s: %w", clean, err)
	}
	if _, err := hostcalls.Confine(roots, real, false); err != nil {
		return "", errf(codes.Internal, "%s directory %q resolves outside its roots", who, dir)
	}
	return real, nil
}

// ConfineDevice checks that dev is a device a family claims under roots
// and returns its path (dev itself where the name alone settles it, its
// real path otherwise) and the identity the claiming family gives it,
// which the stage record keeps.
func (n *Node) ConfineDevice(ctx context.Context, who string, roots []string, dev string) (path, identity string, err error) {
	return n.confineDevice(ctx, who, roots, hostcalls.Device{Path: dev})
}

// StagedDevice reports whether dev, the device a stage record names, is
// still a device a family claims under roots with the identity the record
// keeps. Unlike at node_stage, a device that another device holds (a
// workload's dm-crypt, LVM or md on its raw block volume, multipathd on
// a disk) still counts: the identity tells the volume's device.
func (n *Node) StagedDevice(ctx context.Context, who string, roots []string, dev, identity string) bool {
	_, id, err := n.confineDevice(ctx, who, roots, hostcalls.Device{Path: dev, Staged: true})
	// A disk staged before iSCSI disks without a WWID had an identity of
	// their own ("lun:…") was recorded with none: its record still counts.
	return err == nil && (id == identity || identity == "" && strings.HasPrefix(id, "lun:"))
}

func (n *Node) confineDevice(ctx context.Context, who string, roots []string, d hostcalls.Device) (path, identity string, err error) {
	dev := d.Path
	if !filepath.IsAbs(dev) {
		return "", "", notGranted{errf(codes.Internal, "%s named a relative device %q", who, dev)}
	}
	if id, ok, err := n.claim(ctx, d, roots); err != nil || ok {
		return dev, id, err
	}
	real, err := filepath.EvalSymlinks(dev)
	if errors.Is(err, os.ErrNotExist) {
		return "", "", notGranted{fmt.Errorf("device %s: %w", dev, err)}
	} else if err != nil {
		return "", "", fmt.Errorf("device %s: %w", dev, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(real, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", "", notGranted{errf(codes.Internal, "%s named %q, which is not a block device", who, dev)}
	}
	d.Real = real
	id, ok, err := n.claim(ctx, d, roots)
	if err != nil {
		return "", "", err
	}
	if !ok {
		return "", "", notGranted{errf(codes.Internal, "%s named device %q, which its grants do not explain", who, dev)}
	}
	return real, id, nil
}

// notGranted marks an error of ConfineDevice that is its refusal (a
// device the grants do not explain), not a failure to tell: the check
// answered, and the answer is no.
type notGranted struct{ error }

func (e notGranted) Unwrap() error { return e.error }

// GRPCStatus keeps the code of the refusal.
func (e notGranted) GRPCStatus() *status.Status { return status.Convert(e.error) }

// Refused reports whether err is ConfineDevice's refusal of a device its
// grants do not explain, rather than a failure to check it.
func Refused(err error) bool {
	var r notGranted
	return errors.As(err, &r)
}

// claim asks the families in turn; the first that claims d answers.
func (n *Node) claim(ctx context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	for _, o := range n.owners {
		if id, ok, err := o.OwnsDevice(ctx, d, roots); err != nil || ok {
			return id, ok, err
		}
	}
	return "", false, nil
}

// StagedAt reports whether path is mounted, from device when it is not
// "" (the device a stage record names).
func (n *Node) StagedAt(path, device string) bool {
	e, err := mount.Info(path)
	if err != nil {
		return false // not mounted, or the path is gone
	}
	if device == "" {
		return true
	}
	real, err := filepath.EvalSymlinks(device)
	if err != nil {
		return false
	}
	// The mount's device number identifies it, except on btrfs, whose
	// mounts carry an anonymous device: there the source names it.
	var st unix.Stat_t
	sameDev := unix.Stat(real, &st) == nil && unix.Major(st.Rdev) == uint32(e.Major) && unix.Minor(st.Rdev) == uint32(e.Minor)
	if src, err := filepath.EvalSymlinks(e.Source); !sameDev && (err != nil || src != real) {
		return false
	}
	return true
}
