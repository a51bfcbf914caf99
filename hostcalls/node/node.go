// Package node is the host's seam to the node's kernel: the one package
// through which the CSI services (package host) act on and observe the
// node — stage, publish and grow steps, the check that a device or folder
// a module names is its own, the mount table and devices at start-up
// reconciliation, snapshot data for the SnapshotMetadata service, and what
// pauses a volume's writes. The host keeps the spec's rules, the locks and
// the records and decides; this package executes and observes, with the
// primitives of hostcalls/.
package node

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
)

// Node is the seam. Its methods are safe for concurrent use; the host
// serialises calls on one volume itself.
type Node struct {
	log    *slog.Logger
	owners []hostcalls.DeviceOwner
	// undoDir keeps the undo files of offline ext4 resizes (fs.GrowOffline);
	// "" grows without them.
	undoDir string
}

// SetUndoDir names the folder, on a filesystem that survives the daemon
// (its state folder), where offline ext4 resizes keep their undo files so
// that a resize cut off by a kill is rolled back by the next one.
func (n *Node) SetUndoDir(dir string) { n.undoDir = dir }

// growOffline grows the unmounted ext4 filesystem on dev to its device.
func (n *Node) growOffline(ctx context.Context, dev string) error {
	if n.undoDir == "" {
		return fs.Grow(ctx, dev, "", fs.Ext4)
	}
	return fs.GrowOffline(ctx, dev, n.undoDir)
}

// New returns the seam; owners are the families that answer for the
// block devices modules name (catalog.DeviceOwners).
func New(log *slog.Logger, owners []hostcalls.DeviceOwner) *Node {
	return &Node{log: log, owners: owners}
}

// errf builds an error carrying the gRPC code the host answers with: the
// seam refuses what the spec names a code for in the host's own terms.
func errf(c codes.Code, format string, args ...any) error {
	return status.Error(c, fmt.Sprintf(format, args...))
}
