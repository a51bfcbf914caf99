// Command panicky is a test fixture, not an example: a backend module whose
// create_volume panics when the volume's name is "panic", so the SDK's
// tests can show what a panic does under each toolchain (standard Go
// recovers it into INTERNAL; TinyGo traps and the host discards the
// instance). It must never be shipped.
package main

import (
	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/guest"
)

type backend struct{}

func (backend) Info() abi.BackendInfo { return abi.BackendInfo{Name: "panicky", Mount: true} }

func (backend) CreateVolume(req *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	if req.Name == "panic" {
		panic("asked to panic")
	}
	return &abi.CreateVolumeResponse{LocalID: "v-" + req.Name}, nil
}

func (backend) DeleteVolume(*abi.DeleteVolumeRequest) error { return nil }

func init() { guest.Serve(backend{}) }

func main() {}
