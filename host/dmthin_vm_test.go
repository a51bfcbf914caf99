package host_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/dmthin/dmthintest"
	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The dmthin backend on a real thin pool, through the daemon's CSI
// services (VM tier: device-mapper thin provisioning).

// dmthinDaemon starts a daemon serving the dmthin module built with tc on a
// fresh pool of dataSize bytes named after name.
func dmthinDaemon(t *testing.T, tc moduletest.Toolchain, name string, dataSize int64) *daemon {
	t.Helper()
	dmthintest.Require(t)
	wasm := dmthintest.Module(t, tc)
	fx := dmthintest.New(t, name, dataSize, 8<<20)
	return startDaemon(t, dmthinOptions(wasm, fx))
}

func dmthinOptions(wasm string, fx *dmthintest.Fixture) daemonOptions {
	return daemonOptions{backend: "dmthin", wasm: wasm, hostcalls: dmthintest.HostCalls, config: fx.Config(), extraRoots: fx.Roots()}
}

var blockAccess = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

var mountAccess = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// timed runs a CSI call and logs its time.
func timed[T any](t *testing.T, what string, call func() (T, error)) T {
	t.Helper()
	var out T
	var err error
	dmthintest.Timed(t, "csi "+what, func() { out, err = call() })
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return out
}

// Thin-pool capacity reported correctly after snapshots share blocks:
// data written to a volume counts once however many snapshots share it, a
// first write to a shared block costs a new block (copy on write) and a
// second write to it costs nothing, and deleting frees exactly the blocks
// nothing else shares.
func TestDmthinCapacityAfterSnapshotsShareBlocks(t *testing.T) {
	d := dmthinDaemon(t, moduletest.Go, "capacity", 256<<20)
	ctx := context.Background()
	ctl, node := d.controller(), d.node()
	available := func() int64 {
		t.Helper()
		return timed(t, "GetCapacity", func() (*csi.GetCapacityResponse, error) {
			return ctl.GetCapacity(ctx, &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{blockAccess}})
		}).GetAvailableCapacity()
	}
	used := func(empty int64) int64 { t.Helper(); return empty - available() }
	const mib = 1 << 20

	empty := available()
	if empty != 256*mib {
		t.Fatalf("an empty pool of 256 MiB data with ample metadata reports %d bytes", empty)
	}
	vol := timed(t, "CreateVolume (block, 64 MiB)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "cap-origin", VolumeCapabilities: []*csi.VolumeCapability{blockAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}})
	}).GetVolume()
	work := t.TempDir()
	staging, target := filepath.Join(work, "staging"), filepath.Join(work, "pub", "dev")
	timed(t, "NodeStageVolume (block)", func() (*csi.NodeStageVolumeResponse, error) {
		return node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
			VolumeCapability: blockAccess, VolumeContext: vol.GetVolumeContext()})
	})
	timed(t, "NodePublishVolume (block)", func() (*csi.NodePublishVolumeResponse, error) {
		return node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: blockAccess, VolumeContext: vol.GetVolumeContext()})
	})
	t.Cleanup(func() {
		node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
		node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
	})
	if used := used(empty); used != 0 {
		t.Errorf("a new volume uses %d bytes", used)
	}

	write(t, target, 0, 8*mib, 1)
	if got := used(empty); got != 8*mib {
		t.Fatalf("after writing 8 MiB: %d bytes used", got)
	}
	snap := timed(t, "CreateSnapshot (origin published)", func() (*csi.CreateSnapshotResponse, error) {
		return ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "cap-snap", SourceVolumeId: vol.GetVolumeId()})
	}).GetSnapshot()
	if !snap.GetReadyToUse() || snap.GetSizeBytes() != 64*mib {
		t.Errorf("snapshot %v", snap)
	}
	if got := used(empty); got != 8*mib {
		t.Errorf("after the snapshot: %d bytes used, want the 8 MiB counted once", got)
	}
	write(t, target, 0, 2*mib, 2)
	if got := used(empty); got != 10*mib {
		t.Errorf("after overwriting 2 MiB shared with the snapshot: %d bytes used, want 10 MiB (copy on write)", got)
	}
	write(t, target, 0, 2*mib, 3)
	if got := used(empty); got != 10*mib {
		t.Errorf("after overwriting the same 2 MiB again: %d bytes used, want still 10 MiB", got)
	}
	restored := timed(t, "CreateVolume (restore from snapshot)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "cap-restored", VolumeCapabilities: []*csi.VolumeCapability{blockAccess},
			CapacityRange:       &csi.CapacityRange{RequiredBytes: 64 * mib},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()}}}})
	}).GetVolume()
	if got := used(empty); got != 10*mib {
		t.Errorf("after restoring the snapshot: %d bytes used, want 10 MiB", got)
	}
	// The snapshot's own 2 MiB stay while the restored volume shares them.
	timed(t, "DeleteSnapshot", func() (*csi.DeleteSnapshotResponse, error) {
		return ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
	})
	if got := used(empty); got != 10*mib {
		t.Errorf("after deleting the snapshot: %d bytes used, want 10 MiB (the restored volume shares them)", got)
	}
	timed(t, "DeleteVolume (restored)", func() (*csi.DeleteVolumeResponse, error) {
		return ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: restored.GetVolumeId()})
	})
	if got := used(empty); got != 8*mib {
		t.Errorf("after deleting the restored volume: %d bytes used, want the origin's 8 MiB", got)
	}
	timed(t, "NodeUnpublishVolume (block)", func() (*csi.NodeUnpublishVolumeResponse, error) {
		return node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
	})
	timed(t, "NodeUnstageVolume (block)", func() (*csi.NodeUnstageVolumeResponse, error) {
		return node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
	})
	timed(t, "DeleteVolume", func() (*csi.DeleteVolumeResponse, error) {
		return ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
	})
	if got := used(empty); got != 0 {
		t.Errorf("after deleting everything: %d bytes used", got)
	}
}

