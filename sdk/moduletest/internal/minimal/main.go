// Command minimal is the smallest complete wasmcsi backend module, the one
// docs/authoring.md walks through: every volume is a directory in the pool
// folder the operator grants, and a node bind-mounts it. It exists to be
// read and to test the SDK with both toolchains; it must never grow
// features (examples/localdir is the full version: topology, quotas,
// snapshots, clones).
package main

import (
	"hash/fnv"
	"strconv"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/guest"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

type backend struct{ pool string }

func (b *backend) Info() abi.BackendInfo {
	return abi.BackendInfo{Name: "minimal", Version: "1.0.0", Mount: true, DeclaresParameters: true}
}

// Configure keeps the first granted root as the pool folder.
func (b *backend) Configure(req *abi.ConfigureRequest) error {
	if len(req.Roots) == 0 {
		return sdk.Errorf(abi.InvalidArgument, "minimal needs a granted root: its pool folder")
	}
	b.pool = req.Roots[0]
	return nil
}

// CreateVolume names the directory after a hash of the volume's name, so a
// repeated call finds the same directory (dir_create succeeds when it exists).
func (b *backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	h := fnv.New64a()
	h.Write([]byte(req.Name))
	id := "v-" + strconv.FormatUint(h.Sum64(), 16)
	if err := hostcall.DirCreate(&abi.DirCreateRequest{Path: b.pool + "/" + id}); err != nil {
		return nil, err
	}
	return &abi.CreateVolumeResponse{LocalID: id, CapacityBytes: req.RequiredBytes}, nil
}

// DeleteVolume removes the directory; dir_remove succeeds when it is gone.
func (b *backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	return hostcall.DirRemove(b.pool + "/" + req.Volume.LocalID)
}

// NodeStage names the directory; the host bind-mounts it at the staging path.
func (b *backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	return &abi.NodeStageResponse{Directory: b.pool + "/" + req.Volume.LocalID}, nil
}

// NodeUnstage has nothing to release: the host has already unmounted.
func (b *backend) NodeUnstage(*abi.NodeUnstageRequest) error { return nil }

func init() { guest.Serve(&backend{}) }

func main() {}
