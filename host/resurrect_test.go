package host_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestDeletedVolumeNotMadeAgain: a logged create that start-up finished
// but could not complete (a folder of its backend's, here a second root of
// localdir, did not sync) stays logged while the daemon serves. A DeleteVolume of its volume
// must take the intent with it, or the next start makes the deleted volume
// again.
func TestDeletedVolumeNotMadeAgain(t *testing.T) {
	p := newProcDaemon(t)
	v, err := p.createVolume(callCtx(t), "ghost", "localdir")
	if err != nil {
		t.Fatal(err)
	}
	p.kill(t) // before the batch drops the intent
	// A root of the repeating backend whose sync fails: procfs has no
	// fsync.
	p.Modules[0].Roots = []string{"/proc/sys/fs"}
	p.start(t)
	if !slices.ContainsFunc(p.log(), func(l string) bool { return strings.Contains(l, "complete at the next start") }) {
		t.Fatalf("start-up completed what it finished; the test needs it not to: %q", p.log())
	}
	if _, err := p.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the deletion settles
	p.stop(t)
	p.Modules[0].Roots = nil
	p.start(t)
	if got := p.listedOf(t, "localdir"); len(got) != 0 {
		t.Errorf("a deleted volume is back after a restart: %v", got)
	}
	if got := poolEntries(t, p.Pool("localdir")); len(got) != 0 {
		t.Errorf("a deleted volume's storage is back after a restart: %v", got)
	}
}
