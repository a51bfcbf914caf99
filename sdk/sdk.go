// Package sdk is what a backend module's author implements: the Backend
// interface and the optional interfaces that add operations, in plain Go
// that `go test` runs natively. The glue that turns a Backend into a
// WebAssembly module lives in sdk/guest; host calls live in sdk/hostcall;
// sdk/moduletest runs a built module against a fake or real host.
//
// Everything here compiles with TinyGo and with standard Go for wasip1: no
// reflection-based encoding, no goroutines, no fmt on hot paths. Methods take
// no context: the host bounds every call with a deadline and stops a guest
// that overruns it, so a guest has nothing to cancel.
package sdk

import "github.com/wasmcsi/wasmcsi/abi"

// Backend is the minimum a backend implements: what it is, and creating and
// deleting volumes. CreateVolume must be idempotent on the request's Name
// (the host may repeat it after a crash) and DeleteVolume must succeed for a
// volume that is already gone.
type Backend interface {
	Info() abi.BackendInfo
	CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error)
	DeleteVolume(req *abi.DeleteVolumeRequest) error
}

// Configurer checks and keeps the operator's configuration, once at load.
type Configurer interface {
	Configure(req *abi.ConfigureRequest) error
}

// Expander grows volumes on the controller side.
type Expander interface {
	ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error)
}

// Modifier changes a volume's mutable parameters (ControllerModifyVolume).
// Info's MutableParameters lists the keys it accepts; the host refuses
// every other key before calling it.
type Modifier interface {
	ModifyVolume(req *abi.ModifyVolumeRequest) (*abi.ModifyVolumeResponse, error)
}

// Snapshotter cuts and deletes snapshots.
type Snapshotter interface {
	CreateSnapshot(req *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error)
	DeleteSnapshot(req *abi.DeleteSnapshotRequest) error
}

// CapacityReporter answers GetCapacity.
type CapacityReporter interface {
	GetCapacity(req *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error)
}

// ControllerPublisher makes volumes reachable from nodes (e.g. iSCSI ACLs).
type ControllerPublisher interface {
	ControllerPublish(req *abi.ControllerPublishRequest) (*abi.ControllerPublishResponse, error)
	ControllerUnpublish(req *abi.ControllerUnpublishRequest) error
}

// VolumeHealthReporter reports a volume's health.
type VolumeHealthReporter interface {
	VolumeHealth(req *abi.VolumeHealthRequest) (*abi.HealthResponse, error)
}

// OwnedLister lists every volume and snapshot the backend's storage holds,
// for the host to find at start-up storage no record explains (a create
// whose answer a crash, or an error after the storage was made, cut off)
// and remove it, never what a record names.
type OwnedLister interface {
	ListOwned(req *abi.ListOwnedRequest) (*abi.ListOwnedResponse, error)
}

// StorageHealthReporter reports the health of the backend's storage as a
// node sees it.
type StorageHealthReporter interface {
	StorageHealth() (*abi.HealthResponse, error)
}

// NodeInformer reports the node's topology and what the controller must
// know about the node.
type NodeInformer interface {
	NodeInfo() (*abi.NodeInfoResponse, error)
}

// NodeStager makes a volume present on a node and releases it. NodeStage
// names a device or directory; the host formats, mounts and binds.
type NodeStager interface {
	NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error)
	NodeUnstage(req *abi.NodeUnstageRequest) error
}

// NodeExpander makes a node's device show a grown volume's new size.
type NodeExpander interface {
	NodeExpand(req *abi.NodeExpandRequest) (*abi.NodeExpandResponse, error)
}

// SnapshotDataSource says where a snapshot's data can be read, for the
// SnapshotMetadata service.
type SnapshotDataSource interface {
	SnapshotData(req *abi.SnapshotDataRequest) (*abi.SnapshotDataResponse, error)
}

// Ops lists the operations b implements, in abi.AllOps order.
func Ops(b Backend) []string {
	var ops []string
	for _, op := range abi.AllOps {
		if Implements(b, op) {
			ops = append(ops, string(op))
		}
	}
	return ops
}
