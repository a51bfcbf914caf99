// Command sidebyside runs wasmcsi and csi-driver-host-path side by side on
// the same filesystem and measures both in alternating rounds, so that load
// from elsewhere on the machine falls on both alike: Create+Delete pairs per
// second with one client and with several, Publish+Unpublish pairs per
// second of one staged volume, and the floor under publishing — mkdir, bind
// mount, unmount, rmdir of a folder — measured in the same rounds; and
// wasmcsi's NodeStage+NodeUnstage of a loopfile volume (ext4 and block)
// against its kernel floor (stage.go). It prints each round's numbers, their
// medians and the ratios with their range.
//
// It is a module of its own so that the daemon's go.mod carries neither the
// reference driver nor anything only this command needs. The reference is
// built once from its source tarball (with vendor/: the module proxy does not
// serve it) found in WASMCSI_THIRDPARTY, into a cache folder keyed by its
// version; without the tarball the reference is skipped with the reason and
// wasmcsi and the floor are still measured.
//
// Needs root (mounts). Everything it starts or mounts lives in one temporary
// folder and is torn down on every exit, also on failure or interrupt.
//
//	make bench-sidebyside            (from the repository root)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	repo := flag.String("repo", ".", "repository root: bin/wasmcsi and bin/modules from make build")
	rounds := flag.Int("rounds", 3, "alternating rounds")
	dur := flag.Duration("duration", 2*time.Second, "time each driver runs each metric per round")
	clients := flag.Int("clients", 8, "concurrent clients of the many-client Create+Delete")
	thirdparty := flag.String("thirdparty", envOr("WASMCSI_THIRDPARTY", ""), "folder holding csi-driver-host-path-<version>.tar.gz (default: <repo>/../shared/thirdparty)")
	cache := flag.String("cache", envOr("WASMCSI_HOSTPATH_CACHE", "/var/cache/wasmcsi"), "folder where hostpath-<version>/hostpathplugin is built once")
	flag.Parse()

	if os.Geteuid() != 0 {
		fmt.Println("sidebyside: skipped: publishing and the bind-mount floor need root")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, config{*repo, *rounds, *dur, *clients, *thirdparty, *cache}); err != nil {
		fmt.Fprintln(os.Stderr, "sidebyside:", err)
		os.Exit(1)
	}
}

