package host_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/examples/iscsi/iscsitest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The iscsi backend through the daemon's CSI services, on a real SAN: the
// kernel's LIO target on loopback and open-iscsi's initiator in the same
// machine, the controller and the node in one daemon (VM tier).

// iscsiOptions serves the iscsi module built with tc on the fixture's
// target.
func iscsiOptions(wasm string, fx *iscsitest.Fixture) daemonOptions {
	return daemonOptions{backend: "iscsi", wasm: wasm, hostcalls: iscsitest.HostCalls, config: fx.Config(), extraRoots: fx.Roots()}
}

// iscsiDaemon starts a daemon serving the iscsi module (standard Go) on a
// fixture named name; the fixture's cleanup runs after the daemon stopped.
func iscsiDaemon(t *testing.T, name string) (*daemon, *iscsitest.Fixture) {
	t.Helper()
	fx := iscsitest.New(t, name)
	return startDaemon(t, iscsiOptions(iscsitest.Module(t, moduletest.Go), fx)), fx
}

// prepareIscsi gives a csi-sanity target of the iscsi backend the module
// file the VM tier copied in and a SAN fixture of its own.
func prepareIscsi(t *testing.T, tc moduletest.Toolchain, name string, o *daemonOptions) bool {
	wasm, why := iscsitest.ModuleFile(tc)
	if wasm == "" {
		t.Logf("%s left out: %s", name, why)
		return false
	}
	*o = iscsiOptions(wasm, iscsitest.New(t, name))
	return true
}

// iscsiTimed runs a CSI call, logs its time and fails the test on an error.
func iscsiTimed[T any](t *testing.T, what string, call func() (T, error)) T {
	t.Helper()
	var out T
	var err error
	iscsitest.Timed(t, "csi "+what, func() { out, err = call() })
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return out
}

func iscsiMount(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

var iscsiBlock = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// iscsiVolume is one volume of these tests and where it is staged.
type iscsiVolume struct {
	id, staging string
	capability  *csi.VolumeCapability
	publish     map[string]string
}

// iscsiCreateAndStage creates, publishes to nodeID and stages a volume.
func iscsiCreateAndStage(t *testing.T, d *daemon, nodeID, name string, c *csi.VolumeCapability, size int64) *iscsiVolume {
	t.Helper()
	ctx := context.Background()
	v := &iscsiVolume{capability: c, staging: filepath.Join(t.TempDir(), "staging")}
	v.id = iscsiTimed(t, "CreateVolume", func() (*csi.CreateVolumeResponse, error) {
		return d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{c},
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
	}).GetVolume().GetVolumeId()
	v.publish = iscsiTimed(t, "ControllerPublishVolume", func() (*csi.ControllerPublishVolumeResponse, error) {
		return d.controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: nodeID, VolumeCapability: c})
	}).GetPublishContext()
	what := "NodeStageVolume (login, mkfs, mount)"
	if c.GetBlock() != nil {
		what = "NodeStageVolume (login, block)"
	}
	iscsiTimed(t, what, func() (*csi.NodeStageVolumeResponse, error) {
		return d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
			VolumeCapability: c, PublishContext: v.publish})
	})
	return v
}

func (v *iscsiVolume) unstage(t *testing.T, d *daemon) {
	t.Helper()
	iscsiTimed(t, "NodeUnstageVolume", func() (*csi.NodeUnstageVolumeResponse, error) {
		return d.node().NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
	})
}

func (v *iscsiVolume) unpublishAndDelete(t *testing.T, d *daemon, nodeID string) {
	t.Helper()
	ctx := context.Background()
	iscsiTimed(t, "ControllerUnpublishVolume", func() (*csi.ControllerUnpublishVolumeResponse, error) {
		return d.controller().ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: nodeID})
	})
	iscsiTimed(t, "DeleteVolume", func() (*csi.DeleteVolumeResponse, error) {
		return d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
	})
}

