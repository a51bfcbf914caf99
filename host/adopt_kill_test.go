package host_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// readOnlyLoops counts the bound read-only loop devices.
func readOnlyLoops(t *testing.T) int {
	t.Helper()
	devs, err := loop.List(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range devs {
		if d.ReadOnly {
			n++
		}
	}
	return n
}

// TestLostPublicationRecordAdopted kills the daemon right after
// NodePublish answered and takes the publication records from its store,
// as a power loss before their sync would (NodePublish does not wait for
// them), then restarts it with reconcile's clean on: start-up must record
// each publication again from the mount table — a localdir and a loopfile
// mount, a loopfile block and a read-only loopfile block publication —
// instead of unmounting it as an orphan, and the volumes must then behave
// as published (DeleteVolume refused, NodeUnpublish releasing all).
func TestLostPublicationRecordAdopted(t *testing.T) {
	p := newProcDaemon(t)
	ctx := callCtx(t)
	w := workDir(t)
	releaseUnder(t, w)
	roBefore := readOnlyLoops(t)

	type vol struct {
		name, id, staging, target string
		capability                *csi.VolumeCapability
		context                   map[string]string
		readOnly                  bool
	}
	// Mount flags are not visible in the mount table, so the record
	// rebuilt has none: the CO's repeat with its flags must still converge.
	withFlags := loopCapability(false)
	withFlags.GetMount().MountFlags = []string{"noatime"}
	vols := []*vol{
		{name: "dir", capability: rwCap},
		{name: "fs", capability: withFlags},
		{name: "block", capability: loopCapability(true)},
		{name: "roblock", capability: loopCapability(true), readOnly: true},
	}
	for _, v := range vols {
		backend := "loopfile"
		if v.name == "dir" {
			backend = "localdir"
		}
		resp, err := p.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: v.name, CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes},
			VolumeCapabilities: []*csi.VolumeCapability{v.capability}, Parameters: map[string]string{backendParam: backend},
		})
		if err != nil {
			t.Fatalf("CreateVolume %s: %v", v.name, err)
		}
		v.id, v.context = resp.GetVolume().GetVolumeId(), resp.GetVolume().GetVolumeContext()
		v.staging, v.target = stagingPath(w, v.name), targetPath(w, v.name)
		if _, err := p.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: v.capability, VolumeContext: v.context}); err != nil {
			t.Fatalf("NodeStage %s: %v", v.name, err)
		}
		if _, err := p.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: v.capability, VolumeContext: v.context, Readonly: v.readOnly}); err != nil {
			t.Fatalf("NodePublish %s: %v", v.name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(vols[0].target, "kept"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}

	p.kill(t)
	// The power loss: the publication records never reached the disk (the
	// last may indeed not have).
	s, err := state.Open(filepath.Join(p.dir, "state", "wasmcsi.db"))
	if err != nil {
		t.Fatalf("open the records after the kill: %v", err)
	}
	for _, v := range vols {
		if err := s.DeletePublish(v.id, v.target); err != nil && !errors.Is(err, state.ErrNotFound) {
			t.Errorf("lose the record of %s: %v", v.name, err)
		}
	}
	s.Close()
	p.Clean = true
	p.start(t)

	for _, v := range vols {
		if mounted, err := mountinfo.Mounted(v.target); err != nil || !mounted {
			t.Errorf("%s: target mounted after the restart: %v, %v", v.name, mounted, err)
		}
		if lines := p.reconciled(v.target); len(lines) != 1 || !strings.Contains(lines[0], "kind=adopted-publication") {
			t.Errorf("%s: start-up reported %s %d times, want once as adopted: %q", v.name, v.target, len(lines), lines)
		}
		_, err := p.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: DeleteVolume of a published volume: %v, want FailedPrecondition", v.name, err)
		}
		// A repeat with the CO's arguments converges on the adopted record,
		// and the record then holds them: one with other arguments is
		// refused.
		req := &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: v.capability, VolumeContext: v.context, Readonly: v.readOnly}
		if _, err := p.node().NodePublishVolume(ctx, req); err != nil {
			t.Errorf("%s: repeated NodePublish: %v", v.name, err)
		}
		req.Readonly = !req.Readonly
		if _, err := p.node().NodePublishVolume(ctx, req); status.Code(err) != codes.AlreadyExists {
			t.Errorf("%s: NodePublish with another read-only flag: %v, want AlreadyExists", v.name, err)
		}
		if v.name == "fs" {
			other := proto.Clone(v.capability).(*csi.VolumeCapability)
			other.GetMount().MountFlags = []string{"nodiratime"}
			req.Readonly, req.VolumeCapability = v.readOnly, other
			if _, err := p.node().NodePublishVolume(ctx, req); status.Code(err) != codes.AlreadyExists {
				t.Errorf("%s: NodePublish with other mount flags after the repeat: %v, want AlreadyExists", v.name, err)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(vols[0].target, "kept")); err != nil || string(b) != "data" {
		t.Errorf("data of the localdir volume: %q, %v", b, err)
	}
	if got := readOnlyLoops(t); got != roBefore+1 {
		t.Errorf("%d read-only loop devices while the read-only block volume is published, want %d", got, roBefore+1)
	}

	for _, v := range vols {
		if _, err := p.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
			t.Fatalf("NodeUnpublish %s: %v", v.name, err)
		}
		if mounted, err := mountinfo.Mounted(v.target); err == nil && mounted {
			t.Errorf("%s: target still mounted after NodeUnpublish", v.name)
		}
		if _, err := p.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
			t.Fatalf("NodeUnstage %s: %v", v.name, err)
		}
		if _, err := p.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			t.Errorf("DeleteVolume %s: %v", v.name, err)
		}
	}
	if got := readOnlyLoops(t); got != roBefore {
		t.Errorf("%d read-only loop devices after the unpublish, want %d", got, roBefore)
	}
}
