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
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path/filepath"

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
	// resizeDir keeps the markers of offline ext4 resizes under way
	// (fs.GrowOffline); "" grows without them.
	resizeDir string
}

// SetResizeDir names the folder, on a filesystem that survives the daemon
// (its state folder), where offline ext4 resizes mark that they are under
// way, so that a resize cut off by a kill is repaired by the next one.
func (n *Node) SetResizeDir(dir string) { n.resizeDir = dir }

// growOffline grows the unmounted ext4 filesystem on dev, to be mounted at
// target, to its device. The marker is named for target: the CO retries
// a stage at the same path, and a volume's stages are serialized.
func (n *Node) growOffline(ctx context.Context, dev, target string) error {
	if n.resizeDir == "" {
		return fs.Grow(ctx, dev, "", fs.Ext4)
	}
	return fs.GrowOffline(ctx, dev, n.resizeMarker(target))
}

// resizeMarker is the marker file of an offline resize of the volume to be
// mounted at target.
func (n *Node) resizeMarker(target string) string {
	sum := sha256.Sum256([]byte(target))
	return filepath.Join(n.resizeDir, hex.EncodeToString(sum[:16])+".resizing")
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