type config struct {
	repo       string
	rounds     int
	dur        time.Duration
	clients    int
	thirdparty string
	cache      string
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, cfg config) (err error) {
	repo, err := filepath.Abs(cfg.repo)
	if err != nil {
		return err
	}
	if cfg.thirdparty == "" {
		cfg.thirdparty = filepath.Join(repo, "..", "shared", "thirdparty")
	}
	hostpathBin, skip := buildHostpath(ctx, cfg)
	if skip != "" {
		fmt.Println("sidebyside: csi-driver-host-path skipped:", skip)
	}

	work, err := os.MkdirTemp("", "wasmcsi-sidebyside.")
	if err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(work, &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		os.Remove(work)
		return fmt.Errorf("%s is on tmpfs; the comparison is on disk: set TMPDIR to a folder on disk", work)
	}
	var procs []*exec.Cmd
	defer func() {
		if terr := teardown(work, procs); terr != nil && err == nil {
			err = terr
		}
	}()

	fmt.Printf("sidebyside: working in %s; load average %s\n", work, loadavg())
	wasm, cmd, err := startWasmcsi(ctx, repo, work)
	if cmd != nil {
		procs = append(procs, cmd)
	}
	if err != nil {
		return err
	}
	drivers := []*driver{wasm}
	if hostpathBin != "" {
		hp, cmd, err := startHostpath(ctx, hostpathBin, work)
		if cmd != nil {
			procs = append(procs, cmd)
		}
		if err != nil {
			return err
		}
		drivers = append(drivers, hp)
	}
	stageSkip := stageSkipped("/dev/loop-control")
	if stageSkip != "" {
		fmt.Println("sidebyside: stage cycle skipped:", stageSkip)
	}
	floorDir := filepath.Join(work, "floor")
	if err := os.MkdirAll(filepath.Join(floorDir, "src"), 0o750); err != nil {
		return err
	}

	// Warm up: the first calls compile modules and open files.
	for _, d := range drivers {
		if _, err := createDelete(ctx, d, 1, 200*time.Millisecond); err != nil {
			return fmt.Errorf("%s: warm-up: %w", d.name, err)
		}
		if _, err := publishUnpublish(ctx, d, 200*time.Millisecond); err != nil {
			return fmt.Errorf("%s: warm-up: %w", d.name, err)
		}
	}

	res := map[string]map[string][]float64{} // metric -> driver -> per round
	add := func(m, d string, v float64) {
		if res[m] == nil {
			res[m] = map[string][]float64{}
		}
		res[m][d] = append(res[m][d], v)
	}
	cd8 := fmt.Sprintf("Create+Delete, %d clients", cfg.clients)
	var syncMs []float64
	for r := 0; r < cfg.rounds; r++ {
		// Every durable operation waits for the disk; its sync latency
		// drifts with what else uses the storage, so each round records it.
		ms, err := syncLatency(floorDir)
		if err != nil {
			return err
		}
		syncMs = append(syncMs, ms)
		for _, d := range drivers {
			v, err := createDelete(ctx, d, 1, cfg.dur)
			if err != nil {
				return fmt.Errorf("%s: round %d: %w", d.name, r+1, err)
			}
			add("Create+Delete, 1 client", d.name, v)
		}
		for _, d := range drivers {
			v, err := createDelete(ctx, d, cfg.clients, cfg.dur)
			if err != nil {
				return fmt.Errorf("%s: round %d: %w", d.name, r+1, err)
			}
			add(cd8, d.name, v)
		}
		for _, d := range drivers {
			v, err := publishUnpublish(ctx, d, cfg.dur)
			if err != nil {
				return fmt.Errorf("%s: round %d: %w", d.name, r+1, err)
			}
			add("Publish+Unpublish", d.name, v)
		}
		v, err := floor(ctx, floorDir, cfg.dur)
		if err != nil {
			return fmt.Errorf("floor: round %d: %w", r+1, err)
		}
		add("Publish+Unpublish", "floor", v)
		// What any CSI driver's stage cycle pays before it does anything:
		// two gRPC round trips, timed with a call that does no work.
		for _, d := range drivers {
			if stageSkip != "" {
				break
			}
			v, err := rpcPair(ctx, d, cfg.dur/4)
			if err != nil {
				return fmt.Errorf("%s: round %d: %w", d.name, r+1, err)
			}
			add(rpcPairMetric, d.name, v)
		}
		for _, k := range stageCycleKinds {
			if stageSkip != "" {
				break
			}
			w, f, err := stageCycle(ctx, wasm, floorDir, k, cfg.dur)
			if err != nil {
				return fmt.Errorf("%s: round %d: %w", k.name, r+1, err)
			}
			add(k.name, "wasmcsi", w)
			add(k.name, "floor", f)
		}
	}

	fmt.Printf("\npairs per second, %d rounds of %v per driver and metric, interleaved; load average now %s\n", cfg.rounds, cfg.dur, loadavg())
	fmt.Printf("%-28s %-9s %s  %8s\n", "metric", "driver", roundHeader(cfg.rounds), "median")
	fmt.Printf("%-28s %-9s %s  %8.2f\n", "4 KiB write+fdatasync, ms", "disk", roundCells(syncMs, "%8.2f"), median(syncMs))
	metrics := []string{"Create+Delete, 1 client", cd8, "Publish+Unpublish"}
	for _, m := range metrics {
		for _, d := range []string{"wasmcsi", "hostpath", "floor"} {
			vs, ok := res[m][d]
			if !ok {
				continue
			}
			fmt.Printf("%-28s %-9s %s  %8.0f\n", m, d, roundCells(vs, "%8.0f"), median(vs))
		}
	}
	if stageSkip == "" {
		fmt.Printf("\nloopfile volume of %d MiB, microseconds per cycle (median of the round's cycles), wasmcsi and floor alternating cycle by cycle\n", stageVolumeBytes>>20)
		fmt.Printf("%-28s %-9s %s  %8s\n", "metric", "driver", roundHeader(cfg.rounds), "median")
		for _, k := range stageCycleKinds {
			for _, d := range []string{"wasmcsi", "floor"} {
				vs := res[k.name][d]
				fmt.Printf("%-28s %-9s %s  %8.0f\n", k.name, d, roundCells(vs, "%8.0f"), median(vs))
			}
		}
	}
	for _, d := range []string{"wasmcsi", "hostpath"} {
		if vs, ok := res[rpcPairMetric][d]; ok && stageSkip == "" {
			fmt.Printf("%-28s %-9s %s  %8.0f\n", rpcPairMetric, d, roundCells(vs, "%8.0f"), median(vs))
		}
	}
	fmt.Println()
	fmt.Printf("%-28s %-26s %s  %8s  %s\n", "metric", "ratio", roundHeader(cfg.rounds), "median", "range")
	ratio := func(m, label string, num, den []float64, target string) {
		if len(num) == 0 || len(den) == 0 {
			return
		}
		rs := make([]float64, len(num))
		for i := range num {
			rs[i] = num[i] / den[i]
		}
		lo, hi := minmax(rs)
		fmt.Printf("%-28s %-26s %s  %7.2fx  %.2f-%.2fx  (target %s)\n", m, label, roundCells(rs, "%7.2fx"), median(rs), lo, hi, target)
	}
	// info prints a ratio that has no target, for context.
	info := func(m, label string, num, den []float64) {
		if len(num) == 0 || len(num) != len(den) {
			return
		}
		rs := make([]float64, len(num))
		for i := range num {
			rs[i] = num[i] / den[i]
		}
		lo, hi := minmax(rs)
		fmt.Printf("%-28s %-26s %s  %7.2fx  %.2f-%.2fx\n", m, label, roundCells(rs, "%7.2fx"), median(rs), lo, hi)
	}
	ratio(metrics[0], "wasmcsi/hostpath", res[metrics[0]]["wasmcsi"], res[metrics[0]]["hostpath"], ">= 1.0x")
	ratio(metrics[1], "wasmcsi/hostpath", res[metrics[1]]["wasmcsi"], res[metrics[1]]["hostpath"], ">= 1.5x")
	ratio(metrics[2], "wasmcsi/hostpath", res[metrics[2]]["wasmcsi"], res[metrics[2]]["hostpath"], ">= 20x")
	// Cost relative to the floor: how many times the floor's time one
	// wasmcsi pair takes.
	ratio(metrics[2], "floor/wasmcsi (time)", res[metrics[2]]["floor"], res[metrics[2]]["wasmcsi"], "<= 10x")
	for _, k := range stageCycleKinds {
		ratio(k.name, "wasmcsi/floor (time)", res[k.name]["wasmcsi"], res[k.name]["floor"], "<= 1.5x")
	}
	// How much of the stage target two calls that do nothing use up.
	for _, k := range stageCycleKinds {
		info(k.name, "2 no-op RPCs/floor (time)", res[rpcPairMetric]["wasmcsi"], res[k.name]["floor"])
	}
	return nil
}

