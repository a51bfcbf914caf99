package host_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/wasmcsi/wasmcsi/examples/nvmeof/nvmeoftest"
	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The nvmeof backend through the daemon's CSI services on a real fabric:
// nvmet on loopback and the kernel's NVMe/TCP initiator in the same
// machine, the controller and the node in one daemon (VM tier).

// prepareNvmeof gives a csi-sanity target of the nvmeof backend the module
// file the VM tier copied in and a fabric fixture of its own.
func prepareNvmeof(t *testing.T, tc moduletest.Toolchain, name string, o *daemonOptions) bool {
	wasm, why := nvmeoftest.ModuleFile(tc)
	if wasm == "" {
		t.Logf("%s left out: %s", name, why)
		return false
	}
	fx := nvmeoftest.New(t, name)
	*o = daemonOptions{backend: "nvmeof", wasm: wasm, hostcalls: nvmeoftest.HostCalls, config: fx.Config(), extraRoots: fx.Roots()}
	return true
}

// TestNvmeofKill9: the daemon is killed with SIGKILL in the middle of
// ControllerPublish, NodeStage, NodeUnstage and ControllerUnpublish, at
// the moment the kernel shows the call's effect (or, when the call was
// faster than the poll, right after it). After each restart the CO's
// retry succeeds, and at the end no controller, subsystem, namespace or
// allowed host is left.
func TestNvmeofKill9(t *testing.T) {
	fx := nvmeoftest.New(t, "kill")
	if _, err := os.Stat("/dev/loop-control"); err != nil && nvmeoftest.InVM() {
		if out, err := exec.Command("modprobe", "loop").CombinedOutput(); err != nil {
			t.Fatalf("modprobe loop: %v: %s", err, out)
		}
	}
	wasm := nvmeoftest.Module(t, moduletest.Go)
	d := daemontest.New(t, daemontest.Options{Modules: []daemontest.Module{
		{Name: "nvmeof", Wasm: wasm, HostCalls: nvmeoftest.HostCalls, Pool: true, Roots: fx.Roots(), Config: fx.Config()},
	}})
	// The first start compiles the module (about a minute under TCG);
	// later ones load it from the cache.
	if err := d.Spawn(); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitReady(5 * time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nodeID := iscsiTimed(t, "NodeGetInfo", func() (*csi.NodeGetInfoResponse, error) {
		return d.Node().NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	}).GetNodeId()
	if !strings.Contains(nodeID, "nvme_host_nqn=nqn.") {
		t.Fatalf("node ID %q carries no host NQN", nodeID)
	}
	c := iscsiMount("ext4")
	vol := iscsiTimed(t, "CreateVolume", func() (*csi.CreateVolumeResponse, error) {
		return d.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "kill9", VolumeCapabilities: []*csi.VolumeCapability{c},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}})
	}).GetVolume()
	id := vol.GetVolumeId()
	staging := filepath.Join(t.TempDir(), "staging")
	hosts := func() []string {
		for _, h := range fx.Subsystems(t) {
			return h
		}
		return nil
	}
	// killDuring runs call, kills the daemon once cond holds (or the call
	// ended), restarts it and retries the call until it succeeds.
	killDuring := func(what string, cond func() bool, call func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- call() }()
		waitFor(cond, nil2(done))
		d.Kill(true)
		<-done
		// Loading the module from the compilation cache takes tens of
		// seconds under TCG.
		if err := d.Spawn(); err != nil {
			t.Fatal(err)
		}
		if err := d.WaitReady(5 * time.Minute); err != nil {
			t.Fatal(err)
		}
		var err error
		for range 5 {
			if err = call(); err == nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("%s after a kill -9: %v", what, err)
	}
	var publish map[string]string
	killDuring("ControllerPublishVolume", func() bool { return len(hosts()) > 0 }, func() error {
		r, err := d.Controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeID, VolumeCapability: c})
		if err == nil {
			publish = r.GetPublishContext()
		}
		return err
	})
	killDuring("NodeStageVolume", func() bool { return len(fx.Controllers(t)) > 0 }, func() error {
		_, err := d.Node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: c, PublishContext: publish})
		return err
	})
	if cs := fx.Controllers(t); len(cs) != 1 || len(cs[0].Disks) != 1 {
		t.Fatalf("after stage: controllers %+v, want one with one disk", cs)
	}
	if mountsAt(t, staging) != 1 {
		t.Fatalf("staging %s is not mounted once", staging)
	}
	killDuring("NodeUnstageVolume", func() bool { return mountsAt(t, staging) == 0 }, func() error {
		_, err := d.Node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	})
	if cs := fx.Controllers(t); len(cs) != 0 {
		t.Fatalf("controllers left after unstage: %+v", cs)
	}
	killDuring("ControllerUnpublishVolume", func() bool { return len(hosts()) == 0 }, func() error {
		_, err := d.Controller().ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeID})
		return err
	})
	if h := hosts(); len(h) != 0 {
		t.Fatalf("allowed hosts left after unpublish: %v", h)
	}
	// The retried unpublish linked the subsystem to its port again: a new
	// publish and stage work.
	iscsiTimed(t, "ControllerPublishVolume", func() (*csi.ControllerPublishVolumeResponse, error) {
		return d.Controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeID, VolumeCapability: c})
	})
	iscsiTimed(t, "NodeStageVolume", func() (*csi.NodeStageVolumeResponse, error) {
		return d.Node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c, PublishContext: publish})
	})
	iscsiTimed(t, "NodeUnstageVolume", func() (*csi.NodeUnstageVolumeResponse, error) {
		return d.Node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	iscsiTimed(t, "ControllerUnpublishVolume", func() (*csi.ControllerUnpublishVolumeResponse, error) {
		return d.Controller().ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeID})
	})
	iscsiTimed(t, "DeleteVolume", func() (*csi.DeleteVolumeResponse, error) {
		return d.Controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	})
	if cs := fx.Controllers(t); len(cs) != 0 {
		t.Errorf("controllers left: %+v", cs)
	}
	if subs := fx.Subsystems(t); len(subs) != 0 {
		t.Errorf("subsystems left: %v", subs)
	}
	hostEntries, _ := os.ReadDir("/sys/kernel/config/nvmet/hosts")
	for _, h := range hostEntries {
		if strings.Contains(nodeID, h.Name()) {
			t.Errorf("host entry %s left", h.Name())
		}
	}
	if e, _ := os.ReadDir(d.Pool("nvmeof")); slices.ContainsFunc(e, func(e os.DirEntry) bool { return !strings.HasPrefix(e.Name(), ".") }) {
		t.Errorf("pool still holds files")
	}
}

// nil2 turns a result channel into a done channel for waitFor without
// taking the result.
func nil2(done chan error) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		err := <-done
		done <- err
		close(out)
	}()
	return out
}
