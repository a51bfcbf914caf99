package host_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// The kill -9 tests run the real daemon program (procDaemon) and kill it
// with SIGKILL in the middle of an ephemeral NodePublish or
// NodeUnpublish: no deferred function, no clean close of the records.

// wantProcNothingLeft checks the pools, loop devices and mounts of the
// daemon and the target, as wantNothingLeft does for a daemon in this
// process.
func wantProcNothingLeft(t *testing.T, p *procDaemon, target string) {
	t.Helper()
	for _, name := range []string{"localdir", "loopfile"} {
		pool := filepath.Join(p.dir, "pools", name)
		entries, _ := os.ReadDir(pool)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				t.Errorf("%s pool still holds %s", name, e.Name())
			}
		}
		for _, dev := range loopsUnder(t, pool) {
			t.Errorf("loop device %s still backs %s", dev.Path, dev.BackingFile)
		}
	}
	if ms := mountsUnder(t, p.dir); len(ms) != 0 {
		t.Errorf("still mounted: %v", ms)
	}
	if n := mountsAt(t, target); n != 0 {
		t.Errorf("%d mounts at the target %s", n, target)
	}
	entries, _ := os.ReadDir(filepath.Join(p.dir, "state", "ephemeral"))
	for _, e := range entries {
		t.Errorf("staging folder %s left", e.Name())
	}
}

// waitFor polls cond every millisecond until it holds or the call ends.
func waitFor(cond func() bool, done <-chan struct{}) bool {
	for {
		if cond() {
			return true
		}
		select {
		case <-done:
			return cond()
		case <-time.After(time.Millisecond):
		}
	}
}

// TestEphemeralKill9: the daemon is killed with SIGKILL at points of an
// ephemeral NodePublish (the volume file made, its loop device attached,
// its staging mount made) and of an ephemeral NodeUnpublish (the target
// unmounted). After the restart nothing is left behind, and the CO's retry
// of the call succeeds: the publish makes a working volume, the unpublish
// (of a volume already taken down) answers success, and a last unpublish
// leaves nothing.
func TestEphemeralKill9(t *testing.T) {
	p := newProcDaemon(t)
	work := workDir(t)
	pool := filepath.Join(p.dir, "pools", "loopfile")
	hasFile := func() bool {
		e, _ := os.ReadDir(pool)
		return slices.ContainsFunc(e, func(e os.DirEntry) bool { return !strings.HasPrefix(e.Name(), ".") })
	}
	hasLoop := func() bool { return len(loopsUnder(t, pool)) > 0 }
	hasStage := func() bool { return len(mountsUnder(t, filepath.Join(p.dir, "state"))) > 0 }
	attrs := map[string]string{backendParam: "loopfile", "size": "400Mi"}
	for _, kp := range []struct {
		name  string
		cond  func() bool
		early bool // the point comes well before the call can answer
	}{
		{"volume-file", hasFile, true},
		{"loop-device", hasLoop, true},
		{"staging-mount", hasStage, false},
	} {
		t.Run("publish-"+kp.name, func(t *testing.T) {
			id := "csi-kill-publish-" + kp.name
			target := targetPath(work, kp.name)
			req := ephemeralRequest(id, target, "xfs", attrs)
			done := make(chan error, 1)
			go func() {
				_, err := p.node().NodePublishVolume(context.Background(), req)
				done <- err
			}()
			answered := make(chan struct{})
			var callErr error
			go func() { callErr = <-done; close(answered) }()
			if !waitFor(kp.cond, answered) {
				<-answered
				t.Fatalf("the publish ended (%v) before the kill point", callErr)
			}
			p.kill(t)
			<-answered
			p.start(t)
			switch {
			case callErr != nil && !kp.early && mountsAt(t, target) == 1:
				// The kill landed after the publish was done and recorded,
				// only its answer was lost: the volume stays published,
				// and the retry below finds it so.
				t.Log("the publish was done before the kill landed; its answer was lost")
			case callErr != nil:
				// Never done: start-up took it all down.
				wantProcNothingLeft(t, p, target)
			case kp.early:
				t.Fatal("the publish answered success before the kill")
			default:
				t.Log("the publish answered before the kill landed")
			}

			// The CO retries the publish until it succeeds: a working
			// volume. A program the dead daemon started (mkfs) may still
			// hold the volume's loop device for a moment, and the host
			// answers FAILED_PRECONDITION until it lets go.
			ctx := callCtx(t)
			for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
				_, err := p.node().NodePublishVolume(ctx, req)
				if err == nil {
					break
				}
				if time.Since(start) > 20*time.Second {
					t.Fatalf("retried NodePublish for 20 s: %v", err)
				}
				t.Logf("retried NodePublish: %v", err)
			}
			if n := mountsAt(t, target); n != 1 {
				t.Fatalf("%d mounts at the target after the retry", n)
			}
			if err := os.WriteFile(filepath.Join(target, "kept"), []byte(kp.name), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := p.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatal(err)
			}
			wantProcNothingLeft(t, p, target)
		})
	}

	t.Run("unpublish", func(t *testing.T) {
		id := "csi-kill-unpublish"
		target := targetPath(work, "unpublish")
		ctx := callCtx(t)
		if _, err := p.node().NodePublishVolume(ctx, ephemeralRequest(id, target, "xfs", attrs)); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		var callErr error
		go func() {
			_, callErr = p.node().NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			close(done)
		}()
		if !waitFor(func() bool { return mountsAt(t, target) == 0 }, done) {
			t.Fatal("the target never went")
		}
		p.kill(t)
		<-done
		if callErr == nil {
			t.Log("the unpublish answered before the kill landed")
		}
		p.start(t)
		wantProcNothingLeft(t, p, target)
		for i := range 2 {
			if _, err := p.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatalf("retried NodeUnpublish #%d: %v", i+1, err)
			}
		}
		wantProcNothingLeft(t, p, target)
	})
}
