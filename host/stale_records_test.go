package host_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Node records after a crash: the deletion of a stage or publication
// record is not waited for, so a daemon killed right after NodeUnstage or
// NodeUnpublish answered brings the record back. These tests run the real
// daemon binary as its own process and kill it with SIGKILL at that point.

// procDaemon is the wasmcsi program (run by daemontest) serving
// localdir, loopfile and the slow fixture from a folder of its own.
type procDaemon struct {
	*daemontest.Daemon
	dir  string
	conn *grpc.ClientConn // to the daemon that started last
	// slow is the slow fixture's mode from the next start on: "hang"
	// makes its snapshots hang (testdata/slow.wat).
	slow string
}

func newProcDaemon(t *testing.T) *procDaemon {
	t.Helper()
	daemontest.Require(t)
	d := daemontest.New(t, daemontest.Options{Modules: []daemontest.Module{
		{Name: "localdir", Wasm: localdirWasm(t), HostCalls: []string{"dir"}, Pool: true, Config: map[string]string{"quota": "off"}},
		{Name: "loopfile", Wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go), HostCalls: []string{"file", "loop"}, Pool: true},
		{Name: "slow", Wasm: filepath.Join("testdata", "slow.wasm"), Config: map[string]string{"mode": ""}},
	}})
	p := &procDaemon{Daemon: d, dir: d.Dir}
	p.start(t)
	t.Cleanup(func() { p.stop(t) })
	return p
}

// start runs the daemon on its configuration as it is now (the slow
// fixture's mode) and waits until it serves (after its start-up
// reconciliation).
func (p *procDaemon) start(t *testing.T) {
	t.Helper()
	p.Modules[2].Config["mode"] = p.slow
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	p.conn = p.Conn()
}

func (p *procDaemon) log() []string { return p.Log() }

// kill ends the daemon with SIGKILL, as a crash would; what it started
// (a group snapshot's guardian) runs on.
func (p *procDaemon) kill(t *testing.T) {
	t.Helper()
	p.Kill(false)
}

// stop ends the daemon gracefully; it does nothing when it is not running.
func (p *procDaemon) stop(t *testing.T) {
	if err := p.Stop(); err != nil {
		t.Error(err)
	}
}

func (p *procDaemon) node() csi.NodeClient             { return csi.NewNodeClient(p.conn) }
func (p *procDaemon) controller() csi.ControllerClient { return csi.NewControllerClient(p.conn) }

// reconciled returns the start-up reconciliation's log lines that name path.
func (p *procDaemon) reconciled(path string) []string {
	var out []string
	for _, l := range p.log() {
		if strings.Contains(l, "msg=reconcile") && strings.Contains(l, "path="+path+" ") {
			out = append(out, l)
		}
	}
	return out
}

