package host_test

// Benchmarks of how the daemon's costs grow with the number of volumes it
// keeps: CreateVolume and a ListVolumes page with 100 and with 10,000 live
// localdir volumes (on disk, records durable), and the daemon program's
// start-up time and resident memory with 10,000 volumes of which 1,000 are
// staged. The targets are ratios measured within one run, so the machine's
// other work moves both sides alike; docs/PERFORMANCE.md ("At scale") has
// the numbers.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
)

// scaleSizes are the numbers of live volumes the scale benchmarks compare.
var scaleSizes = []int{100, 10000}

// fillVolumes creates n volumes named "<prefix>-<i>" from 8 clients and
// returns their IDs.
func fillVolumes(b *testing.B, ctrl csi.ControllerClient, prefix string, n int) []string {
	b.Helper()
	ids := make([]string, n)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  error
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				resp, err := ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
					Name:               prefix + "-" + strconv.Itoa(i),
					VolumeCapabilities: []*csi.VolumeCapability{mountCapability()},
				})
				if err != nil {
					errOnce.Do(func() { failed = fmt.Errorf("fill %s-%d: %w", prefix, i, err) })
					next.Store(int64(n))
					return
				}
				ids[i] = resp.GetVolume().GetVolumeId()
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	return ids
}

// live is a daemon that keeps a fixed number of volumes: each timed
// create is followed by the deletion (untimed) of the oldest volume, so
// every volume lives as long as the number kept makes it, through the
// record checkpoints a real volume lives through, and the count stays put.
type live struct {
	ctrl func() csi.ControllerClient // the daemon's current connection
	ids  []string                    // oldest first
}

// create times one CreateVolume of name and deletes the oldest volume.
func (l *live) create(ctx context.Context, name string) (time.Duration, error) {
	ctrl := l.ctrl()
	start := time.Now()
	resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csi.VolumeCapability{mountCapability()},
	})
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", name, err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: l.ids[0]}); err != nil {
		return 0, fmt.Errorf("delete %s: %w", l.ids[0], err)
	}
	l.ids = append(l.ids[1:], resp.GetVolume().GetVolumeId())
	return took, nil
}

// median is the middle of values (sorted in place).
func median[T int64 | time.Duration](values []T) T {
	slices.Sort(values)
	return values[len(values)/2]
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// BenchmarkCreateAtScale measures CreateVolume of a localdir volume (one
// client; the oldest volume deleted after each, untimed) in a daemon that
// keeps 100 and one that keeps 10,000 live volumes, both in this process
// on disk.
// live=N times one daemon alone (for profiles); interleaved alternates the
// two call by call and reports both medians and their ratio, the figure
// the target is set on. ListVolumes pages (100 entries, from the middle of
// the list) are timed the same way, and a whole paged walk once.
func BenchmarkCreateAtScale(b *testing.B) {
	daemons := map[int]*daemon{}
	lives := map[int]*live{}
	for _, n := range scaleSizes {
		d := benchDaemon(b, "localdir")
		start := time.Now()
		ids := fillVolumes(b, d.controller(), "live", n)
		b.Logf("%d live volumes created in %v", n, time.Since(start).Round(time.Millisecond))
		daemons[n], lives[n] = d, &live{ctrl: d.controller, ids: ids}
	}
	var run atomic.Int64 // a sub-benchmark runs several times: fresh names each run
	for _, n := range scaleSizes {
		b.Run("live="+strconv.Itoa(n), func(b *testing.B) {
			prefix := fmt.Sprintf("new%d", run.Add(1))
			times := make([]time.Duration, 0, b.N)
			stopProfile := profileCPU(b, "live"+strconv.Itoa(n))
			before := processCost(b)
			for i := 0; b.Loop(); i++ {
				took, err := lives[n].create(context.Background(), prefix+"-"+strconv.Itoa(i))
				if err != nil {
					b.Fatal(err)
				}
				times = append(times, took)
			}
			after := processCost(b)
			stopProfile()
			b.ReportMetric(ms(median(times)), "p50-ms")
			// Per create+delete pair, everything in this process: the
			// daemon's background checkpoints included.
			b.ReportMetric(ms(after.cpu-before.cpu)/float64(b.N), "cpu-ms/pair")
			b.ReportMetric(float64(after.written-before.written)/1024/float64(b.N), "written-KiB/pair")
		})
	}
	b.Run("interleaved", func(b *testing.B) {
		prefix := fmt.Sprintf("mix%d", run.Add(1))
		times := map[int][]time.Duration{}
		for i := 0; b.Loop(); i++ {
			for _, n := range scaleSizes {
				took, err := lives[n].create(context.Background(), prefix+"-"+strconv.Itoa(i))
				if err != nil {
					b.Fatal(err)
				}
				times[n] = append(times[n], took)
			}
		}
		reportRatio(b, times, "create")
	})
	b.Run("list-page", func(b *testing.B) {
		times := map[int][]time.Duration{}
		tokens := map[int]string{}
		for _, n := range scaleSizes {
			// The token of a page in the middle of the list (the first
			// page of the small one).
			if skip := n/2 - 50; skip > 0 {
				resp, err := daemons[n].controller().ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: int32(skip)})
				if err != nil {
					b.Fatal(err)
				}
				tokens[n] = resp.GetNextToken()
			}
		}
		for b.Loop() {
			for _, n := range scaleSizes {
				start := time.Now()
				resp, err := daemons[n].controller().ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: 100, StartingToken: tokens[n]})
				times[n] = append(times[n], time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				if got := len(resp.GetEntries()); got != 100 {
					b.Fatalf("a page of %d live volumes from the middle holds %d entries", n, got)
				}
			}
		}
		reportRatio(b, times, "page")
	})
	b.Run("list-walk", func(b *testing.B) {
		times := map[int][]time.Duration{}
		for b.Loop() {
			for _, n := range scaleSizes {
				start := time.Now()
				seen := walkVolumes(b, daemons[n].controller())
				times[n] = append(times[n], time.Since(start))
				if seen != n {
					b.Fatalf("a paged walk of %d live volumes saw %d", n, seen)
				}
			}
		}
		reportRatio(b, times, "walk")
		// What a CO that does not page gets: every volume in one message,
		// which gRPC clients refuse past 4 MiB by default.
		for _, n := range scaleSizes {
			resp, err := daemons[n].controller().ListVolumes(context.Background(), &csi.ListVolumesRequest{})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(proto.Size(resp))/1024, fmt.Sprintf("unpaged-%d-KiB", n))
		}
	})
}