// A mount volume's life on a thin pool, with each CSI call timed: format
// and mount on first stage, online expansion (device at once, filesystem
// by the node), and a restage after an offline expansion that must see the
// new size although the CO still sends the creation's volume context.
func TestDmthinMountLifecycle(t *testing.T) {
	d := dmthinDaemon(t, moduletest.Go, "mount", 512<<20)
	ctx := context.Background()
	ctl, node := d.controller(), d.node()
	const mib = 1 << 20
	vol := timed(t, "CreateVolume (mount, 64 MiB)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "life", VolumeCapabilities: []*csi.VolumeCapability{mountAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}})
	}).GetVolume()
	id := vol.GetVolumeId()
	work := t.TempDir()
	staging, target := filepath.Join(work, "staging"), filepath.Join(work, "target")
	stage := func(what string) {
		t.Helper()
		timed(t, what, func() (*csi.NodeStageVolumeResponse, error) {
			return node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: mountAccess, VolumeContext: vol.GetVolumeContext()})
		})
	}
	unstage := func() {
		t.Helper()
		timed(t, "NodeUnstageVolume (unmount, deactivate)", func() (*csi.NodeUnstageVolumeResponse, error) {
			return node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		})
	}
	t.Cleanup(func() {
		node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	stage("NodeStageVolume (activate, mkfs.ext4, mount)")
	timed(t, "NodePublishVolume (bind)", func() (*csi.NodePublishVolumeResponse, error) {
		return node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: mountAccess, VolumeContext: vol.GetVolumeContext()})
	})
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	statsSize := func(path string) int64 {
		t.Helper()
		st := timed(t, "NodeGetVolumeStats", func() (*csi.NodeGetVolumeStatsResponse, error) {
			return node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path})
		})
		for _, u := range st.GetUsage() {
			if u.GetUnit() == csi.VolumeUsage_BYTES {
				return u.GetTotal()
			}
		}
		t.Fatalf("no byte usage in %v", st)
		return 0
	}
	before := statsSize(target)
	timed(t, "ControllerExpandVolume (online, 128 MiB)", func() (*csi.ControllerExpandVolumeResponse, error) {
		return ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 * mib}})
	})
	ne := timed(t, "NodeExpandVolume (ext4 online, by ioctl)", func() (*csi.NodeExpandVolumeResponse, error) {
		return node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 * mib}})
	})
	after := statsSize(target)
	if ne.GetCapacityBytes() != 128*mib || after < before+50*mib {
		t.Errorf("online expansion: node reports %d bytes, filesystem %d -> %d", ne.GetCapacityBytes(), before, after)
	}
	timed(t, "NodeUnpublishVolume", func() (*csi.NodeUnpublishVolumeResponse, error) {
		return node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	})
	unstage()
	timed(t, "ControllerExpandVolume (offline, 192 MiB)", func() (*csi.ControllerExpandVolumeResponse, error) {
		return ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 192 * mib}})
	})
	stage("NodeStageVolume (activate, mount)")
	ne = timed(t, "NodeExpandVolume (ext4 online, by ioctl)", func() (*csi.NodeExpandVolumeResponse, error) {
		return node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: staging, StagingTargetPath: staging,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 192 * mib}})
	})
	if final := statsSize(staging); ne.GetCapacityBytes() != 192*mib || final < after+50*mib {
		t.Errorf("offline expansion: node reports %d bytes, filesystem %d -> %d", ne.GetCapacityBytes(), after, final)
	}
	if b, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(b) != "kept" {
		t.Errorf("data after restage: %q %v", b, err)
	}
	unstage()
	timed(t, "DeleteVolume", func() (*csi.DeleteVolumeResponse, error) {
		return ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	})
}

