package host_test

// Benchmarks of whole CSI operations: a real daemon in this process, real
// gRPC over its unix socket, the example modules running in the real module
// runtime, durable (fsynced) records, and real mounts and loop devices
// where an operation needs them. Each reports its rate as a custom metric
// (pairs/s or cycles/s) next to ns/op; docs/PERFORMANCE.md explains how to
// run them and what they measured.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// benchDaemon starts a daemon serving the example module backend, built
// with the toolchain WASMCSI_BENCH_TOOLCHAIN names (go, the default, or
// tinygo), with the grants csi-sanity uses for it. A benchmark whose
// example is not in the tree is skipped.
func benchDaemon(b *testing.B, backend string) *daemon {
	b.Helper()
	dir := filepath.Join("..", "examples", backend)
	if _, err := os.Stat(dir); err != nil {
		b.Skipf("example module %s is not in the tree: %v", backend, err)
	}
	i := slices.IndexFunc(sanityBackends, func(s sanityBackend) bool { return s.backend == backend })
	if i < 0 {
		b.Fatalf("no grants known for backend %s (sanityBackends)", backend)
	}
	return startDaemon(b, daemonOptions{
		backend:   backend,
		wasm:      moduletest.Build(b, dir, benchToolchain(b)),
		hostcalls: sanityBackends[i].hostcalls,
	})
}

// benchToolchain is the toolchain WASMCSI_BENCH_TOOLCHAIN asks the CSI
// benchmarks to build their modules with.
func benchToolchain(b *testing.B) moduletest.Toolchain {
	switch tc := moduletest.Toolchain(os.Getenv("WASMCSI_BENCH_TOOLCHAIN")); tc {
	case "", moduletest.Go:
		return moduletest.Go
	case moduletest.TinyGo:
		return tc
	default:
		b.Fatalf("WASMCSI_BENCH_TOOLCHAIN=%q: want go or tinygo", tc)
		return ""
	}
}

func mountCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// runClients runs b.N operations from clients goroutines, each taking the
// next operation number until b.N are done, and reports the rate as unit
// (operations per second of wall time). The first error fails the
// benchmark.
func runClients(b *testing.B, clients int, unit string, op func(ctx context.Context, i int64) error) {
	b.Helper()
	ctx := context.Background()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	b.ResetTimer()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = err })
					next.Store(int64(b.N)) // the others stop too
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
}

// createDelete returns an operation that creates the volume "<prefix>-<i>"
// with capability c and deletes it again.
func createDelete(d *daemon, prefix string, c *csi.VolumeCapability, size int64) func(context.Context, int64) error {
	ctrl := d.controller()
	return func(ctx context.Context, i int64) error {
		req := &csi.CreateVolumeRequest{
			Name:               prefix + "-" + strconv.FormatInt(i, 10),
			VolumeCapabilities: []*csi.VolumeCapability{c},
		}
		if size > 0 {
			req.CapacityRange = &csi.CapacityRange{RequiredBytes: size}
		}
		resp, err := ctrl.CreateVolume(ctx, req)
		if err != nil {
			return fmt.Errorf("create %s: %w", req.Name, err)
		}
		if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
			return fmt.Errorf("delete %s: %w", resp.GetVolume().GetVolumeId(), err)
		}
		return nil
	}
}

// requireNoVolumes fails when a benchmark left a volume record or a file
// in the pool behind: every pair must really have deleted what it created.
func requireNoVolumes(b *testing.B, d *daemon) {
	b.Helper()
	resp, err := d.controller().ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil {
		b.Fatalf("list volumes: %v", err)
	}
	if n := len(resp.GetEntries()); n != 0 {
		b.Fatalf("%d volume records left after create+delete pairs", n)
	}
	left, err := os.ReadDir(d.pool)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range left {
		if e.Name()[0] != '.' {
			b.Fatalf("pool holds %s after create+delete pairs", e.Name())
		}
	}
}

// BenchmarkCreateDeleteVolume measures CreateVolume+DeleteVolume pairs of
// localdir directory volumes (each record write fsynced) from one and from
// eight concurrent clients.
func BenchmarkCreateDeleteVolume(b *testing.B) {
	d := benchDaemon(b, "localdir")
	var run atomic.Int64 // a sub-benchmark runs several times: fresh names each run
	for _, clients := range []int{1, 8} {
		b.Run("clients="+strconv.Itoa(clients), func(b *testing.B) {
			runClients(b, clients, "pairs/s", createDelete(d, fmt.Sprintf("cd%d-%d", clients, run.Add(1)), mountCapability(), 0))
			requireNoVolumes(b, d)
		})
	}
}