// iscsiNodeID asks the node for its ID, which carries its initiator name.
func iscsiNodeID(t *testing.T, d *daemon) string {
	t.Helper()
	id := iscsiTimed(t, "NodeGetInfo", func() (*csi.NodeGetInfoResponse, error) {
		return d.node().NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	}).GetNodeId()
	if !strings.Contains(id, "iscsi_initiator=iqn.") {
		t.Fatalf("node ID %q carries no initiator name", id)
	}
	return id
}

// writeSynced writes a file and makes it durable: with the disk gone, the
// fsync would fail.
func writeSynced(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIscsiTwoVolumesShareOneSession: two volumes on one target share one
// session; unstaging the first leaves the second reading and writing over
// the same session, and unstaging the second ends the session
// (/sys/class/iscsi_session).
func TestIscsiTwoVolumesShareOneSession(t *testing.T) {
	d, fx := iscsiDaemon(t, "shared")
	nodeID := iscsiNodeID(t, d)
	a := iscsiCreateAndStage(t, d, nodeID, "shared-a", iscsiMount("ext4"), 32<<20)
	ss := fx.Sessions(t)
	if len(ss) != 1 || len(ss[0].Disks) != 1 {
		t.Fatalf("after staging one volume: sessions %+v, want one session with one disk", ss)
	}
	first := ss[0].ID
	b := iscsiCreateAndStage(t, d, nodeID, "shared-b", iscsiMount("ext4"), 32<<20)
	ss = fx.Sessions(t)
	if len(ss) != 1 || ss[0].ID != first || len(ss[0].Disks) != 2 {
		t.Fatalf("after staging two volumes: sessions %+v, want session %d with two disks", ss, first)
	}
	dataA, dataB := bytes.Repeat([]byte("volume a\n"), 1000), bytes.Repeat([]byte("volume b\n"), 1000)
	writeSynced(t, filepath.Join(a.staging, "data"), dataA)
	writeSynced(t, filepath.Join(b.staging, "data"), dataB)

	a.unstage(t, d)
	ss = fx.Sessions(t)
	if len(ss) != 1 || ss[0].ID != first || ss[0].State != "LOGGED_IN" || len(ss[0].Disks) != 1 {
		t.Fatalf("after unstaging the first volume: sessions %+v, want session %d logged in with one disk", ss, first)
	}
	if got := readFile(t, filepath.Join(b.staging, "data")); !bytes.Equal(got, dataB) {
		t.Fatal("the second volume lost its data when the first was unstaged")
	}
	more := bytes.Repeat([]byte("still here\n"), 20000)
	writeSynced(t, filepath.Join(b.staging, "more"), more)
	syncFS(t, b.staging)
	if got := readFile(t, filepath.Join(b.staging, "more")); !bytes.Equal(got, more) {
		t.Fatal("the second volume does not read back what it wrote after the first left")
	}

	b.unstage(t, d)
	if ss := fx.Sessions(t); len(ss) != 0 {
		t.Fatalf("after unstaging the last volume: sessions %+v, want none", ss)
	}
	a.unpublishAndDelete(t, d, nodeID)
	b.unpublishAndDelete(t, d, nodeID)
	if _, err := os.Stat(filepath.Join("/sys/kernel/config/target/iscsi", fx.Target)); !os.IsNotExist(err) {
		t.Fatalf("target %s left after its last volume was deleted: %v", fx.Target, err)
	}
	if ents, _ := os.ReadDir(d.pool); len(ents) != 0 {
		t.Fatalf("pool holds %d files after every volume was deleted", len(ents))
	}
}

// syncFS flushes the whole filesystem mounted at dir to its disk, and
// closes the folder again at once (an open folder would keep the mount busy).
func syncFS(t *testing.T, dir string) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatalf("syncfs %s: %v", dir, err)
	}
}