// write writes n bytes of a pattern (by seed) at off to a block device
// node and syncs them, so the pool has mapped every block.
func write(t *testing.T, dev string, off, n int64, seed byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatalf("write %s: %v", dev, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", dev, err)
	}
}

// A group snapshot of thin volumes in use suspends their devices while it
// cuts them: two mount volumes under a writer and a published block
// volume. Every member is cut while the writer stands still, the restored
// members hold one prefix of the write stream, and no device stays
// suspended.
func TestDmthinGroupSnapshotWriteOrder(t *testing.T) {
	dmthintest.Require(t)
	wasm := dmthintest.Module(t, moduletest.Go)
	fx := dmthintest.New(t, "group", 256<<20, 8<<20)
	var writer atomic.Pointer[seqWriter]
	var cuts, pausedCuts atomic.Int32
	calls, err := host.DefaultHostCalls(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := calls[abi.HostCallDmThinSnapshot]
	spy := real
	spy.Call = func(ctx context.Context, env *hostcalls.Env, req []byte) ([]byte, error) {
		if w := writer.Load(); w != nil {
			cuts.Add(1)
			if w.stalled(300 * time.Millisecond) {
				pausedCuts.Add(1)
			}
		}
		return real.Call(ctx, env, req)
	}
	o := dmthinOptions(wasm, fx)
	o.hostCalls = []hostcalls.Func{spy}
	d := startDaemon(t, o)
	ctx := context.Background()
	volume := func(name string, block bool) *loopVolume {
		vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{loopCapability(block)},
			CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes}})
		w := workDir(t)
		v := &loopVolume{vol: vol, block: block, staging: stagingPath(w, name), target: targetPath(w, name)}
		if err := v.stage(ctx, d); err != nil {
			t.Fatal(err)
		}
		if err := v.publish(ctx, d); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			v.unpublishAt(ctx, d, v.target)
			v.unstage(ctx, d)
		})
		return v
	}
	a, b, c := volume("dg-a", false), volume("dg-b", false), volume("dg-c", true)
	w := startWriter(t, [2]string{a.target, b.target})
	writer.Store(w)
	w.progress(t, 50, 30*time.Second)
	g := timed(t, "CreateVolumeGroupSnapshot (3 members in use)", func() (*csi.VolumeGroupSnapshot, error) {
		return groupSnapshot(ctx, t, d, "dg", a, b, c)
	})
	writer.Store(nil)
	if cuts.Load() != 3 || pausedCuts.Load() != 3 {
		t.Errorf("%d of %d members were cut while the writes stood still, want all 3", pausedCuts.Load(), cuts.Load())
	}
	w.progress(t, 10, 30*time.Second)
	n := checkCut(t, restoreRecords(t, d, memberOf(t, g, a), "dg-ra"), restoreRecords(t, d, memberOf(t, g, b), "dg-rb"))
	t.Logf("the group holds records 0..%d; the longest a record took: %s", n-1, time.Duration(w.longest.Load()).Round(time.Millisecond))
	m, err := dm.New(fx.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range devs {
		if info, err := m.Info(ctx, dev.Name); err != nil || info.Suspended {
			t.Errorf("%s after the group snapshot: %+v, %v", dev.Name, info, err)
		}
	}
}

// dmthinBlockVolume creates a block volume, stages and publishes it, and
// returns it with the published device node; unpublish and unstage are
// registered as cleanups.
func dmthinBlockVolume(t *testing.T, d *daemon, name string, size int64) (*csi.Volume, string, string) {
	t.Helper()
	ctx := context.Background()
	ctl, node := d.controller(), d.node()
	vol := timed(t, "CreateVolume (block)", func() (*csi.CreateVolumeResponse, error) {
		return ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{blockAccess},
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
	}).GetVolume()
	work := t.TempDir()
	staging, target := filepath.Join(work, "staging"), filepath.Join(work, "pub", "dev")
	timed(t, "NodeStageVolume (block)", func() (*csi.NodeStageVolumeResponse, error) {
		return node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
			VolumeCapability: blockAccess, VolumeContext: vol.GetVolumeContext()})
	})
	timed(t, "NodePublishVolume (block)", func() (*csi.NodePublishVolumeResponse, error) {
		return node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: blockAccess, VolumeContext: vol.GetVolumeContext()})
	})
	t.Cleanup(func() {
		node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
		node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
	})
	return vol, staging, target
}

