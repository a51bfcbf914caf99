package host_test

import (
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/wasmcsi/wasmcsi/host/config"
)

// TestSnapshotOutlastsCallTimeout: a localdir snapshot whose dir_copy takes
// longer than the module's call timeout succeeds, because the call timeout
// counts only the guest's own time (modules/RATIONALE.md).
func TestSnapshotOutlastsCallTimeout(t *testing.T) {
	const callTimeout = 200 * time.Millisecond
	o := localdirOptions(t)
	o.limits = config.Limits{CallTimeout: callTimeout}
	d := startDaemon(t, o)
	vol, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: "big", VolumeCapabilities: rwCaps()})
	if err != nil {
		t.Fatal(err)
	}
	fillTree(t, vol.GetVolume().GetVolumeContext()["path"], 2000)
	start := time.Now()
	snap, err := d.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: "big-snap", SourceVolumeId: vol.GetVolume().GetVolumeId()})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("CreateSnapshot after %s (call timeout %s): %v", took, callTimeout, err)
	}
	if took < callTimeout {
		t.Fatalf("the copy took %s, less than the call timeout %s: the test proves nothing; give it more files", took, callTimeout)
	}
	t.Logf("snapshot of 2000 files took %s under a call timeout of %s", took, callTimeout)
	if _, err := d.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
}
