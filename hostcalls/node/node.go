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
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Node is the seam. Its methods are safe for concurrent use; the host
// serialises calls on one volume itself.
type Node struct {
	log    *slog.Logger
	owners []hostcalls.DeviceOwner
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
