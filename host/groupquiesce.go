package host

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
)

// quiesceTargets decides, member by member, what pauses the writes of a
// group snapshot's volumes (RATIONALE.md, "Group snapshots"), and answers
// FAILED_PRECONDITION, naming the member and the reason, when a member's
// writes cannot be paused from here.
func (s *Server) quiesceTargets(ctx context.Context, vols []state.Volume) ([]quiesce.Target, error) {
	var out []quiesce.Target
	for i := range vols {
		t, err := s.memberTarget(ctx, &vols[i])
		if err != nil {
			return nil, err
		}
		if t != nil {
			out = append(out, *t)
		}
	}
	return out, nil
}

// memberTarget is what pauses v's writes: nil when nothing writes to it
// through this node and no other node can.
func (s *Server) memberTarget(ctx context.Context, v *state.Volume) (*quiesce.Target, error) {
	controllerOnly := s.cfg.Role == config.RoleController
	// A controller publication says which nodes have the volume attached.
	for node := range v.Published {
		name, _, _ := parseNodeID(node)
		if controllerOnly || name != s.cfg.NodeID {
			return nil, errf(codes.FailedPrecondition, "volume %q is attached to node %q, whose writes this daemon cannot pause: "+
				"a group snapshot needs every member idle, or in use on the node of the daemon that cuts it", v.ID, name)
		}
	}
	if controllerOnly {
		if b, ok := s.backends.Load().get(v.Backend); ok && b.has(abi.OpControllerPublish) {
			return nil, nil // attachments are tracked, and there are none
		}
		return nil, errf(codes.FailedPrecondition, "volume %q: this daemon serves only the controller and backend %q records no attachments, "+
			"so it cannot tell whether a node writes to the volume, nor pause those writes", v.ID, v.Backend)
	}
	rec, err := s.store.GetStage(v.ID)
	if errors.Is(err, state.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	present, err := s.stagePresent(ctx, &rec)
	if err != nil {
		return nil, err
	}
	if present && rec.Device != "" {
		t, err := s.node.WritePause(rec.Device, rec.StagingPath, rec.Block, v.ID)
		if err != nil || t != nil {
			return t, err
		}
	}
	// What is left cannot be paused: a directory (freezing its filesystem
	// would pause the whole pool, and others' volumes with it), a raw block
	// device other than device-mapper (a loop device has no pause), or a
	// stage whose mount is gone. It is fine as long as no workload can write:
	// nothing publishes it writable here.
	target, err := s.writablePublication(v.ID)
	if err != nil {
		return nil, err
	}
	if target == "" {
		if present && rec.Block {
			return nil, s.flushStaged(ctx, &rec)
		}
		return nil, nil
	}
	var why string
	switch {
	case rec.Directory != "":
		why = fmt.Sprintf("it is a directory (%s), whose writes cannot be paused without freezing the whole filesystem that holds it", rec.Directory)
	case !present:
		why = "its staging mount or device is gone, so there is nothing to pause"
	default:
		why = fmt.Sprintf("it is a raw block device (%s), and only device-mapper devices can pause their writes", rec.Device)
	}
	return nil, errf(codes.FailedPrecondition, "volume %q is published writable at %q and %s: "+
		"its snapshot could not hold the same point of the write stream as the others; unpublish it first", v.ID, target, why)
}

// writablePublication returns a target where volume id is published
// writable and mounted, or "".
func (s *Server) writablePublication(id string) (string, error) {
	pubs, err := s.store.PublishesOf(id)
	if err != nil {
		return "", err
	}
	for _, p := range pubs {
		if p.ReadOnly {
			continue
		}
		mounted, err := s.node.IsMounted(p.TargetPath)
		if err != nil {
			return "", err
		}
		if mounted {
			return p.TargetPath, nil
		}
	}
	return "", nil
}
