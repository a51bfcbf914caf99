package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// TopologyKey is the segment that pins a volume to the node holding its pool.
const TopologyKey = "topology.wasmcsi.dev/node"

// Backend keeps volumes as directories in its pool: "v-<slug>" for volumes
// and "s-<slug>" for snapshots, so the two can never collide. Where the
// pool's filesystem enforces project quotas (xfs, or ext4 with prjquota) a
// volume's capacity is its quota and expansion raises it; elsewhere the
// module says so at load, capacity is advisory from creation on, and
// expansion records the new advisory capacity the way creation does, so
// that what the daemon advertises (EXPAND_VOLUME) holds for every pool.
type Backend struct {
	pool   string
	node   string
	quota  bool   // the pool enforces directory quotas
	reason string // why not, when it does not
	mode   string // config "quota": auto | required | off
}

// New returns an unconfigured backend.
func New() *Backend { return &Backend{mode: "auto"} }

// Configure takes the pool from the first granted root and checks quotas.
func (b *Backend) Configure(req *abi.ConfigureRequest) error {
	if len(req.Roots) == 0 {
		return sdk.Errorf(abi.InvalidArgument, "localdir needs a granted root: its pool folder")
	}
	b.pool, b.node = strings.TrimSuffix(req.Roots[0], "/"), req.NodeID
	if m, ok := req.Config["quota"]; ok {
		switch m {
		case "auto", "required", "off":
			b.mode = m
		default:
			return sdk.Error(abi.InvalidArgument, "config quota="+m+": want auto, required or off")
		}
	}
	for k := range req.Config {
		if k != "quota" {
			return sdk.Error(abi.InvalidArgument, "unknown config key "+k+" (known: quota)")
		}
	}
	b.quota, b.reason = false, "quotas turned off by config"
	if b.mode != "off" {
		q, err := hostcall.DirQuotaSupported(b.pool)
		if err != nil {
			return err
		}
		b.quota, b.reason = q.Supported, q.Reason
	}
	if b.mode == "required" && !b.quota {
		return sdk.Error(abi.FailedPrecondition, "config quota=required but pool "+b.pool+" enforces no quotas: "+b.reason)
	}
	if !b.quota {
		hostcall.Log(abi.LogWarn, "localdir: pool "+b.pool+" enforces no quotas ("+b.reason+"): capacity is advisory, and expansion only records it")
	}
	return nil
}

// Info describes the backend.
func (b *Backend) Info() abi.BackendInfo {
	info := abi.BackendInfo{
		Name: "localdir", Version: "1.0.0",
		Description: "directories in a node-local pool; capacity enforced by project quotas where the pool supports them",
		Mount:       true,
		AccessModes: []int64{
			int64(abi.AccessSingleNodeWriter), int64(abi.AccessSingleNodeReadOnly),
			int64(abi.AccessSingleNodeSingleWriter), int64(abi.AccessSingleNodeMultiWriter),
		},
		Granularity:      4096,
		DefaultSizeBytes: 1 << 30,
		TopologyKeys:     []string{TopologyKey},
		Clone:            true,
		Restore:          true,
		// The pool is this node's: a node daemon can create inline
		// ephemeral volumes by itself.
		Ephemeral: true,
		// localdir takes no StorageClass parameters: the host refuses any.
		DeclaresParameters: true,
		Parameters:         Parameters,
	}
	return info
}

// Parameters are localdir's StorageClass parameters: none (README.md).
var Parameters []abi.ParameterSpec

func (b *Backend) dir(localID string) string { return b.pool + "/" + localID }

// CreateVolume makes the directory (with its quota), filling it from a
// snapshot or a volume when asked. It is idempotent on the name: the
// directory name derives from it.
func (b *Backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	for k := range req.Parameters {
		// localdir takes no StorageClass parameters; the CO's own keys pass.
		if !strings.HasPrefix(k, "csi.storage.k8s.io/") {
			return nil, sdk.Error(abi.InvalidArgument, "localdir takes no StorageClass parameter "+k)
		}
	}
	if !b.reachable(req.Requisite) {
		return nil, sdk.Error(abi.ResourceExhausted, "localdir volumes live on node "+b.node+", which the requisite topology excludes")
	}
	id := "v-" + sdk.NameID(req.Name, "vol")
	path := b.dir(id)
	exists, err := hostcall.DirExists(path)
	if err != nil {
		return nil, err
	}
	if !exists {
		if err := b.fill(req, path); err != nil {
			return nil, err
		}
	}
	if b.quota {
		if err := hostcall.DirSetQuota(path, req.RequiredBytes); err != nil {
			return nil, err
		}
	}
	return &abi.CreateVolumeResponse{
		LocalID:       id,
		CapacityBytes: req.RequiredBytes,
		Context:       map[string]string{"path": path, "quota": strconv.FormatBool(b.quota)},
		Topology:      []abi.Topology{{Segments: map[string]string{TopologyKey: b.node}}},
	}, nil
}

// fill creates path empty or as a copy of the request's source. dir_copy
// names the copy only once it is complete, also when the daemon is killed
// during it, so a path that exists is a whole volume.
func (b *Backend) fill(req *abi.CreateVolumeRequest, path string) error {
	var src string
	switch {
	case req.Source == nil:
		return hostcall.DirCreate(&abi.DirCreateRequest{Path: path})
	case req.Source.Snapshot != nil:
		src = b.dir(req.Source.Snapshot.LocalID)
	case req.Source.Volume != nil:
		src = b.dir(req.Source.Volume.LocalID)
	}
	if ok, err := hostcall.DirExists(src); err != nil {
		return err
	} else if !ok {
		return sdk.Error(abi.NotFound, "source "+src+" is gone")
	}
	return hostcall.DirCopy(src, path)
}

