package faulttest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/examples/dmthin/dmthintest"
	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

const (
	thinDataBytes = 8 << 20 // the pool's data device: a few volumes' worth
	thinMetaBytes = 2 << 20 // 512 metadata blocks: a few hundred thin devices fill it
	thinMetaGrow  = 8 << 20
	// foreignThin is the first of the thin ids the test creates in the
	// pool behind the daemon's back to fill its metadata.
	foreignThin   = 0xfff000
	thinVolBytes  = 16 << 20
	thinGrowBytes = 64 << 20 // the data device once the operator grows it
	// noSpaceTimeout is how long a full pool queues writes before failing
	// them; a second keeps the case short.
	noSpaceTimeout = "/sys/module/dm_thin_pool/parameters/no_space_timeout"
)

// TestThinPoolFaults: a dm-thin pool out of data space. CreateVolume and
// CreateSnapshot answer RESOURCE_EXHAUSTED naming the cause and keep
// nothing, the volumes' health on the controller and the node shows the
// pool's state, the other backend serves on, and once the operator grows
// the data device the CO's retries succeed with nothing lost.
func TestThinPoolFaults(t *testing.T) {
	require(t, "dm_thin_pool")
	begin := time.Now()
	if old, err := os.ReadFile(noSpaceTimeout); err == nil {
		if err := os.WriteFile(noSpaceTimeout, []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(noSpaceTimeout, old, 0) })
	}
	tc := toolchain()
	fx := dmthintest.New(t, "faults", thinDataBytes, thinMetaBytes)
	dd := daemontest.New(t, daemontest.Options{LogFormat: "json", Modules: []daemontest.Module{
		{Name: "localdir", Wasm: moduletest.Build(t, "../../examples/localdir", tc), HostCalls: []string{"dir"}, Pool: true},
		{Name: "dmthin", Wasm: moduletest.Build(t, "../../examples/dmthin", tc), HostCalls: dmthintest.HostCalls, Pool: true,
			Roots: fx.Roots(), Config: fx.Config()},
	}})
	// Unmount the daemon's mounts and remove its devices before the pool goes.
	t.Cleanup(func() { dd.Kill(true); daemontest.ReleaseUnder(t, dd.Dir) })
	startDaemon(t, dd)
	r := &faultRun{t: t, d: dd, node: filepath.Join(dd.Dir, "node"), vols: map[string]*vol{}, snaps: map[string]*snap{}, classes: map[string]int{}}

	// What exists before the fault: data it must not take.
	c := ctx(t)
	base := &vol{name: "thin-base", backend: "dmthin", block: true}
	if err := r.createVol(c, base, thinVolBytes, nil, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.writeVolume(c, base.name, "thin-base.1"); err != nil {
		t.Fatal(err)
	}
	if err := r.snapshot(c, "thin-base-s", base.name); err != nil {
		t.Fatal(err)
	}

	// A volume larger than the pool, written until no block is left.
	filler := &vol{name: "thin-filler", backend: "dmthin", block: true}
	if err := r.createVol(c, filler, 2*thinDataBytes, nil, ""); err != nil {
		t.Fatal(err)
	}
	if err := stagePublish(c, dd, r.node, filler); err != nil {
		t.Fatal(err)
	}
	if err := exhaust(target(r.node, filler), 2*thinDataBytes); err == nil {
		t.Fatalf("wrote %d bytes into a pool of %d", 2*thinDataBytes, thinDataBytes)
	} else {
		t.Logf("writing past the pool's data: %v", err)
	}
	if err := unpublishUnstage(c, dd, r.node, filler); err != nil {
		t.Fatal(err)
	}
	t.Logf("pool: %s", strings.TrimSpace(run(t, "dmsetup", "status", fx.Pool)))

	label := "thin pool out of data space"
	calls := r.faulted(label, []codes.Code{codes.ResourceExhausted}, []string{"out of data space"}, []callResult{
		{what: "CreateVolume", retry: func(c context.Context) error {
			return r.createVol(c, &vol{name: "thin-new", backend: "dmthin", block: true}, thinVolBytes, nil, "")
		}},
		{what: "CreateVolume (clone)", retry: func(c context.Context) error {
			return r.createVol(c, &vol{name: "thin-clone", backend: "dmthin", block: true}, thinVolBytes, volSource(base.id), base.token)
		}},
		{what: "CreateVolume (restore)", retry: func(c context.Context) error {
			s := r.snaps["thin-base-s"]
			return r.createVol(c, &vol{name: "thin-restore", backend: "dmthin", block: true}, thinVolBytes, snapSource(s.id), s.token)
		}},
		{what: "CreateSnapshot", retry: func(c context.Context) error { return r.snapshot(c, "thin-snap", base.name) }},
	})
	r.health(label, base)
	r.thinHealth(label, base, "PoolOutOfDataSpace")
	r.serving(label, "localdir", "thin-other")

	// The operator grows the pool's data device: the backing file, the
	// loop device's capacity, and the pool's table.
	growDevice(t, fx.Pool, fx.Data, fx.DataDev, thinGrowBytes, true)
	t.Logf("pool grown: %s", strings.TrimSpace(run(t, "dmsetup", "status", fx.Pool)))
	r.retried("after growing the pool", calls)
	r.verifyAll("after growing the pool")
	r.thinHealth("after growing the pool", base)

	// Out of metadata space: empty thin devices made behind the daemon's
	// back fill the metadata until the kernel turns the pool read-only
	// (free metadata under its low-water mark refuses pool messages).
	m, err := dm.New(fx.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	foreign, ferr := 0, error(nil)
	for ; foreign < 4096; foreign++ {
		if _, ferr = m.Message(context.Background(), fx.Pool, 0, "create_thin "+strconv.Itoa(foreignThin+foreign)); ferr != nil {
			break
		}
	}
	t.Logf("%d thin devices fill the metadata (then %v): %s", foreign, ferr, strings.TrimSpace(run(t, "dmsetup", "status", fx.Pool)))
	label = "thin pool out of metadata space"
	calls = r.faulted(label, []codes.Code{codes.ResourceExhausted}, []string{"read-only", "metadata"}, []callResult{
		{what: "CreateVolume", retry: func(c context.Context) error {
			return r.createVol(c, &vol{name: "meta-new", backend: "dmthin", block: true}, thinVolBytes, nil, "")
		}},
		{what: "CreateVolume (clone)", retry: func(c context.Context) error {
			return r.createVol(c, &vol{name: "meta-clone", backend: "dmthin", block: true}, thinVolBytes, volSource(base.id), base.token)
		}},
		{what: "CreateSnapshot", retry: func(c context.Context) error { return r.snapshot(c, "meta-snap", base.name) }},
	})
	r.health(label, base)
	r.thinHealth(label, base, "PoolReadOnly")
	r.serving(label, "localdir", "meta-other")
	// The operator grows the metadata device; the kernel takes it on
	// resume and leaves read-only mode.
	growDevice(t, fx.Pool, fx.Meta, fx.MetaDev, thinMetaGrow, false)
	t.Logf("metadata grown: %s", strings.TrimSpace(run(t, "dmsetup", "status", fx.Pool)))
	for i := 0; i < foreign; i++ {
		if _, err := m.Message(context.Background(), fx.Pool, 0, "delete "+strconv.Itoa(foreignThin+i)); err != nil {
			t.Errorf("delete foreign thin %d: %v", foreignThin+i, err)
		}
	}
	r.retried("after growing the metadata", calls)
	r.verifyAll("after growing the metadata")
	r.thinHealth("after growing the metadata", base)

	// Everything deleted through CSI: the pool holds no data.
	c = ctx(t)
	for _, s := range r.snaps {
		if _, err := dd.Controller().DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: s.id}); err != nil {
			r.anomaly("orphaned", "DeleteSnapshot %s: %v", s.name, err)
		}
	}
	for _, v := range r.vols {
		if _, err := dd.Controller().DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			r.anomaly("orphaned", "DeleteVolume %s: %v", v.name, err)
		}
	}
	if used := poolDataUsed(t, fx.Pool); used != "0" {
		r.anomaly("orphaned", "pool %s holds %s data blocks after deleting everything", fx.Pool, used)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d faulted calls in %v; anomalies by class:", r.injected, time.Since(begin).Round(time.Millisecond))
	for _, cl := range faultClasses {
		fmt.Fprintf(&b, "\n  %-24s %d", cl, r.classes[cl])
	}
	t.Log(b.String())
}

