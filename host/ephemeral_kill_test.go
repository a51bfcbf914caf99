package host_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

// The kill -9 tests run the real daemon, cmd/wasmcsi built as a program,
// and kill it with SIGKILL in the middle of an ephemeral NodePublish or
// NodeUnpublish: no deferred function, no clean close of the records.

var daemonBinary struct {
	once sync.Once
	path string
	skip string
	err  error
}

// wasmcsiBinary builds cmd/wasmcsi once per test binary.
func wasmcsiBinary(t *testing.T) string {
	t.Helper()
	daemonBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "wcsi-bin-")
		if err != nil {
			daemonBinary.err = err
			return
		}
		goTool, err := exec.LookPath("go")
		if err != nil && os.Getenv("GOROOT") != "" {
			goTool, err = filepath.Join(os.Getenv("GOROOT"), "bin", "go"), nil
		}
		if err != nil {
			daemonBinary.skip = "needs the go tool in PATH (or GOROOT) to build the daemon: " + err.Error()
			return
		}
		daemonBinary.path = filepath.Join(dir, "wasmcsi")
		out, err := exec.Command(goTool, "build", "-o", daemonBinary.path, "../cmd/wasmcsi").CombinedOutput()
		if err != nil {
			daemonBinary.err = fmt.Errorf("go build ../cmd/wasmcsi: %v: %s", err, out)
		}
	})
	if daemonBinary.skip != "" {
		t.Skip(daemonBinary.skip)
	}
	if daemonBinary.err != nil {
		t.Fatal(daemonBinary.err)
	}
	return daemonBinary.path
}

// processDaemon is the wasmcsi program serving loopfile and localdir from
// a folder of its own.
type processDaemon struct {
	t       *testing.T
	bin     string
	dir     string
	config  string
	socket  string
	pools   map[string]string
	cmd     *exec.Cmd
	exited  chan struct{}
	conn    *grpc.ClientConn
	logFile *os.File
}

func startProcessDaemon(t *testing.T) *processDaemon {
	t.Helper()
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	bin := wasmcsiBinary(t)
	dir, err := os.MkdirTemp("", "wcsi-proc-")
	if err != nil {
		t.Fatal(err)
	}
	d := &processDaemon{t: t, bin: bin, dir: dir, socket: filepath.Join(dir, "csi.sock"), pools: map[string]string{}}
	t.Cleanup(func() { os.RemoveAll(dir) })
	releaseUnder(t, dir)
	modules := filepath.Join(dir, "modules")
	if err := os.MkdirAll(modules, 0o755); err != nil {
		t.Fatal(err)
	}
	grants := map[string]string{}
	for _, m := range []struct{ name, hostcalls, config string }{
		{"loopfile", "[file, loop]", "{}"},
		{"localdir", "[dir]", `{quota: "off"}`},
	} {
		data, err := os.ReadFile(moduletest.Build(t, "../examples/"+m.name, moduletest.Go))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(modules, m.name+".wasm"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		d.pools[m.name] = filepath.Join(dir, "pools", m.name)
		grants[m.name] = fmt.Sprintf("  %s:\n    hostcalls: %s\n    roots: [%s]\n    config: %s\n", m.name, m.hostcalls, d.pools[m.name], m.config)
	}
	cfg := fmt.Sprintf(`endpoint: unix://%s
node_id: kill-node
role: all
state_dir: %s
module_dir: %s
cache_dir: %s
watch_modules: false
default_backend: loopfile
modules:
%s%s`, d.socket, filepath.Join(dir, "state"), modules, filepath.Join(os.TempDir(), "wasmcsi-test-cache"), grants["loopfile"], grants["localdir"])
	d.config = filepath.Join(dir, "wasmcsi.yaml")
	if err := os.WriteFile(d.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if d.logFile, err = os.Create(filepath.Join(dir, "daemon.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			if log, err := os.ReadFile(d.logFile.Name()); err == nil {
				t.Logf("daemon log:\n%s", log)
			}
		}
		d.logFile.Close()
	})
	d.start()
	return d
}

