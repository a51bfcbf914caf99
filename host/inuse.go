package host

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// Whether a volume is in use, for the controller operations that must not
// run under a workload (DeleteVolume, offline expansion). A daemon sees two
// kinds of use: controller publications, which it records for every node,
// and the stage and publication records of its own node. See RATIONALE.md
// ("A live volume is never deleted") for why that is all a daemon needs in
// each layout.

// volumeInUse says where v is in use, or "" when it is not: the nodes it is
// published to by ControllerPublishVolume, or this node's stage or
// publication of it. Both are direct lookups by volume ID.
func (s *Server) volumeInUse(v *state.Volume) (string, error) {
	if len(v.Published) > 0 {
		return fmt.Sprintf("published to %v", slices.Sorted(maps.Keys(v.Published))), nil
	}
	if s.cfg.Role == config.RoleController {
		return "", nil // the node records live with the node daemons
	}
	if rec, err := s.store.GetStage(v.ID); err == nil {
		return fmt.Sprintf("staged on node %q at %q", s.cfg.NodeID, rec.StagingPath), nil
	} else if !errors.Is(err, state.ErrNotFound) {
		return "", err
	}
	pubs, err := s.store.PublishesOf(v.ID)
	if err != nil {
		return "", err
	}
	if len(pubs) > 0 {
		return fmt.Sprintf("published on node %q at %q", s.cfg.NodeID, pubs[0].TargetPath), nil
	}
	return "", nil
}

// publishedNodeKey is the publish context key by which ControllerPublishVolume
// tells a node daemon that the controller recorded the publication to it.
const publishedNodeKey = "wasmcsi.dev/published-node"

// withPublishedNode returns a publish context with the node the controller
// published to beside the backend's keys.
func withPublishedNode(publishCtx map[string]string, node string) map[string]string {
	out := make(map[string]string, len(publishCtx)+1)
	maps.Copy(out, publishCtx)
	out[publishedNodeKey] = node
	return out
}

// checkPublishedHere refuses, on a node-only daemon, a new stage of a volume
// that the controller did not publish to this node: the controller would
// not know of this node's use and would delete the volume under it. It
// happens when the CO skips ControllerPublishVolume although the plugin
// asks for it (a CSIDriver with attachRequired: false in the split layout).
func (s *Server) checkPublishedHere(id string, publishCtx map[string]string) error {
	if s.cfg.Role != config.RoleNode || publishCtx[publishedNodeKey] == s.cfg.NodeID {
		return nil
	}
	return errf(codes.FailedPrecondition, "volume %q was not published to node %q by ControllerPublishVolume: in the split layout the controller must know every node that uses a volume (CSIDriver attachRequired: true)", id, s.cfg.NodeID)
}
