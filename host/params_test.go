package host_test

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// TestDeclaredParametersCheckedByHost: a module that declares its
// StorageClass parameters (localdir declares none) gets no CreateVolume or
// GetCapacity with an unknown key: the host answers INVALID_ARGUMENT
// naming the key, in its own words, before the module runs. The CO's own
// keys pass.
func TestDeclaredParametersCheckedByHost(t *testing.T) {
	d := startDaemon(t, localdirOptions(t))
	_, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{
		Name: "pvc-params", VolumeCapabilities: rwCaps(),
		Parameters: map[string]string{"maxVolumes": "3"},
	})
	wantCode(t, err, codes.InvalidArgument, `backend "localdir": unknown parameter "maxVolumes" (known: none)`)
	_, err = d.controller().GetCapacity(callCtx(t), &csi.GetCapacityRequest{Parameters: map[string]string{"tier": "fast"}})
	wantCode(t, err, codes.InvalidArgument, `unknown parameter "tier"`)
	createVolume(t, d, &csi.CreateVolumeRequest{
		Name: "pvc-params-ok", VolumeCapabilities: rwCaps(),
		Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": "data"},
	})
}
