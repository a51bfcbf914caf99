package guest

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

type stub struct{ name string }

func (s *stub) Info() abi.BackendInfo { return abi.BackendInfo{Name: s.name} }
func (s *stub) CreateVolume(*abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	return nil, nil
}
func (s *stub) DeleteVolume(*abi.DeleteVolumeRequest) error { return nil }

// TestServeOnce: a module registers exactly one backend; a second Serve is
// a programming error that must not silently replace the first.
func TestServeOnce(t *testing.T) {
	backend = nil
	t.Cleanup(func() { backend = nil })
	if Backend() != nil {
		t.Fatal("Backend() before Serve is not nil")
	}
	first := &stub{name: "first"}
	Serve(first)
	if Backend() != first {
		t.Fatalf("Backend() = %v, want the served backend", Backend())
	}
	defer func() {
		if recover() == nil {
			t.Error("a second Serve did not panic")
		}
		if Backend() != first {
			t.Errorf("a second Serve replaced the backend with %v", Backend())
		}
	}()
	Serve(&stub{name: "second"})
}