// rpcPairMetric names the time of two gRPC calls that do no work.
const rpcPairMetric = "2 no-op RPCs, us"

// rpcPair returns the median time, in microseconds, of two
// NodeGetCapabilities calls in a row (a stage cycle's two round trips,
// without the work), over dur.
func rpcPair(ctx context.Context, d *driver, dur time.Duration) (float64, error) {
	var ts []float64
	for deadline := time.Now().Add(dur); time.Now().Before(deadline) || len(ts) < 3; {
		start := time.Now()
		for range 2 {
			if _, err := d.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{}); err != nil {
				return 0, fmt.Errorf("NodeGetCapabilities: %w", err)
			}
		}
		ts = append(ts, float64(time.Since(start).Nanoseconds())/1e3)
	}
	return median(ts), nil
}

func roundHeader(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, " %8s", fmt.Sprintf("round %d", i))
	}
	return b.String()
}

func roundCells(vs []float64, f string) string {
	var b strings.Builder
	for _, v := range vs {
		b.WriteString(" ")
		fmt.Fprintf(&b, f, v)
	}
	return b.String()
}

func median(vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minmax(vs []float64) (lo, hi float64) {
	lo, hi = vs[0], vs[0]
	for _, v := range vs {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// driver is one CSI plugin under measurement.
type driver struct {
	name   string
	conn   *grpc.ClientConn
	ctrl   csi.ControllerClient
	node   csi.NodeClient
	params map[string]string
	dir    string // its folder in the work folder: staging and target paths
	seq    atomic.Int64
}

func newDriver(name, sock, dir string, params map[string]string) (*driver, error) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &driver{name: name, conn: conn, ctrl: csi.NewControllerClient(conn), node: csi.NewNodeClient(conn), params: params, dir: dir}, nil
}

var mountCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func (d *driver) create(ctx context.Context) (string, error) {
	resp, err := d.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               fmt.Sprintf("sbs-%d-%d", os.Getpid(), d.seq.Add(1)),
		VolumeCapabilities: []*csi.VolumeCapability{mountCap},
		Parameters:         d.params,
	})
	if err != nil {
		return "", fmt.Errorf("CreateVolume: %w", err)
	}
	return resp.GetVolume().GetVolumeId(), nil
}