// envScaleProfile names a folder: each live=N sub-benchmark of
// BenchmarkCreateAtScale writes a CPU profile of its timed loop alone
// (live<N>.pprof) there, without the creation of the volumes it starts
// with, which -cpuprofile would include.
const envScaleProfile = "WASMCSI_SCALE_PROFILE"

// profileCPU starts a CPU profile into <$WASMCSI_SCALE_PROFILE>/<name>.pprof
// and returns what stops it; without the variable it does nothing.
func profileCPU(b *testing.B, name string) (stop func()) {
	b.Helper()
	dir := os.Getenv(envScaleProfile)
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatalf("%s: %v (not with -cpuprofile)", envScaleProfile, err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}

// cost is what this process has used so far: CPU time (user and system)
// and bytes it caused to be written to disk.
type cost struct {
	cpu     time.Duration
	written int64
}

func processCost(b *testing.B) cost {
	b.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	c := cost{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			if c.written, err = strconv.ParseInt(strings.TrimSpace(rest), 10, 64); err != nil {
				b.Fatal(err)
			}
		}
	}
	return c
}

// walkVolumes lists every volume in pages of 100 and returns how many it saw.
func walkVolumes(b *testing.B, ctrl csi.ControllerClient) int {
	b.Helper()
	seen, token := 0, ""
	for {
		resp, err := ctrl.ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: 100, StartingToken: token})
		if err != nil {
			b.Fatal(err)
		}
		seen += len(resp.GetEntries())
		if token = resp.GetNextToken(); token == "" {
			return seen
		}
	}
}

// reportRatio reports the median of each size's times and the ratio of the
// largest size's median to the smallest's.
func reportRatio(b *testing.B, times map[int][]time.Duration, what string) {
	b.Helper()
	first, last := scaleSizes[0], scaleSizes[len(scaleSizes)-1]
	for _, n := range scaleSizes {
		b.ReportMetric(ms(median(times[n])), fmt.Sprintf("%s-%d-p50-ms", what, n))
	}
	b.ReportMetric(float64(median(times[last]))/float64(median(times[first])), fmt.Sprintf("%s-ratio-%d/%d", what, last, first))
}