// TestDmthinSnapshotMetadata: the SnapshotMetadata service reports exactly
// the pool blocks written to a volume before each snapshot, and exactly the
// ones written between two snapshots, read from the pool's metadata while
// the volume stays in use.
func TestDmthinSnapshotMetadata(t *testing.T) {
	d := dmthinDaemon(t, moduletest.Go, "smd", 256<<20)
	ctx := context.Background()
	ctl := d.controller()
	const size, blk = 16 << 20, 64 << 10 // the pool's default block size
	vol, _, dev := dmthinBlockVolume(t, d, "smd-vol", size)
	snapshot := func(name string) string {
		t.Helper()
		id := timed(t, "CreateSnapshot", func() (*csi.CreateSnapshotResponse, error) {
			return ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol.GetVolumeId()})
		}).GetSnapshot().GetSnapshotId()
		t.Cleanup(func() { ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}) })
		return id
	}
	// Partial writes too: a pool block is mapped whole.
	write(t, dev, 0, 4096, 1)
	write(t, dev, 5*blk, 2*blk, 2)
	a := snapshot("smd-a")
	write(t, dev, 6*blk+512, 1024, 3)
	write(t, dev, 9*blk, blk, 4)
	b := snapshot("smd-b")
	write(t, dev, 20*blk, blk, 5) // after both snapshots

	c := csi.NewSnapshotMetadataClient(d.conn)
	flat := func(what string, msgs []mdMessage, err error) []mdRange {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out := []mdRange{}
		for _, m := range msgs {
			if m.typ != csi.BlockMetadataType_VARIABLE_LENGTH || m.capacity != size {
				t.Errorf("%s: message type %v capacity %d", what, m.typ, m.capacity)
			}
			out = append(out, m.ranges...)
		}
		return out
	}
	for _, tc := range []struct {
		snap string
		from int64
		max  int32
		want []mdRange
	}{
		{a, 0, 0, []mdRange{{0, blk}, {5 * blk, 2 * blk}}},
		{b, 0, 0, []mdRange{{0, blk}, {5 * blk, 2 * blk}, {9 * blk, blk}}},
		{b, 5*blk + 100, 1, []mdRange{{5*blk + 100, 2*blk - 100}, {9 * blk, blk}}},
	} {
		var msgs []mdMessage
		var err error
		dmthintest.Timed(t, "csi GetMetadataAllocated", func() {
			msgs, err = mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: tc.snap, StartingOffset: tc.from, MaxResults: tc.max})
		})
		if got := flat("allocated", msgs, err); !slices.Equal(got, tc.want) {
			t.Errorf("allocated of %s from %d: %v, want %v", tc.snap, tc.from, got, tc.want)
		}
		if tc.max == 1 && len(msgs) != len(tc.want) {
			t.Errorf("max_results 1: %d messages for %d ranges", len(msgs), len(tc.want))
		}
	}
	var msgs []mdMessage
	var err error
	dmthintest.Timed(t, "csi GetMetadataDelta", func() {
		msgs, err = mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: a, TargetSnapshotId: b})
	})
	if got, want := flat("delta", msgs, err), []mdRange{{6 * blk, blk}, {9 * blk, blk}}; !slices.Equal(got, want) {
		t.Errorf("delta a -> b: %v, want %v", got, want)
	}
	// From an offset inside a block: from that block on.
	msgs, err = mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: a, TargetSnapshotId: b, StartingOffset: 7*blk + 100, MaxResults: 1})
	if got, want := flat("delta a -> b from block 7", msgs, err), []mdRange{{9 * blk, blk}}; !slices.Equal(got, want) || len(msgs) != 1 {
		t.Errorf("delta a -> b from block 7: %d messages, ranges %v; want %v", len(msgs), got, want)
	}
}

// healthReasons returns the reasons of a volume health report.
func healthReasons(vh *csi.VolumeHealth) []string {
	var out []string
	for _, e := range vh.GetHealthStatuses() {
		out = append(out, e.GetReason())
	}
	return out
}