// TestIscsiExpandRestoreRestart grows a mounted volume online, restores a
// snapshot of it into a new volume that holds its data, publishes a raw
// block volume, and restarts the daemon with everything staged: repeated
// stages converge on the sessions and mounts already there.
func TestIscsiExpandRestoreRestart(t *testing.T) {
	d, fx := iscsiDaemon(t, "expand")
	ctx := context.Background()
	nodeID := iscsiNodeID(t, d)
	v := iscsiCreateAndStage(t, d, nodeID, "grow", iscsiMount("ext4"), 32<<20)
	data := bytes.Repeat([]byte("before the snapshot\n"), 500)
	writeSynced(t, filepath.Join(v.staging, "data"), data)

	resp := iscsiTimed(t, "ControllerExpandVolume", func() (*csi.ControllerExpandVolumeResponse, error) {
		return d.controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapability: v.capability})
	})
	if resp.GetCapacityBytes() != 64<<20 || !resp.GetNodeExpansionRequired() {
		t.Fatalf("controller expansion: %+v", resp)
	}
	var before unix.Statfs_t
	if err := unix.Statfs(v.staging, &before); err != nil {
		t.Fatal(err)
	}
	iscsiTimed(t, "NodeExpandVolume (rescan, ext4 online by ioctl)", func() (*csi.NodeExpandVolumeResponse, error) {
		return d.node().NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: v.id, VolumePath: v.staging,
			StagingTargetPath: v.staging, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapability: v.capability})
	})
	var after unix.Statfs_t
	if err := unix.Statfs(v.staging, &after); err != nil {
		t.Fatal(err)
	}
	if gain := int64(after.Blocks-before.Blocks) * int64(after.Bsize); gain < 28<<20 {
		t.Fatalf("the mounted filesystem grew by %d bytes, want about 32 MiB", gain)
	}

	snap := iscsiTimed(t, "CreateSnapshot", func() (*csi.CreateSnapshotResponse, error) {
		return d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "grow-snap", SourceVolumeId: v.id})
	}).GetSnapshot()
	restored := &iscsiVolume{capability: iscsiMount("ext4"), staging: filepath.Join(t.TempDir(), "staging")}
	restored.id = iscsiTimed(t, "CreateVolume (from snapshot)", func() (*csi.CreateVolumeResponse, error) {
		return d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities:  []*csi.VolumeCapability{restored.capability},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()}}}})
	}).GetVolume().GetVolumeId()
	restored.publish = iscsiTimed(t, "ControllerPublishVolume", func() (*csi.ControllerPublishVolumeResponse, error) {
		return d.controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: restored.id, NodeId: nodeID, VolumeCapability: restored.capability})
	}).GetPublishContext()
	stageRestored := func() {
		iscsiTimed(t, "NodeStageVolume (login, existing fs, mount)", func() (*csi.NodeStageVolumeResponse, error) {
			return d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: restored.id, StagingTargetPath: restored.staging,
				VolumeCapability: restored.capability, PublishContext: restored.publish})
		})
	}
	stageRestored()
	if got := readFile(t, filepath.Join(restored.staging, "data")); !bytes.Equal(got, data) {
		t.Fatal("the volume restored from the snapshot does not hold the snapshot's data")
	}

	raw := iscsiCreateAndStage(t, d, nodeID, "raw", iscsiBlock, 16<<20)
	target := filepath.Join(t.TempDir(), "dev")
	iscsiTimed(t, "NodePublishVolume (block)", func() (*csi.NodePublishVolumeResponse, error) {
		return d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: raw.id, StagingTargetPath: raw.staging,
			TargetPath: target, VolumeCapability: raw.capability, PublishContext: raw.publish})
	})
	f, err := os.OpenFile(target, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	block := bytes.Repeat([]byte{0xa5}, 1<<20)
	if _, err := f.WriteAt(block, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if ss := fx.Sessions(t); len(ss) != 1 || len(ss[0].Disks) != 3 {
		t.Fatalf("three staged volumes: sessions %+v, want one session with three disks", ss)
	}

	// A restart of the daemon keeps sessions and mounts; stages repeated
	// by the CO converge on them.
	d.restart(t)
	stageRestored()
	if ss := fx.Sessions(t); len(ss) != 1 || len(ss[0].Disks) != 3 {
		t.Fatalf("after a restart and a repeated stage: sessions %+v, want the same one with three disks", ss)
	}
	iscsiTimed(t, "NodeUnpublishVolume (block)", func() (*csi.NodeUnpublishVolumeResponse, error) {
		return d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: raw.id, TargetPath: target})
	})
	for _, x := range []*iscsiVolume{v, restored, raw} {
		x.unstage(t, d)
	}
	if ss := fx.Sessions(t); len(ss) != 0 {
		t.Fatalf("after unstaging everything: sessions %+v", ss)
	}
	for _, x := range []*iscsiVolume{v, restored, raw} {
		x.unpublishAndDelete(t, d, nodeID)
	}
	iscsiTimed(t, "DeleteSnapshot", func() (*csi.DeleteSnapshotResponse, error) {
		return d.controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
	})
}

