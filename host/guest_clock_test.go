package host_test

import (
	"os"
	"path/filepath"
	"strconv"
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
	// The copy must outlast the call timeout for the test to show
	// anything; a fast moment of the machine copies 2000 files in less,
	// so the tree grows until it does not.
	path := vol.GetVolume().GetVolumeContext()["path"]
	files := 0
	for round := range 4 {
		more := 2000 << round
		dir := filepath.Join(path, "r"+strconv.Itoa(round))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		fillTree(t, dir, more)
		files += more
		name := "big-snap-" + strconv.Itoa(round)
		start := time.Now()
		snap, err := d.controller().CreateSnapshot(callCtx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol.GetVolume().GetVolumeId()})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("CreateSnapshot of %d files after %s (call timeout %s): %v", files, took, callTimeout, err)
		}
		if _, err := d.controller().DeleteSnapshot(callCtx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
			t.Fatal(err)
		}
		if took >= 2*callTimeout {
			t.Logf("snapshot of %d files took %s under a call timeout of %s", files, took, callTimeout)
			return
		}
	}
	t.Fatalf("a copy of %d files took less than twice the call timeout %s: the test proves nothing", files, callTimeout)
}