// thinHealth checks v's health on the controller and, staged, on the
// node: the reasons named in want, or healthy when want is empty.
func (r *faultRun) thinHealth(label string, v *vol, want ...string) {
	r.t.Helper()
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	check := func(where string, h *csi.VolumeHealth) {
		var reasons []string
		for _, e := range h.GetHealthStatuses() {
			reasons = append(reasons, e.GetReason())
		}
		for _, w := range want {
			if !slices.Contains(reasons, w) {
				r.anomaly("health silent", "%s: %s health of %s: %v, want %s", label, where, v.name, reasons, w)
			}
		}
		if len(want) == 0 && len(reasons) > 0 {
			r.anomaly("health silent", "%s: %s health of %s: %v, want healthy", label, where, v.name, reasons)
		}
	}
	cr, err := r.d.Controller().ControllerGetVolumeHealth(c, &csi.ControllerGetVolumeHealthRequest{VolumeId: v.id})
	if err != nil {
		r.anomaly("health silent", "%s: ControllerGetVolumeHealth %s: %v", label, v.name, err)
	} else {
		check("controller", cr.GetVolumeHealth())
	}
	if err := stagePublish(c, r.d, r.node, v); err != nil {
		r.anomaly("health silent", "%s: stage %s: %v", label, v.name, err)
		return
	}
	nr, err := r.d.Node().NodeGetVolumeHealth(c, &csi.NodeGetVolumeHealthRequest{VolumeId: v.id, StagingTargetPath: staging(r.node, v)})
	if err != nil {
		r.anomaly("health silent", "%s: NodeGetVolumeHealth %s: %v", label, v.name, err)
	} else {
		check("node", nr.GetVolumeHealth())
	}
	if err := unpublishUnstage(c, r.d, r.node, v); err != nil {
		r.anomaly("health silent", "%s: unstage %s: %v", label, v.name, err)
	}
}

