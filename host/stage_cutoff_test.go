package host_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// TestCutOffStageLeavesNothing: a node_stage stopped after it attached the
// volume's file (here: the host call panics once the real attach is done,
// as a call cut off by its deadline would be stopped) answered nothing, so
// no record names the loop device. NodeStage fails, and the loop device
// is detached at once. When that undo fails too, the stage is recorded
// without a device, and NodeUnstage releases it. Before, the device stayed
// attached until a NodeUnstage, which on a node daemon (no controller
// record to name the file) could not find it.
func TestCutOffStageLeavesNothing(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	ctl := t.TempDir()
	attach := defaultHostCall(t, abi.HostCallLoopAttach)
	cut := attach
	cut.Call = func(ctx context.Context, env *hostcalls.Env, req []byte) ([]byte, error) {
		out, err := attach.Call(ctx, env, req)
		if _, serr := os.Stat(filepath.Join(ctl, "cut")); serr == nil && err == nil {
			panic("injected: the call is cut off after the attach")
		}
		return out, err
	}
	detach := defaultHostCall(t, abi.HostCallLoopDetach)
	failing := detach
	failing.Call = func(ctx context.Context, env *hostcalls.Env, req []byte) ([]byte, error) {
		if _, err := os.Stat(filepath.Join(ctl, "faildetach")); err == nil {
			return nil, abi.Errorf(abi.Unavailable, "injected: cannot detach")
		}
		return detach.Call(ctx, env, req)
	}
	d := startDaemon(t, daemonOptions{
		backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go),
		hostcalls: []string{"file", "loop"}, hostCalls: []hostcalls.Func{cut, failing},
	})
	releaseUnder(t, filepath.Dir(d.pool))
	ctx := callCtx(t)
	attached := func(file string) bool {
		t.Helper()
		backing, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range backing {
			if s, err := os.ReadFile(b); err == nil && strings.TrimSpace(string(s)) == file {
				return true
			}
		}
		return false
	}

	touch(t, filepath.Join(ctl, "cut"))
	v := newLoopVolume(t, d, "cutoff", false)
	wantCode(t, v.stage(ctx, d), codes.Internal, "injected")
	if attached(v.file) {
		t.Errorf("a cut-off NodeStage left %s attached", v.file)
	}
	if _, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging}); err != nil {
		t.Fatal(err)
	}

	// The undo fails as well: the stage is recorded, the call answers a
	// code the CO counts as uncertain, and NodeUnstage releases the stage
	// once it can.
	touch(t, filepath.Join(ctl, "faildetach"))
	wantCode(t, v.stage(ctx, d), codes.Unavailable, "partly staged", "injected")
	if !attached(v.file) {
		t.Fatal("the attach did not happen, so this test shows nothing")
	}
	unstage := func() error {
		_, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging})
		return err
	}
	wantCode(t, unstage(), codes.Unavailable, "injected")
	os.Remove(filepath.Join(ctl, "faildetach"))
	if err := unstage(); err != nil {
		t.Fatal(err)
	}
	if attached(v.file) {
		t.Errorf("NodeUnstage left %s attached after a cut-off NodeStage", v.file)
	}

	// Recorded again, then a repeated NodeStage, no longer cut off,
	// stages the volume for real.
	touch(t, filepath.Join(ctl, "faildetach"))
	wantCode(t, v.stage(ctx, d), codes.Unavailable, "partly staged")
	os.Remove(filepath.Join(ctl, "faildetach"))
	os.Remove(filepath.Join(ctl, "cut"))
	if err := v.stage(ctx, d); err != nil {
		t.Fatalf("NodeStage after a stage recorded without a device: %v", err)
	}
	if mounted, err := mountinfo.Mounted(v.staging); err != nil || !mounted {
		t.Fatalf("staging path mounted %v, %v after the repeated NodeStage", mounted, err)
	}
	if err := unstage(); err != nil {
		t.Fatal(err)
	}
	if attached(v.file) {
		t.Errorf("NodeUnstage left %s attached", v.file)
	}
}