// TestDmthinVolumeHealthPoolFull: a volume of a pool filled to the last
// block reports the pool low on data, and once a write found no free block
// (out_of_data_space), out of data space, on the controller and the node.
func TestDmthinVolumeHealthPoolFull(t *testing.T) {
	const mib, pool = 1 << 20, 8 << 20
	d := dmthinDaemon(t, moduletest.Go, "full", pool)
	ctx := context.Background()
	// Writes to a full pool queue for no_space_timeout seconds before they
	// fail; a second keeps the test short.
	const timeout = "/sys/module/dm_thin_pool/parameters/no_space_timeout"
	if old, err := os.ReadFile(timeout); err == nil {
		if err := os.WriteFile(timeout, []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(timeout, old, 0) })
	}
	vol, staging, dev := dmthinBlockVolume(t, d, "full-vol", 32*mib)
	controller := func() []string {
		t.Helper()
		return healthReasons(timed(t, "ControllerGetVolumeHealth", func() (*csi.ControllerGetVolumeHealthResponse, error) {
			return d.controller().ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol.GetVolumeId()})
		}).GetVolumeHealth())
	}
	node := func() []string {
		t.Helper()
		return healthReasons(timed(t, "NodeGetVolumeHealth", func() (*csi.NodeGetVolumeHealthResponse, error) {
			return d.node().NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
		}).GetVolumeHealth())
	}
	if got := controller(); len(got) != 0 {
		t.Fatalf("an empty volume: %v", got)
	}
	write(t, dev, 0, pool, 1)
	if got := controller(); !slices.Equal(got, []string{"PoolDataLow"}) {
		t.Errorf("pool full to the last block: %v, want PoolDataLow", got)
	}
	// One block more than the pool has.
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, werr := f.WriteAt(make([]byte, 64<<10), pool)
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if werr == nil {
		t.Fatal("a write past the full pool succeeded")
	}
	for what, got := range map[string][]string{"controller": controller(), "node": node()} {
		if !slices.Contains(got, "PoolOutOfDataSpace") {
			t.Errorf("%s health after a write found no free block: %v, want PoolOutOfDataSpace", what, got)
		}
	}
}

// TestDmthinVolumeHealthDeviceMissing: a staged volume whose device is
// removed behind the daemon's back reports it missing on the node, and
// once its thin device is deleted from the pool, lost on the controller.
func TestDmthinVolumeHealthDeviceMissing(t *testing.T) {
	d := dmthinDaemon(t, moduletest.Go, "gone", 64<<20)
	ctx := context.Background()
	vol, staging, dev := dmthinBlockVolume(t, d, "gone-vol", 16<<20)
	write(t, dev, 0, 1<<20, 1)
	ctxv := vol.GetVolumeContext()
	name := ctxv["pool"] + "-" + ctxv["thinID"]
	m, err := dm.New(ctxv["pool"])
	if err != nil {
		t.Fatal(err)
	}
	node := func() *csi.VolumeHealth {
		t.Helper()
		return timed(t, "NodeGetVolumeHealth", func() (*csi.NodeGetVolumeHealthResponse, error) {
			return d.node().NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
		}).GetVolumeHealth()
	}
	controller := func() *csi.VolumeHealth {
		t.Helper()
		return timed(t, "ControllerGetVolumeHealth", func() (*csi.ControllerGetVolumeHealthResponse, error) {
			return d.controller().ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol.GetVolumeId()})
		}).GetVolumeHealth()
	}
	if got := healthReasons(node()); len(got) != 0 {
		t.Fatalf("a staged volume: %v", got)
	}
	if err := m.Remove(ctx, name); err != nil {
		t.Fatal(err)
	}
	if got := healthReasons(node()); !slices.Contains(got, "DeviceMissing") {
		t.Errorf("node health with the staged device removed: %v, want DeviceMissing", got)
	}
	if got := healthReasons(controller()); len(got) != 0 {
		t.Errorf("controller health of an inactive volume: %v", got)
	}
	if _, err := m.Message(ctx, ctxv["pool"], 0, "delete "+ctxv["thinID"]); err != nil {
		t.Fatal(err)
	}
	vh := controller()
	if got := healthReasons(vh); !slices.Equal(got, []string{"ThinDeviceDeleted"}) || vh.GetHealthStatuses()[0].GetStatus() != csi.VolumeHealthErrorType_DATA_LOSS {
		t.Errorf("controller health of a volume deleted from the pool: %v", vh)
	}
}
