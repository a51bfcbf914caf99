// offline: a directory backend that can grow a volume only while no
// workload uses it (ExpandOffline), for the daemon's in-use tests.
package main

import (
	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/guest"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

type backend struct{ pool string }

func (b *backend) Info() abi.BackendInfo {
	return abi.BackendInfo{Name: "offline", Version: "1.0.0", Mount: true, ExpandOffline: true, Ops: sdk.Ops(b)}
}

func (b *backend) Configure(req *abi.ConfigureRequest) error {
	if len(req.Roots) == 0 {
		return sdk.Errorf(abi.InvalidArgument, "offline needs a granted root")
	}
	b.pool = req.Roots[0]
	return nil
}

func (b *backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	id := "v-" + sdk.NameID(req.Name, "vol")
	if err := hostcall.DirCreate(&abi.DirCreateRequest{Path: b.pool + "/" + id}); err != nil {
		return nil, err
	}
	return &abi.CreateVolumeResponse{LocalID: id, CapacityBytes: req.RequiredBytes}, nil
}

func (b *backend) DeleteVolume(req *abi.DeleteVolumeRequest) error {
	return hostcall.DirRemove(b.pool + "/" + req.Volume.LocalID)
}

// ExpandVolume only reports the new size: the test is about when the host
// lets it run.
func (b *backend) ExpandVolume(req *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	return &abi.ExpandVolumeResponse{CapacityBytes: req.RequiredBytes}, nil
}

func (b *backend) NodeStage(req *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	return &abi.NodeStageResponse{Directory: b.pool + "/" + req.Volume.LocalID}, nil
}

func (b *backend) NodeUnstage(*abi.NodeUnstageRequest) error { return nil }

func init() { guest.Serve(&backend{}) }

func main() {}