// exhaust writes zeros to the block device dev, bypassing the page cache,
// until size bytes are written or a write fails; it returns that failure.
func exhaust(dev string, size int64) error {
	f, err := os.OpenFile(dev, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const chunk = 1 << 20
	buf, err := unix.Mmap(-1, 0, chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	for off := int64(0); off < size; off += chunk {
		if _, err := f.WriteAt(buf, off); err != nil {
			return fmt.Errorf("at %d MiB: %w", off>>20, err)
		}
	}
	return f.Sync()
}

// growDevice grows a device of pool (its data device when data, else
// its metadata device) to size bytes as an operator does: the backing
// file, the loop device's capacity (LOOP_SET_CAPACITY), then the pool's
// table again (with the new length for data), which the kernel takes on
// resume, leaving out-of-space mode.
func growDevice(t *testing.T, pool, file, dev string, size int64, data bool) {
	t.Helper()
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0)
	f.Close()
	if err != nil {
		t.Fatalf("LOOP_SET_CAPACITY %s: %v", dev, err)
	}
	fields := strings.Fields(run(t, "dmsetup", "table", pool))
	if len(fields) < 4 || fields[2] != "thin-pool" {
		t.Fatalf("pool table %q", fields)
	}
	if data {
		fields[1] = strconv.FormatInt(size/512, 10)
	}
	run(t, "dmsetup", "reload", pool, "--table", strings.Join(fields, " "))
	run(t, "dmsetup", "resume", pool)
}

// poolDataUsed is the pool's count of used data blocks.
func poolDataUsed(t *testing.T, pool string) string {
	t.Helper()
	// 0 <len> thin-pool <transaction> <used>/<total meta> <used>/<total data> ...
	fields := strings.Fields(run(t, "dmsetup", "status", pool))
	if len(fields) < 6 {
		t.Fatalf("pool status %q", fields)
	}
	used, _, _ := strings.Cut(fields[5], "/")
	return used
}