// BenchmarkBlockCreateDelete measures CreateVolume+DeleteVolume pairs of
// 1 GiB loopfile block volumes (sparse files) from one and eight clients.
func BenchmarkBlockCreateDelete(b *testing.B) {
	d := benchDaemon(b, "loopfile")
	var run atomic.Int64
	for _, clients := range []int{1, 8} {
		b.Run("clients="+strconv.Itoa(clients), func(b *testing.B) {
			runClients(b, clients, "pairs/s", createDelete(d, fmt.Sprintf("bcd%d-%d", clients, run.Add(1)), blockCapability(), 1<<30))
			requireNoVolumes(b, d)
		})
	}
}

// nodeVolume is one volume a node benchmark stages and publishes.
type nodeVolume struct {
	d       *daemon
	id      string
	c       *csi.VolumeCapability
	staging string
	target  string
}

// newNodeVolume creates a volume of size bytes (0: the backend's default)
// and gives it a staging and a target path. When the benchmark ends it is
// unpublished, unstaged and deleted; whatever the daemon could not undo is
// unmounted and detached directly, so no mount or loop device outlives the
// benchmark.
func newNodeVolume(b *testing.B, d *daemon, name string, c *csi.VolumeCapability, size int64) *nodeVolume {
	b.Helper()
	ctx := context.Background()
	req := &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{c}}
	if size > 0 {
		req.CapacityRange = &csi.CapacityRange{RequiredBytes: size}
	}
	resp, err := d.controller().CreateVolume(ctx, req)
	if err != nil {
		b.Fatalf("create %s: %v", name, err)
	}
	work, err := os.MkdirTemp("", "wcsi-bench-")
	if err != nil {
		b.Fatal(err)
	}
	v := &nodeVolume{
		d: d, id: resp.GetVolume().GetVolumeId(), c: c,
		staging: filepath.Join(work, "staging"),
		target:  filepath.Join(work, "target"),
	}
	file := resp.GetVolume().GetVolumeContext()["path"] // loopfile's volume file
	b.Cleanup(func() {
		if err := v.unpublish(ctx); err != nil {
			b.Errorf("cleanup: %v", err)
		}
		if err := v.unstage(ctx); err != nil {
			b.Errorf("cleanup: %v", err)
		}
		for _, p := range []string{v.target, v.staging} {
			if err := unix.Unmount(p, unix.MNT_DETACH); err == nil {
				b.Errorf("cleanup: %s was still mounted", p)
			}
		}
		if file != "" {
			if dev, ok, err := loop.Find(ctx, file); err == nil && ok {
				b.Errorf("cleanup: %s still attached to %s", file, dev.Path)
				_ = loop.DetachBound(ctx, dev)
			}
		}
		if _, err := d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			b.Errorf("cleanup: delete %s: %v", v.id, err)
		}
		os.RemoveAll(work)
	})
	return v
}

func (v *nodeVolume) stage(ctx context.Context) error {
	_, err := v.d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: v.c,
	})
	if err != nil {
		return fmt.Errorf("stage %s: %w", v.id, err)
	}
	return nil
}

func (v *nodeVolume) publish(ctx context.Context) error {
	_, err := v.d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: v.c,
	})
	if err != nil {
		return fmt.Errorf("publish %s: %w", v.id, err)
	}
	return nil
}

func (v *nodeVolume) unpublish(ctx context.Context) error {
	_, err := v.d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
	if err != nil {
		return fmt.Errorf("unpublish %s: %w", v.id, err)
	}
	return nil
}

func (v *nodeVolume) unstage(ctx context.Context) error {
	_, err := v.d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
	if err != nil {
		return fmt.Errorf("unstage %s: %w", v.id, err)
	}
	return nil
}

// requireMounted fails unless path is (want) or is not (!want) a mount
// point, so a benchmark cannot pass on calls that did nothing.
func requireMounted(b *testing.B, path string, want bool) {
	b.Helper()
	mounted, err := mount.IsMountPoint(path)
	if errors.Is(err, os.ErrNotExist) {
		mounted, err = false, nil
	}
	if err != nil {
		b.Fatalf("mount point %s: %v", path, err)
	}
	if mounted != want {
		b.Fatalf("%s mounted = %v, want %v", path, mounted, want)
	}
}

// BenchmarkPublishUnpublish measures NodePublishVolume+NodeUnpublishVolume
// pairs (a target folder made and removed, a bind mount and its unmount,
// each recorded durably) of a localdir volume staged once.
func BenchmarkPublishUnpublish(b *testing.B) {
	requireRoot(b)
	d := benchDaemon(b, "localdir")
	v := newNodeVolume(b, d, "pub", mountCapability(), 0)
	ctx := context.Background()
	if err := v.stage(ctx); err != nil {
		b.Fatal(err)
	}
	b.Run("localdir", func(b *testing.B) {
		if err := v.publish(ctx); err != nil {
			b.Fatal(err)
		}
		requireMounted(b, v.target, true)
		if err := v.unpublish(ctx); err != nil {
			b.Fatal(err)
		}
		runClients(b, 1, "pairs/s", func(ctx context.Context, _ int64) error {
			if err := v.publish(ctx); err != nil {
				return err
			}
			return v.unpublish(ctx)
		})
		requireMounted(b, v.target, false)
	})
}