// BenchmarkStartAtScale measures the daemon program (a child process, as
// an operator runs it) starting on the records of 100 and of 10,000 live
// localdir volumes, a tenth of them staged (bind mounts): the time from
// exec until it answers Probe ready, after its start-up reconciliation,
// and its resident memory (VmRSS) then, after a paged walk of every
// volume, and at its peak (VmHWM). Each iteration stops the daemon
// gracefully and starts it again (start-ms), then makes 200 volumes and
// deletes 200 old ones, kills it (SIGKILL) and starts it again: that start
// replays the log records the crash left (crash-start-ms).
func BenchmarkStartAtScale(b *testing.B) {
	var dirs []string
	for _, n := range scaleSizes {
		b.Run("live="+strconv.Itoa(n), func(b *testing.B) {
			d := daemontest.New(b, daemontest.Options{Modules: []daemontest.Module{
				{Name: "localdir", Wasm: localdirWasm(b), HostCalls: []string{"dir", "mount"}, Pool: true, Config: map[string]string{"quota": "off"}},
			}})
			dirs = append(dirs, d.Dir)
			if err := d.Start(); err != nil {
				b.Fatal(err)
			}
			ids := fillVolumes(b, d.Controller(), "live", n)
			// The newest tenth staged; the rest take turns being deleted.
			staged := stageVolumes(b, d, ids[n-n/10:])
			b.Logf("%d volumes, %d of them staged", n, staged)
			l := &live{ctrl: d.Controller, ids: ids[:n-n/10]}
			var (
				starts, crashStarts []time.Duration
				cpu, crashCPU       []time.Duration // the daemon's own CPU time until ready
				rss, walked, peak   []int64         // KiB
			)
			timedStart := func(cpus *[]time.Duration) time.Duration {
				begin := time.Now()
				if err := d.Start(); err != nil {
					b.Fatal(err)
				}
				took := time.Since(begin)
				*cpus = append(*cpus, processCPU(b, d.Pid()))
				return took
			}
			for i := 0; b.Loop(); i++ {
				if err := d.Stop(); err != nil {
					b.Fatal(err)
				}
				starts = append(starts, timedStart(&cpu))
				r, _ := residentKiB(b, d.Pid())
				rss = append(rss, r)
				if seen := walkVolumes(b, d.Controller()); seen != n {
					b.Fatalf("a paged walk of %d volumes saw %d", n, seen)
				}
				r, p := residentKiB(b, d.Pid())
				walked, peak = append(walked, r), append(peak, p)
				for j := range 200 {
					if _, err := l.create(context.Background(), fmt.Sprintf("crash%d-%d", i, j)); err != nil {
						b.Fatal(err)
					}
				}
				d.Kill(true)
				crashStarts = append(crashStarts, timedStart(&crashCPU))
			}
			b.ReportMetric(ms(median(starts)), "start-ms")
			b.ReportMetric(ms(median(crashStarts)), "crash-start-ms")
			// CPU time moves less than wall time with the machine's load.
			b.ReportMetric(ms(median(cpu)), "start-cpu-ms")
			b.ReportMetric(ms(median(crashCPU)), "crash-start-cpu-ms")
			b.ReportMetric(float64(median(rss))/1024, "rss-MiB")
			b.ReportMetric(float64(median(walked))/1024, "walked-rss-MiB")
			b.ReportMetric(float64(median(peak))/1024, "peak-rss-MiB")
		})
	}
	for _, dir := range dirs { // the sub-benchmarks' cleanups have run
		if ms, err := daemontest.MountsUnder(dir); err != nil || len(ms) > 0 {
			b.Errorf("mounts below %s outlived the benchmark: %v %v", dir, ms, err)
		}
	}
}

// stageVolumes stages each volume at a staging path below the daemon's
// folder and returns how many it staged. Every stage is undone when the
// benchmark ends, before the daemon's own cleanup releases whatever is
// still mounted below its folder.
func stageVolumes(b *testing.B, d *daemontest.Daemon, ids []string) int {
	b.Helper()
	paths := make([]string, len(ids))
	b.Cleanup(func() {
		for i, id := range ids {
			if paths[i] == "" {
				continue
			}
			_, err := d.Node().NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: paths[i]})
			if err != nil {
				b.Errorf("cleanup: unstage %s: %v", id, err)
				unix.Unmount(paths[i], unix.MNT_DETACH)
			}
		}
	})
	for i, id := range ids {
		p := filepath.Join(d.Dir, "staging", strconv.Itoa(i))
		_, err := d.Node().NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
			VolumeId: id, StagingTargetPath: p, VolumeCapability: mountCapability(),
		})
		if err != nil {
			b.Fatalf("stage %s: %v", id, err)
		}
		paths[i] = p
	}
	return len(ids)
}

// processCPU reads the CPU time (user and system) a process has used.
func processCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 12th and 13th of them, in
	// clock ticks (USER_HZ, 100 on Linux).
	_, rest, ok := strings.Cut(string(data), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// residentKiB reads a process's resident set size and its peak in KiB.
func residentKiB(b *testing.B, pid int) (rss, peak int64) {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for key, into := range map[string]*int64{"VmRSS:": &rss, "VmHWM:": &peak} {
			if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
				v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					b.Fatalf("%s %q: %v", key, rest, err)
				}
				*into = v
			}
		}
	}
	if rss == 0 || peak == 0 {
		b.Fatalf("no VmRSS or VmHWM in /proc/%d/status", pid)
	}
	return rss, peak
}