// TestLostNodeRecordDeletions kills the daemon right after NodeUnstage
// (a localdir volume, then a loopfile one on a loop device) and right after
// NodeUnpublish answered, before the record's deletion reached the disk,
// and checks after each restart that the record came back marked and was
// dropped at start-up, reported once, while a live stage and publication
// of another volume survive every crash untouched.
func TestLostNodeRecordDeletions(t *testing.T) {
	p := newProcDaemon(t)
	ctx := callCtx(t)
	w := workDir(t)
	releaseUnder(t, w)

	type vol struct {
		id, staging string
		capability  *csi.VolumeCapability
		context     map[string]string
	}
	create := func(name, backend string, c *csi.VolumeCapability) *vol {
		resp, err := p.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes},
			VolumeCapabilities: []*csi.VolumeCapability{c}, Parameters: map[string]string{backendParam: backend},
		})
		if err != nil {
			t.Fatalf("CreateVolume %s: %v", name, err)
		}
		return &vol{id: resp.GetVolume().GetVolumeId(), staging: stagingPath(w, name), capability: c, context: resp.GetVolume().GetVolumeContext()}
	}
	stage := func(v *vol) error {
		_, err := p.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: v.capability, VolumeContext: v.context})
		return err
	}
	unstage := func(v *vol) error {
		_, err := p.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
		return err
	}
	publish := func(v *vol, target string) error {
		_, err := p.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: target, VolumeCapability: v.capability, VolumeContext: v.context})
		return err
	}
	unpublish := func(v *vol, target string) error {
		_, err := p.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: target})
		return err
	}
	staged := func(v *vol) bool {
		resp, err := p.node().NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: v.id})
		if status.Code(err) == codes.NotFound {
			return false
		} else if err != nil {
			t.Fatalf("NodeGetVolumeHealth %s: %v", v.id, err)
		}
		for _, e := range resp.GetVolumeHealth().GetHealthStatuses() {
			if e.GetReason() == "StagingLost" {
				t.Errorf("volume %s: staging lost: %s", v.id, e.GetMessage())
			}
		}
		return true
	}
	storeFile := filepath.Join(p.dir, "state", "wasmcsi.db")

	gone := create("gone", "localdir", rwCap)
	goneLoop := create("gone-loop", "loopfile", loopCapability(false))
	live := create("live", "localdir", rwCap)
	liveLoop := create("live-loop", "loopfile", loopCapability(false))
	kept, dropped := targetPath(w, "live"), targetPath(w, "live-2")
	for _, v := range []*vol{gone, goneLoop, live, liveLoop} {
		if err := stage(v); err != nil {
			t.Fatalf("NodeStage %s: %v", v.id, err)
		}
	}
	for _, target := range []string{kept, dropped} {
		if err := publish(live, target); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(kept, "kept"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}

	rounds := []struct {
		name  string
		path  string                     // the staging path or target whose record is lost
		setup func() error               // puts the record back for another attempt
		op    func() error               // the call whose record deletion the kill loses
		back  func(s *state.Store) error // nil when the record came back after the kill
		gone  func() bool                // the running daemon no longer knows the record
	}{
		{
			name: "localdir unstage", path: gone.staging,
			setup: func() error { return stage(gone) }, op: func() error { return unstage(gone) },
			back: func(s *state.Store) error { _, err := s.GetStage(gone.id); return err },
			gone: func() bool { return !staged(gone) },
		},
		{
			name: "loopfile unstage", path: goneLoop.staging,
			setup: func() error { return stage(goneLoop) }, op: func() error { return unstage(goneLoop) },
			back: func(s *state.Store) error { _, err := s.GetStage(goneLoop.id); return err },
			gone: func() bool { return !staged(goneLoop) },
		},
		{
			name: "unpublish", path: dropped,
			setup: func() error { return publish(live, dropped) }, op: func() error { return unpublish(live, dropped) },
			back: func(s *state.Store) error { _, err := s.GetPublish(live.id, dropped); return err },
			gone: func() bool {
				_, err := p.node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: live.id, VolumePath: dropped})
				return status.Code(err) == codes.NotFound
			},
		},
	}
	for _, r := range rounds {
		// The kill must come before the deletion reaches the disk: with the
		// next waited write's sync, or with the checkpoint a second after
		// the first write it does not cover. Waiting out the checkpoint of
		// the earlier writes leaves the call's own second; a machine that
		// stalls through it gets another attempt.
		for attempt := 1; ; attempt++ {
			time.Sleep(1200 * time.Millisecond)
			if err := r.op(); err != nil {
				t.Fatalf("%s: %v", r.name, err)
			}
			p.kill(t)
			s, err := state.Open(storeFile)
			if err != nil {
				t.Fatalf("open the records after the kill: %v", err)
			}
			backErr := r.back(s)
			s.Close()
			p.start(t)
			if backErr == nil {
				break
			}
			if !errors.Is(backErr, state.ErrNotFound) {
				t.Fatal(backErr)
			}
			if attempt == 3 {
				t.Fatalf("%s: the record's deletion reached the disk before the kill in %d attempts", r.name, attempt)
			}
			t.Logf("%s: the deletion reached the disk before the kill; again", r.name)
			if err := r.setup(); err != nil {
				t.Fatal(err)
			}
		}
		if !r.gone() {
			t.Errorf("%s: the record of %s is still there after the restart", r.name, r.path)
		}
		if lines := p.reconciled(r.path); len(lines) != 1 || !strings.Contains(lines[0], "kind=stale-") {
			t.Errorf("%s: start-up reported %s %d times, want once as stale: %q", r.name, r.path, len(lines), lines)
		}
		// The live volumes are neither reported nor touched.
		for _, path := range []string{live.staging, liveLoop.staging, kept} {
			if lines := p.reconciled(path); len(lines) != 0 {
				t.Errorf("%s: start-up reported the live %s: %q", r.name, path, lines)
			}
		}
		if !staged(live) || !staged(liveLoop) {
			t.Fatalf("%s: a live stage lost its record", r.name)
		}
		if b, err := os.ReadFile(filepath.Join(kept, "kept")); err != nil || string(b) != "data" {
			t.Fatalf("%s: data of the live volume: %q, %v", r.name, b, err)
		}
		if _, err := p.node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: live.id, VolumePath: kept}); err != nil {
			t.Errorf("%s: the live publication: %v", r.name, err)
		}
	}

	// Reported once: a later start finds nothing to say.
	p.stop(t)
	p.start(t)
	for _, r := range rounds {
		if lines := p.reconciled(r.path); len(lines) != 0 {
			t.Errorf("%s: reported again at the next start: %q", r.name, lines)
		}
	}
	// The dropped records hold nothing up; the live ones still do.
	for _, v := range []*vol{gone, goneLoop} {
		if _, err := p.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			t.Errorf("DeleteVolume of the unstaged %s: %v", v.id, err)
		}
	}
	_, err := p.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: live.id})
	wantCode(t, err, codes.FailedPrecondition, "in use")

	if err := unpublish(live, kept); err != nil {
		t.Fatal(err)
	}
	for _, v := range []*vol{live, liveLoop} {
		if err := unstage(v); err != nil {
			t.Fatal(err)
		}
		if _, err := p.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			t.Errorf("DeleteVolume %s: %v", v.id, err)
		}
	}
	if ms := mountsUnder(t, w); len(ms) != 0 {
		t.Errorf("mounts left: %v", ms)
	}
}