// BenchmarkStageCycle measures NodeStage+NodePublish+NodeUnpublish+
// NodeUnstage cycles of an already-formatted volume: for loopfile mount
// access a loop attach, a filesystem probe, an ext4 mount, a bind, and
// their undoing; for loopfile block access a loop attach, a bind of the
// device node, and their undoing; for localdir two binds. Besides the rate
// it reports the mean time of each step (stage-ms, ...).
func BenchmarkStageCycle(b *testing.B) {
	requireRoot(b)
	daemons := map[string]*daemon{}
	for _, tc := range []struct {
		backend string
		access  string
		c       *csi.VolumeCapability
		size    int64
	}{
		{"localdir", "mount", mountCapability(), 0},
		{"loopfile", "mount", mountCapability(), 16 << 20},
		{"loopfile", "block", blockCapability(), 16 << 20},
	} {
		name := tc.backend + "/" + tc.access
		if _, err := os.Stat(filepath.Join("..", "examples", tc.backend)); err != nil {
			b.Run(name, func(b *testing.B) { b.Skipf("example module %s is not in the tree: %v", tc.backend, err) })
			continue
		}
		d := daemons[tc.backend]
		if d == nil {
			d = benchDaemon(b, tc.backend)
			daemons[tc.backend] = d
		}
		v := newNodeVolume(b, d, "cycle-"+tc.access, tc.c, tc.size)
		steps := []struct {
			name string
			do   func(context.Context) error
			took time.Duration
		}{{"stage", v.stage, 0}, {"publish", v.publish, 0}, {"unpublish", v.unpublish, 0}, {"unstage", v.unstage, 0}}
		cycle := func(ctx context.Context, _ int64) error {
			for i := range steps {
				start := time.Now()
				if err := steps[i].do(ctx); err != nil {
					return err
				}
				steps[i].took += time.Since(start)
			}
			return nil
		}
		// The first stage of a mount volume formats it: not measured.
		if err := cycle(context.Background(), 0); err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			for i := range steps {
				steps[i].took = 0
			}
			runClients(b, 1, "cycles/s", cycle)
			for _, s := range steps {
				b.ReportMetric(float64(s.took.Microseconds())/1000/float64(b.N), s.name+"-ms")
			}
			requireMounted(b, v.staging, false)
			requireMounted(b, v.target, false)
		})
	}
}

// BenchmarkModuleCall measures one operation through the real module
// runtime (pooled instance, deadline, request and response copies) for the
// localdir module built with each toolchain: node_info runs only guest
// code and the codec of two small messages; get_capacity adds one host
// call (statfs of the pool). Besides the mean (ns/op), which the machine's
// other work inflates, it reports the median and the 99th percentile of
// the single calls. (examples/bench_test.go times backend_info, a larger
// answer, for every example module.)
func BenchmarkModuleCall(b *testing.B) {
	for _, tc := range moduletest.Toolchains {
		b.Run(string(tc), func(b *testing.B) {
			wasm := moduletest.Build(b, "../examples/localdir", tc)
			lm := moduletest.Load(b, wasm, moduletest.Options{
				Name:      "localdir",
				Grant:     modules.Grant{HostCalls: []string{"dir", "mount"}, Roots: []string{b.TempDir()}},
				HostCalls: catalog.All(),
			})
			if lm.Info.Name != "localdir" {
				b.Fatalf("backend_info names %q, want localdir", lm.Info.Name)
			}
			m, ok := lm.Runtime().Module("localdir")
			if !ok {
				b.Fatal("module localdir not loaded")
			}
			for _, op := range []struct {
				op  abi.Op
				req abi.Message
			}{
				{abi.OpNodeInfo, &abi.Empty{}},
				{abi.OpGetCapacity, &abi.GetCapacityRequest{}},
			} {
				b.Run(string(op.op), func(b *testing.B) {
					benchModuleOp(b, m, op.op, op.req.AppendWire(nil))
				})
			}
		})
	}
}

func benchModuleOp(b *testing.B, m *modules.Module, op abi.Op, req []byte) {
	ctx := context.Background()
	// Check once that the answer is real before timing.
	if resp, err := m.Call(ctx, op, req); err != nil {
		b.Fatalf("%s: %v", op, err)
	} else if len(resp) == 0 {
		b.Fatalf("%s answered nothing", op)
	}
	times := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		_, err := m.Call(ctx, op, req)
		if len(times) < cap(times) {
			times = append(times, time.Since(start))
		}
		if err != nil {
			b.Fatalf("%s: %v", op, err)
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns")
}