func (b *Backend) reachable(requisite []abi.Topology) bool {
	if len(requisite) == 0 {
		return true
	}
	for _, t := range requisite {
		if v, ok := t.Segments[TopologyKey]; !ok || v == b.node {
			return true
		}
	}
	return false
}

// DeleteVolume removes the directory; a missing one is success.
func (b *Backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	return hostcall.DirRemove(b.dir(req.Volume.LocalID))
}

// ExpandVolume raises the quota. Where the pool enforces none, the
// capacity was advisory at creation and stays so: the new size is recorded
// (the volume context says quota=false) and the log says nothing was
// enforced.
func (b *Backend) ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	path := b.dir(req.Volume.LocalID)
	if !b.quota {
		ok, err := hostcall.DirExists(path)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, sdk.Error(abi.NotFound, "volume directory "+path+" does not exist")
		}
		hostcall.Log(abi.LogInfo, "localdir: "+req.Volume.LocalID+" grows to "+strconv.FormatInt(req.RequiredBytes, 10)+
			" bytes of advisory capacity: pool "+b.pool+" enforces no quotas ("+b.reason+")")
		return &abi.ExpandVolumeResponse{CapacityBytes: req.RequiredBytes}, nil
	}
	if err := hostcall.DirSetQuota(path, req.RequiredBytes); err != nil {
		return nil, err
	}
	return &abi.ExpandVolumeResponse{CapacityBytes: req.RequiredBytes}, nil
}

// CreateSnapshot copies the volume's directory. As for CreateVolume, an
// existing directory is the whole copy of an earlier attempt.
func (b *Backend) CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	if !b.reachable(req.Requisite) {
		return nil, sdk.Error(abi.ResourceExhausted, "localdir snapshots live on node "+b.node+", which the requisite topology excludes")
	}
	id := "s-" + sdk.NameID(req.Name, "snap")
	path := b.dir(id)
	exists, err := hostcall.DirExists(path)
	if err != nil {
		return nil, err
	}
	if !exists {
		if err := hostcall.DirCopy(b.dir(req.Source.LocalID), path); err != nil {
			return nil, err
		}
	}
	size := req.Source.CapacityBytes
	if u, err := hostcall.DirUsage(path); err == nil && !b.quota {
		size = u.UsedBytes
	}
	return &abi.CreateSnapshotResponse{
		LocalID: id, SizeBytes: size, ReadyToUse: true,
		Topology: []abi.Topology{{Segments: map[string]string{TopologyKey: b.node}}},
	}, nil
}

// DeleteSnapshot removes the snapshot's directory.
func (b *Backend) DeleteSnapshot(req *abi.DeleteSnapshotRequest) error {
	return hostcall.DirRemove(b.dir(req.Snapshot.LocalID))
}

// GetCapacity reports the pool's available bytes.
func (b *Backend) GetCapacity(req *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error) {
	if req.Topology != nil {
		if v, ok := req.Topology.Segments[TopologyKey]; ok && v != b.node {
			return &abi.GetCapacityResponse{}, nil
		}
	}
	st, err := hostcall.DirStatfs(b.pool)
	if err != nil {
		return nil, err
	}
	return &abi.GetCapacityResponse{AvailableBytes: st.AvailableBytes, MaximumVolumeSize: st.AvailableBytes}, nil
}

// NodeInfo pins volumes to this node.
func (b *Backend) NodeInfo() (*abi.NodeInfoResponse, error) {
	return &abi.NodeInfoResponse{Topology: &abi.Topology{Segments: map[string]string{TopologyKey: b.node}}}, nil
}

// NodeStage names the volume's directory; the host bind-mounts it.
func (b *Backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	path := b.dir(req.Volume.LocalID)
	ok, err := hostcall.DirExists(path)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, sdk.Error(abi.NotFound, "volume directory "+path+" does not exist on node "+b.node)
	}
	return &abi.NodeStageResponse{Directory: path}, nil
}

// NodeUnstage has nothing to release: the host unmounted the bind.
func (b *Backend) NodeUnstage(*abi.NodeUnstageRequest) error { return nil }

// VolumeHealth reports a missing directory as inaccessible.
func (b *Backend) VolumeHealth(req *abi.VolumeHealthRequest) (*abi.HealthResponse, error) {
	ok, err := hostcall.DirExists(b.dir(req.Volume.LocalID))
	if err != nil {
		return nil, err
	}
	if !ok {
		return &abi.HealthResponse{Entries: []abi.HealthEntry{{Status: abi.HealthInaccessible, Reason: "VolumeDirectoryMissing", Message: "the volume's directory is gone from the pool"}}}, nil
	}
	return &abi.HealthResponse{}, nil
}

// StorageHealth reports a pool that cannot be read.
func (b *Backend) StorageHealth() (*abi.HealthResponse, error) {
	if _, err := hostcall.DirStatfs(b.pool); err != nil {
		return &abi.HealthResponse{Entries: []abi.HealthEntry{{Status: abi.HealthInaccessible, Reason: "PoolUnreadable", Message: err.Error()}}}, nil
	}
	return &abi.HealthResponse{}, nil
}