// start runs the program and connects once it answers Probe.
func (d *processDaemon) start() {
	t := d.t
	t.Helper()
	cmd := exec.Command(d.bin, "serve", "--config", d.config)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CSI_ENDPOINT=") && !strings.HasPrefix(kv, "WASMCSI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = d.logFile, d.logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.cmd, d.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(d.exited) }()
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	d.conn = conn
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return
		}
		select {
		case <-d.exited:
			t.Fatalf("daemon exited at start-up: %v", cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready after 60 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (d *processDaemon) kill() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d.conn.Close()
	d.cmd = nil
}

// stop ends the program gracefully.
func (d *processDaemon) stop() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		d.t.Error("daemon did not stop on SIGTERM")
		d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.exited
	}
	d.conn.Close()
	d.cmd = nil
}

func (d *processDaemon) node() csi.NodeClient { return csi.NewNodeClient(d.conn) }

// wantNothingLeft checks the pools, loop devices and mounts of the daemon
// and the target, as wantNothingLeft does for an in-process daemon.
func (d *processDaemon) wantNothingLeft(t *testing.T, target string) {
	t.Helper()
	for name, pool := range d.pools {
		entries, _ := os.ReadDir(pool)
		for _, e := range entries {
			t.Errorf("%s pool still holds %s", name, e.Name())
		}
		for _, dev := range loopsUnder(t, pool) {
			t.Errorf("loop device %s still backs %s", dev.Path, dev.BackingFile)
		}
	}
	if ms := mountsUnder(t, d.dir); len(ms) != 0 {
		t.Errorf("still mounted: %v", ms)
	}
	if n := mountsAt(t, target); n != 0 {
		t.Errorf("%d mounts at the target %s", n, target)
	}
	entries, _ := os.ReadDir(filepath.Join(d.dir, "state", "ephemeral"))
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
	d := startProcessDaemon(t)
	work := workDir(t)
	pool := d.pools["loopfile"]
	hasFile := func() bool { e, _ := os.ReadDir(pool); return len(e) > 0 }
	hasLoop := func() bool { return len(loopsUnder(t, pool)) > 0 }
	hasStage := func() bool { return len(mountsUnder(t, filepath.Join(d.dir, "state"))) > 0 }
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
			req := ephemeralRequest(id, target, "xfs", map[string]string{"size": "400Mi"})
			done := make(chan error, 1)
			go func() {
				_, err := d.node().NodePublishVolume(context.Background(), req)
				done <- err
			}()
			answered := make(chan struct{})
			var callErr error
			go func() { callErr = <-done; close(answered) }()
			if !waitFor(kp.cond, answered) {
				<-answered
				t.Fatalf("the publish ended (%v) before the kill point", callErr)
			}
			d.kill()
			<-answered
			d.start()
			switch {
			case callErr != nil:
				// Never answered success: start-up took it all down.
				d.wantNothingLeft(t, target)
			case kp.early:
				t.Fatal("the publish answered success before the kill")
			default:
				t.Log("the publish answered before the kill landed")
			}

			// The CO retries the publish: a working volume.
			ctx := callCtx(t)
			if _, err := d.node().NodePublishVolume(ctx, req); err != nil {
				t.Fatalf("retried NodePublish: %v", err)
			}
			if n := mountsAt(t, target); n != 1 {
				t.Fatalf("%d mounts at the target after the retry", n)
			}
			if err := os.WriteFile(filepath.Join(target, "kept"), []byte(kp.name), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatal(err)
			}
			d.wantNothingLeft(t, target)
		})
	}

	t.Run("unpublish", func(t *testing.T) {
		id := "csi-kill-unpublish"
		target := targetPath(work, "unpublish")
		ctx := callCtx(t)
		if _, err := d.node().NodePublishVolume(ctx, ephemeralRequest(id, target, "xfs", map[string]string{"size": "400Mi"})); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		var callErr error
		go func() {
			_, callErr = d.node().NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			close(done)
		}()
		if !waitFor(func() bool { return mountsAt(t, target) == 0 }, done) {
			t.Fatal("the target never went")
		}
		d.kill()
		<-done
		if callErr == nil {
			t.Log("the unpublish answered before the kill landed")
		}
		d.start()
		d.wantNothingLeft(t, target)
		for i := range 2 {
			if _, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatalf("retried NodeUnpublish #%d: %v", i+1, err)
			}
		}
		d.wantNothingLeft(t, target)
	})
}
