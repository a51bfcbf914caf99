package host_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/examples/lvm/lvmmodule"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmtest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The lvm backend on a real volume group, through the daemon's CSI
// services (VM tier: LVM2 on loop devices).

func lvmOptions(wasm string, fx *lvmtest.Fixture) daemonOptions {
	return daemonOptions{backend: "lvm", wasm: wasm, hostcalls: lvmmodule.HostCalls, config: lvmmodule.Config(fx), extraRoots: fx.Roots()}
}

// lvNames lists the VG's LVs as the operator sees them.
func lvNames(t *testing.T, vg string) string {
	t.Helper()
	out := lvmtest.Run(t, "lvs", "--noheadings", "-o", "lv_name", "--", vg)
	return strings.Join(strings.Fields(string(out)), " ")
}

// A day of an lvm backend: refusals that create nothing, a thin volume
// mounted, written and expanded online, a snapshot restored into a larger
// volume (the filesystem grown at stage) and a clone with their content
// checked, a thick block volume, a restart with start-up reconciliation
// cleaning, and the operator's own LV in the same VG untouched by all of it.
func TestLvmVolumes(t *testing.T) {
	requireRoot(t)
	fx := lvmtest.New(t, "life", 1<<30, 512<<20)
	wasm := lvmmodule.Module(t, moduletest.Go)
	d := startDaemon(t, lvmOptions(wasm, fx))
	ctx := context.Background()
	ctl, node := d.controller(), d.node()
	const mib = 1 << 20
	before := lvNames(t, fx.VG)

	code := func(err error) codes.Code { return status.Code(err) }
	_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "huge", VolumeCapabilities: []*csi.VolumeCapability{blockAccess},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}, Parameters: map[string]string{"deviceClass": "thick"}})
	if code(err) != codes.ResourceExhausted {
		t.Errorf("a thick volume beyond the VG's free space: %v", err)
	}
	_, err = ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "nowhere", VolumeCapabilities: []*csi.VolumeCapability{blockAccess},
		Parameters: map[string]string{"deviceClass": "fast"}})
	if code(err) != codes.InvalidArgument {
		t.Errorf("an unknown device class: %v", err)
	}
	if got := lvNames(t, fx.VG); got != before {
		t.Errorf("refused creates left LVs: %s, before %s", got, before)
	}

	work := t.TempDir()
	type staged struct{ id, staging, target string }
	var all []staged
	t.Cleanup(func() {
		for _, s := range all {
			node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: s.id, TargetPath: s.target})
			node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: s.id, StagingTargetPath: s.staging})
		}
	})
	publish := func(v *csi.Volume, capability *csi.VolumeCapability) staged {
		t.Helper()
		s := staged{id: v.GetVolumeId(), staging: filepath.Join(work, v.GetVolumeId()+".s"), target: filepath.Join(work, v.GetVolumeId()+".t")}
		all = append(all, s)
		timed(t, "NodeStageVolume", func() (*csi.NodeStageVolumeResponse, error) {
			return node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: s.id, StagingTargetPath: s.staging,
				VolumeCapability: capability, VolumeContext: v.GetVolumeContext()})
		})
		timed(t, "NodePublishVolume", func() (*csi.NodePublishVolumeResponse, error) {
			return node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: s.id, StagingTargetPath: s.staging, TargetPath: s.target,
				VolumeCapability: capability, VolumeContext: v.GetVolumeContext()})
		})
		return s
	}
	release := func(s staged) {
		t.Helper()
		timed(t, "NodeUnpublishVolume", func() (*csi.NodeUnpublishVolumeResponse, error) {
			return node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: s.id, TargetPath: s.target})
		})
		timed(t, "NodeUnstageVolume", func() (*csi.NodeUnstageVolumeResponse, error) {
			return node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: s.id, StagingTargetPath: s.staging})
		})
	}
	fsSize := func(path string) int64 {
		t.Helper()
		st := timed(t, "NodeGetVolumeStats", func() (*csi.NodeGetVolumeStatsResponse, error) {
			for _, s := range all {
				if s.target == path {
					return node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: s.id, VolumePath: path})
				}
			}
			t.Fatalf("no volume at %s", path)
			return nil, nil
		})
		for _, u := range st.GetUsage() {
			if u.GetUnit() == csi.VolumeUsage_BYTES {
				return u.GetTotal()
			}
		}
		t.Fatalf("no byte usage in %v", st)
		return 0
	}
	readFile := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	// A thin mount volume, written, then expanded online.
	a := timed(t, "CreateVolume (thin, 64 MiB)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-a", VolumeCapabilities: []*csi.VolumeCapability{mountAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}, Parameters: map[string]string{"deviceClass": "thin"}})
	}).GetVolume()
	if !strings.Contains(lvNames(t, fx.VG), "v-pvc-a-") {
		t.Errorf("lvs does not show the volume's name: %s", lvNames(t, fx.VG))
	}
	sa := publish(a, mountAccess)
	kept := strings.Repeat("written before the snapshot\n", 1000)
	if err := os.WriteFile(filepath.Join(sa.target, "data"), []byte(kept), 0o644); err != nil {
		t.Fatal(err)
	}
	small := fsSize(sa.target)
	timed(t, "ControllerExpandVolume (online, 128 MiB)", func() (*csi.ControllerExpandVolumeResponse, error) {
		return ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: a.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 128 * mib}})
	})
	ne := timed(t, "NodeExpandVolume (online)", func() (*csi.NodeExpandVolumeResponse, error) {
		return node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: a.GetVolumeId(), VolumePath: sa.target, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 * mib}})
	})
	if grown := fsSize(sa.target); ne.GetCapacityBytes() != 128*mib || grown < small+50*mib {
		t.Errorf("online expansion: node reports %d bytes, filesystem %d -> %d", ne.GetCapacityBytes(), small, grown)
	}
	if readFile(filepath.Join(sa.target, "data")) != kept {
		t.Error("the data changed across the online expansion")
	}
	if err := syncPath(sa.target); err != nil {
		t.Fatal(err)
	}

	// Snapshot (the volume in use), then a change the snapshot must not see.
	snap := timed(t, "CreateSnapshot (volume in use)", func() (*csi.CreateSnapshotResponse, error) {
		return ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-a", SourceVolumeId: a.GetVolumeId()})
	}).GetSnapshot()
	if err := os.WriteFile(filepath.Join(sa.target, "later"), []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := timed(t, "CreateVolume (restore into 256 MiB)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-restored", VolumeCapabilities: []*csi.VolumeCapability{mountAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 256 * mib}, Parameters: map[string]string{"deviceClass": "thin"},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()}}}})
	}).GetVolume()
	if r.GetCapacityBytes() != 256*mib {
		t.Errorf("restored capacity %d", r.GetCapacityBytes())
	}
	sr := publish(r, mountAccess)
	if readFile(filepath.Join(sr.target, "data")) != kept {
		t.Error("the restored volume does not hold the snapshot's data")
	}
	if _, err := os.Stat(filepath.Join(sr.target, "later")); !os.IsNotExist(err) {
		t.Errorf("the restored volume holds a file written after the snapshot: %v", err)
	}
	if got := fsSize(sr.target); got < 200*mib {
		t.Errorf("the restored filesystem was not grown at stage: %d bytes", got)
	}
	c := timed(t, "CreateVolume (clone)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-clone", VolumeCapabilities: []*csi.VolumeCapability{mountAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 128 * mib}, Parameters: map[string]string{"deviceClass": "thin"},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: a.GetVolumeId()}}}})
	}).GetVolume()
	if err := syncPath(sa.target); err != nil {
		t.Fatal(err)
	}
	sc := publish(c, mountAccess)
	if readFile(filepath.Join(sc.target, "data")) != kept {
		t.Error("the clone does not hold the volume's data")
	}

	// A thick block volume.
	k := timed(t, "CreateVolume (thick block, 16 MiB)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-thick", VolumeCapabilities: []*csi.VolumeCapability{blockAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mib}, Parameters: map[string]string{"deviceClass": "thick"}})
	}).GetVolume()
	sk := publish(k, blockAccess)
	pattern := bytes.Repeat([]byte("thick "), 100000)
	write := func() {
		f, err := os.OpenFile(sk.target, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(pattern, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	write()
	if _, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-thick", SourceVolumeId: k.GetVolumeId()}); code(err) != codes.InvalidArgument {
		t.Errorf("snapshot of a thick volume: %v", err)
	}

	// A restart: start-up reconciliation (cleaning) finds every LV of the
	// daemon explained and leaves the operator's alone.
	d.cfg.Reconcile.Clean, d.cfg.Reconcile.CleanStorage = true, true
	d.restart(t)
	ctl, node = d.controller(), d.node()
	fx.CheckOperator(t)
	if readFile(filepath.Join(sa.target, "data")) != kept || readFile(filepath.Join(sr.target, "data")) != kept {
		t.Error("mounted volumes lost their data across the restart")
	}
	lv := timed(t, "ListVolumes", func() (*csi.ListVolumesResponse, error) { return ctl.ListVolumes(ctx, &csi.ListVolumesRequest{}) })
	if n := len(lv.GetEntries()); n != 4 {
		t.Errorf("%d volumes listed after the restart, want 4", n)
	}
	for _, s := range []staged{sk, sc, sr, sa} {
		release(s)
	}
	all = nil
	for _, v := range []*csi.Volume{k, c, r, a} {
		timed(t, "DeleteVolume", func() (*csi.DeleteVolumeResponse, error) {
			return ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
		})
	}
	timed(t, "DeleteSnapshot", func() (*csi.DeleteSnapshotResponse, error) {
		return ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
	})
	if got := lvNames(t, fx.VG); got != before {
		t.Errorf("after every deletion the VG holds %s, before %s", got, before)
	}
	fx.CheckOperator(t)
}

// syncPath syncs the filesystem holding path.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