// lunWriteCache reads the write cache LIO reports for LUN lun of target:
// the emulate_write_cache attribute of the backstore the LUN links to.
func lunWriteCache(t *testing.T, target, lun string) string {
	t.Helper()
	dir := filepath.Join("/sys/kernel/config/target/iscsi", target, "tpgt_1", "lun", "lun_"+lun)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		bs, err := filepath.EvalSymlinks(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(bs, "attrib", "emulate_write_cache"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	t.Fatalf("LUN %s of %s links to no backstore", lun, target)
	return ""
}

// diskWriteCache rescans the node's disk of the volume (as a node's
// expansion step does) and reads the cache mode its kernel now uses.
func diskWriteCache(t *testing.T, fx *iscsitest.Fixture, lun string) string {
	t.Helper()
	ss := fx.Sessions(t)
	if len(ss) != 1 {
		t.Fatalf("sessions %+v, want one", ss)
	}
	var disk string
	for l, d := range ss[0].Disks {
		if strconv.Itoa(l) == lun {
			disk = d
		}
	}
	if disk == "" {
		t.Fatalf("no disk for LUN %s in %+v", lun, ss[0])
	}
	if err := os.WriteFile(filepath.Join("/sys/block", disk, "device", "rescan"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", disk, "queue", "write_cache"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestIscsiModifyWriteCache: ControllerModifyVolume's writeCache changes
// the write cache the volume's LUN reports in the target's configfs, live
// while the node uses it, and the node's kernel switches its disk between
// write through and write back at its next rescan.
func TestIscsiModifyWriteCache(t *testing.T) {
	d, fx := iscsiDaemon(t, "cache")
	ctx := context.Background()
	nodeID := iscsiNodeID(t, d)
	v := iscsiCreateAndStage(t, d, nodeID, "cache", iscsiBlock, 16<<20)
	lun := v.publish["lun"]
	if got := lunWriteCache(t, fx.Target, lun); got != "0" {
		t.Fatalf("a new volume's LUN reports emulate_write_cache %s, want 0", got)
	}
	if got := diskWriteCache(t, fx, lun); got != "write through" {
		t.Fatalf("the node's disk of a new volume is %q, want write through", got)
	}
	for _, tc := range []struct{ value, attr, mode string }{
		{"true", "1", "write back"},
		{"true", "1", "write back"},
		{"false", "0", "write through"},
	} {
		iscsiTimed(t, "ControllerModifyVolume writeCache="+tc.value, func() (*csi.ControllerModifyVolumeResponse, error) {
			return d.controller().ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: v.id,
				MutableParameters: map[string]string{"writeCache": tc.value}})
		})
		if got := lunWriteCache(t, fx.Target, lun); got != tc.attr {
			t.Fatalf("after writeCache=%s: emulate_write_cache %s, want %s", tc.value, got, tc.attr)
		}
		if got := diskWriteCache(t, fx, lun); got != tc.mode {
			t.Fatalf("after writeCache=%s: the node's disk is %q, want %q", tc.value, got, tc.mode)
		}
	}
	v.unstage(t, d)
	v.unpublishAndDelete(t, d, nodeID)
}
