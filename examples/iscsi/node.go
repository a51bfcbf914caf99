package main

import (
	"strconv"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// NodeInfo reports the node's initiator name, which the CO hands back to
// the controller in the node ID so ControllerPublish can grant this node.
// iSCSI volumes are reachable from every node, so there is no topology.
// A node without an initiator name still answers (the daemon's NodeGetInfo
// serves every backend); ControllerPublish then says what is missing.
func (b *Backend) NodeInfo() (*abi.NodeInfoResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	name, err := hostcall.IscsiInitiatorName()
	if err != nil {
		hostcall.Logf(abi.LogWarn, "no iSCSI initiator name: this node cannot be granted iscsi volumes: ", err.Error())
		return &abi.NodeInfoResponse{}, nil
	}
	return &abi.NodeInfoResponse{Context: map[string]string{NodeContextInitiator: name}}, nil
}

// lunTarget is where a node finds a volume's LUN: the LUN from the volume
// ID, the portal and target from ctx (the publish or stage context), else
// from the volume context. The CHAP credentials are the node's own
// configuration, never a context.
func (b *Backend) lunTarget(ref *abi.VolumeRef, ctx map[string]string) (*abi.IscsiTarget, error) {
	_, lun, ok := parseVolumeID(ref.LocalID)
	if !ok {
		return nil, sdk.Error(abi.NotFound, "volume ", strconv.Quote(ref.LocalID), " is not an iscsi volume ID")
	}
	pick := func(key, volKey string) string {
		if v := ctx[key]; v != "" {
			return v
		}
		return ref.Context[volKey]
	}
	t := &abi.IscsiTarget{Portal: pick(pubPortal, ctxPortal), IQN: pick(pubTarget, ctxTarget), LUN: int32(lun)}
	if t.Portal == "" || t.IQN == "" {
		return nil, sdk.Error(abi.InvalidArgument, "volume ", ref.LocalID, " has no portal and target in its publish or volume context")
	}
	if l, ok := parseLUN(ctx[pubLUN]); ctx[pubLUN] != "" && (!ok || l != lun) {
		return nil, sdk.Error(abi.InvalidArgument, "publish context names LUN ", strconv.Quote(ctx[pubLUN]), ", the volume ID ", strconv.Itoa(lun))
	}
	if b.configured && b.cfg.chap != nil {
		t.ChapUser, t.ChapSecret = b.cfg.chap.user, b.cfg.chap.secret
	}
	return t, nil
}

// stageContext is what node_unstage and node_expand need, kept in the
// node's stage record.
func stageContext(t *abi.IscsiTarget) map[string]string {
	return map[string]string{pubPortal: t.Portal, pubTarget: t.IQN, pubLUN: strconv.Itoa(int(t.LUN))}
}

// NodeStage logs in to the volume's target (the host shares one session
// per target among all its volumes) and names the LUN's disk; the host
// formats a blank one and mounts it, or publishes it raw. A LUN already
// logged in answers its device again.
func (b *Backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	t, err := b.lunTarget(&req.Volume, req.PublishContext)
	if err != nil {
		return nil, err
	}
	login, err := hostcall.IscsiLogin(t)
	if err != nil {
		return nil, sdk.Wrap(err, "log in to LUN "+strconv.Itoa(int(t.LUN))+" of "+t.IQN+" at "+t.Portal)
	}
	return &abi.NodeStageResponse{Device: login.Device, Context: stageContext(t)}, nil
}

// NodeUnstage releases the LUN after the host unmounted it: its disk goes,
// and the session with it when no other staged volume uses the target.
// A LUN that is not logged in is success.
func (b *Backend) NodeUnstage(req *abi.NodeUnstageRequest) error {
	t, err := b.lunTarget(&req.Volume, req.StageContext)
	if abi.CodeOf(err) == abi.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	t.ChapUser, t.ChapSecret = "", ""
	return sdk.Wrap(hostcall.IscsiLogout(t), "log out of LUN "+strconv.Itoa(int(t.LUN))+" of "+t.IQN+" at "+t.Portal)
}

// NodeExpand makes the node's disk show the size the controller gave the
// LUN; the host then grows the filesystem.
func (b *Backend) NodeExpand(req *abi.NodeExpandRequest) (*abi.NodeExpandResponse, error) {
	t, err := b.lunTarget(&req.Volume, req.StageContext)
	if err != nil {
		return nil, err
	}
	t.ChapUser, t.ChapSecret = "", ""
	r, err := hostcall.IscsiRescan(t)
	if err != nil {
		return nil, sdk.Wrap(err, "rescan LUN "+strconv.Itoa(int(t.LUN))+" of "+t.IQN)
	}
	if r.SizeBytes < req.RequiredBytes {
		return nil, sdk.Error(abi.FailedPrecondition, "LUN ", strconv.Itoa(int(t.LUN)), " of ", t.IQN, " shows ", sdk.FormatSize(r.SizeBytes),
			", below the ", itoa(req.RequiredBytes), " asked: expand the volume on the controller first")
	}
	return &abi.NodeExpandResponse{CapacityBytes: r.SizeBytes}, nil
}

// nodeHealth checks that the node still reaches the volume's LUN: a rescan
// answers its size, or NOT_FOUND when the session or the disk is gone.
func (b *Backend) nodeHealth(ref *abi.VolumeRef) (*abi.HealthResponse, error) {
	t, err := b.lunTarget(ref, nil)
	if err != nil {
		return nil, err
	}
	t.ChapUser, t.ChapSecret = "", ""
	r, err := hostcall.IscsiRescan(t)
	switch {
	case abi.CodeOf(err) == abi.NotFound:
		return unhealthy(abi.HealthInaccessible, "LunNotLoggedIn", "LUN "+strconv.Itoa(int(t.LUN))+" of "+t.IQN+
			" has no disk on this node: "+err.Error()), nil
	case err != nil:
		return nil, sdk.Wrap(err, "rescan LUN "+strconv.Itoa(int(t.LUN))+" of "+t.IQN)
	case ref.CapacityBytes > 0 && r.SizeBytes < ref.CapacityBytes:
		return unhealthy(abi.HealthDegraded, "LunSmallerThanVolume", "LUN "+strconv.Itoa(int(t.LUN))+" shows "+
			sdk.FormatSize(r.SizeBytes)+", the volume "+sdk.FormatSize(ref.CapacityBytes)+": expansion is not finished"), nil
	}
	return &abi.HealthResponse{}, nil
}
