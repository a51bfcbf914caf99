package host

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// Which daemon owns a volume or snapshot. In role all every daemon keeps
// the records of what it made, and a node-local backend's storage lives on
// the node that made it, so the IDs of such volumes and snapshots name
// that node; a call that reaches another daemon is refused with a code
// naming the owner instead of being answered as if the volume did not
// exist (host/RATIONALE.md, "Node-local volumes across nodes").

// nodeLocal reports whether b's volumes are reachable only on the node
// whose daemon made them, as far as the host can tell: it has no
// controller_publish, so no controller step ever makes them reachable
// from another node.
func (b *backend) nodeLocal() bool { return !b.has(abi.OpControllerPublish) }

// tagFor is the node tag the IDs of b's new volumes and snapshots carry:
// this node's in role all for a node-local backend, nil otherwise (a
// controller daemon's records are the same for every node, and a
// backend with controller_publish is reached through its controller).
func (s *Server) tagFor(b *backend) *nodeTag {
	if s.cfg.Role != config.RoleAll || !b.nodeLocal() {
		return nil
	}
	return &s.tag
}

// owner names the node an ID's tag stands for, in words; "" when the ID
// is untagged, not one of ours, or this node's.
func (s *Server) owner(id string) string {
	_, tag, _, ok := splitID(id)
	if !ok || tag == "" || s.tag.is(tag) {
		return ""
	}
	if strings.HasPrefix(tag, "_") {
		return fmt.Sprintf("another node (node tag %s, a digest of its name)", tag)
	}
	return fmt.Sprintf("node %q", tag)
}

// elsewhere answers a controller call on a volume or snapshot (what) of
// which this daemon holds no record, when its ID names another node's
// daemon, which made it and alone holds its records: code, naming that
// node and the fix. nil for an untagged ID or one of this node's, which
// the caller answers as the spec asks of something that does not exist.
func (s *Server) elsewhere(code codes.Code, what, id string) error {
	owner := s.owner(id)
	if owner == "" {
		return nil
	}
	return errf(code, "%s %q was made by the wasmcsi daemon of %s, which alone holds its records; this is node %q: send its controller calls to the plugin on that node (Kubernetes: sidecars with --node-deployment; Nomad: that client's plugin ID; see deploy/README.md)",
		what, id, owner, s.cfg.NodeID)
}

// absent answers a failed lookup of a volume or snapshot (what) for a
// controller call: FAILED_PRECONDITION when the ID names another node's
// daemon, NOT_FOUND when there is no such record, err otherwise.
func (s *Server) absent(err error, what, id string) error {
	if errors.Is(err, state.ErrNotFound) {
		if e := s.elsewhere(codes.FailedPrecondition, what, id); e != nil {
			return e
		}
	}
	return notFoundOr(err, "%s %q", what, id)
}

// sourceAbsent answers a failed lookup of CreateVolume's content source
// (what): RESOURCE_EXHAUSTED when its ID names another node, where it
// lives: a volume from it can be made only there, and the spec's code for
// "cannot be provisioned with these topology constraints" makes
// Kubernetes' provisioner ask the scheduler for another node.
func (s *Server) sourceAbsent(err error, what, id string) error {
	if errors.Is(err, state.ErrNotFound) {
		if owner := s.owner(id); owner != "" {
			return errf(codes.ResourceExhausted, "source %s %q lives on %s, not on this node %q: a volume from it can be made only there", what, id, owner, s.cfg.NodeID)
		}
	}
	return notFoundOr(err, "%s %q", what, id)
}

// notOnThisNode refuses a node call (NodeStage, NodePublish) for a volume
// of a node-local backend whose ID names another node, where its storage
// lives: NOT_FOUND, the spec's code for a volume that does not exist on
// the node. nil when the ID names no other node, or when this daemon
// holds the volume's record (it made the volume under another node name).
func (s *Server) notOnThisNode(b *backend, id string) error {
	if !b.nodeLocal() {
		return nil
	}
	owner := s.owner(id)
	if owner == "" {
		return nil
	}
	if _, err := s.store.GetVolume(id); err == nil {
		return nil
	} else if !errors.Is(err, state.ErrNotFound) {
		return err
	}
	return errf(codes.NotFound, "volume %q lives on %s, not on this node %q: backend %q is node-local, so the CO must use it there (its accessible topology)", id, owner, s.cfg.NodeID, b.name)
}