func (d *driver) delete(ctx context.Context, id string) error {
	if _, err := d.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		return fmt.Errorf("DeleteVolume %s: %w", id, err)
	}
	return nil
}

// createDelete runs Create+Delete pairs from n clients for dur and returns
// pairs per second.
func createDelete(ctx context.Context, d *driver, n int, dur time.Duration) (float64, error) {
	var pairs atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := time.Now()
	deadline := start.Add(dur)
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				id, err := d.create(ctx)
				if err != nil {
					errs[c] = err
					return
				}
				if err := d.delete(ctx, id); err != nil {
					errs[c] = err
					return
				}
				pairs.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return 0, err
	}
	return float64(pairs.Load()) / el.Seconds(), nil
}

// publishUnpublish stages one volume, then publishes and unpublishes it to a
// fresh target path per pair for dur, and returns pairs per second. Only the
// pairs are timed.
func publishUnpublish(ctx context.Context, d *driver, dur time.Duration) (rate float64, err error) {
	id, err := d.create(ctx)
	if err != nil {
		return 0, err
	}
	defer func() {
		if derr := d.delete(context.WithoutCancel(ctx), id); derr != nil && err == nil {
			err = derr
		}
	}()
	staging := filepath.Join(d.dir, "staging", id)
	targets := filepath.Join(d.dir, "targets")
	for _, p := range []string{staging, targets} {
		if err := os.MkdirAll(p, 0o750); err != nil {
			return 0, err
		}
	}
	if _, err := d.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap,
	}); err != nil {
		return 0, fmt.Errorf("NodeStageVolume: %w", err)
	}
	defer func() {
		_, uerr := d.node.NodeUnstageVolume(context.WithoutCancel(ctx), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		if uerr != nil && err == nil {
			err = fmt.Errorf("NodeUnstageVolume: %w", uerr)
		}
	}()
	n := 0
	start := time.Now()
	for deadline := start.Add(dur); time.Now().Before(deadline); n++ {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		target := filepath.Join(targets, fmt.Sprintf("t%d", d.seq.Add(1)))
		if _, err := d.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap,
		}); err != nil {
			return 0, fmt.Errorf("NodePublishVolume: %w", err)
		}
		if _, err := d.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			return 0, fmt.Errorf("NodeUnpublishVolume: %w", err)
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// syncLatency is the median time of a 4 KiB overwrite plus fdatasync in
// dir, in milliseconds.
func syncLatency(dir string) (float64, error) {
	f, err := os.CreateTemp(dir, "sync.")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	var ts []float64
	for i := 0; i < 50; i++ {
		start := time.Now()
		if _, err := f.WriteAt(buf, 0); err != nil {
			return 0, err
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return 0, fmt.Errorf("fdatasync %s: %w", f.Name(), err)
		}
		ts = append(ts, float64(time.Since(start).Microseconds())/1000)
	}
	return median(ts), nil
}

// floor is what publishing a folder cannot do without: make the target,
// bind-mount onto it, unmount it, remove it. Pairs per second.
func floor(ctx context.Context, dir string, dur time.Duration) (float64, error) {
	src := filepath.Join(dir, "src")
	n := 0
	start := time.Now()
	for deadline := start.Add(dur); time.Now().Before(deadline); n++ {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t := filepath.Join(dir, fmt.Sprintf("t%d", n))
		if err := unix.Mkdir(t, 0o750); err != nil {
			return 0, fmt.Errorf("mkdir %s: %w", t, err)
		}
		if err := unix.Mount(src, t, "", unix.MS_BIND, ""); err != nil {
			return 0, fmt.Errorf("bind mount %s: %w", t, err)
		}
		if err := unix.Unmount(t, 0); err != nil {
			return 0, fmt.Errorf("unmount %s: %w", t, err)
		}
		if err := unix.Rmdir(t); err != nil {
			return 0, fmt.Errorf("rmdir %s: %w", t, err)
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
