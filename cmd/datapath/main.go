// Command datapath measures the I/O a workload gets from a volume the
// daemon published against the same I/O on the storage under it, in one
// run: fio (libaio, O_DIRECT) against each published volume and against
// its floor, job by job and round by round, so that load from elsewhere on
// the machine falls on both alike.
//
//   - loopfile, block access: the published device node against a file of
//     the same size in the loopfile pool, opened with O_DIRECT.
//   - loopfile, mount access (ext4): a file in the published folder
//     against a file of the same size on the pool's filesystem.
//   - localdir, mount access: the same, on the localdir pool.
//
// It then times snapshots, clones and restores of a loopfile volume with
// 10% and 100% of its blocks written against a copy of its file on the
// pool (FICLONE, or copy_file_range of its data) made durable (clone.go),
// and a node burst: 100 formatted volumes staged and published by 16
// clients against the same kernel operations issued in parallel (burst.go).
//
// Volumes are created, staged and published through the daemon's gRPC
// endpoint (CreateVolume, NodeStageVolume, NodePublishVolume) as bin/wasmcsi
// serve with the embedded configuration serves them, in a temporary folder
// of its own on the filesystem of TMPDIR (which must not be tmpfs). Every
// file fio touches is written in full once before it is measured, so that
// neither side reads holes.
//
// It prints every run's numbers, then per job and volume the median and
// range of IOPS, bandwidth and p50/p99 completion latency of both sides and
// the ratio of the volume to its floor (the median of the per-round
// ratios, with their range), as a Markdown table.
//
// Needs root (mounts, loop devices) and fio; without them it says so and
// exits 0. Everything it starts, mounts or attaches is torn down on every
// exit, also on failure or interrupt.
//
//	make bench-datapath                          (from the repository root)
//	make bench-datapath DATAPATH_FLAGS='-rounds 3 -runtime 20s'
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
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type config struct {
	repo        string
	fioPath     string
	rounds      int
	runtime     time.Duration
	volSize     int64
	fileSize    int64
	only        string
	jobs        string
	fio         bool
	clones      bool
	burst       int
	burstRounds int
	clients     int
	daemonEnv   string
}

func main() {
	var cfg config
	flag.StringVar(&cfg.repo, "repo", ".", "repository root: bin/wasmcsi and bin/modules from make build")
	flag.IntVar(&cfg.rounds, "rounds", 2, "interleaved rounds")
	flag.DurationVar(&cfg.runtime, "runtime", 5*time.Second, "measured time of each fio run (after a 1 s ramp)")
	size := flag.Int("size-mib", 2048, "volume size in MiB (block volumes: the whole device is measured)")
	file := flag.Int("file-mib", 1024, "size in MiB of the file fio uses on mount volumes and of the mount floors")
	flag.StringVar(&cfg.only, "volumes", "", "comma-separated subset of: loopfile-block, loopfile-mount, localdir-mount")
	flag.StringVar(&cfg.jobs, "jobs", "", "comma-separated subset of job names, e.g. '4k randread QD32'")
	flag.BoolVar(&cfg.fio, "fio", true, "run the fio jobs")
	flag.BoolVar(&cfg.clones, "clones", true, "time snapshots, clones and restores of a loopfile volume (-size-mib) against their floor")
	flag.IntVar(&cfg.burst, "burst", 100, "volumes of the node burst (0: none)")
	flag.IntVar(&cfg.clients, "clients", 16, "concurrent clients of the node burst")
	flag.IntVar(&cfg.burstRounds, "burst-rounds", 5, "interleaved rounds of the node burst, after one untimed round")
	flag.StringVar(&cfg.daemonEnv, "daemon-env", "", "comma-separated KEY=VALUE settings for the daemon, e.g. WASMCSI_LIMITS__POOL_SIZE=16")
	flag.Parse()
	cfg.volSize, cfg.fileSize = int64(*size)<<20, int64(*file)<<20

	if os.Geteuid() != 0 {
		fmt.Println("datapath: skipped: publishing volumes needs root (mounts, loop devices)")
		return
	}
	if cfg.fio {
		fio, err := exec.LookPath("fio")
		if err != nil {
			fmt.Println("datapath: skipped: fio is not installed (Debian: apt-get install fio)")
			return
		}
		cfg.fioPath = fio
	}
	if cfg.fio && cfg.fileSize > cfg.volSize*3/4 {
		fmt.Fprintln(os.Stderr, "datapath: -file-mib must leave a quarter of the volume to the filesystem")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "datapath:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) (err error) {
	repo, err := filepath.Abs(cfg.repo)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "wasmcsi-datapath.")
	if err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(work, &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		os.Remove(work)
		return fmt.Errorf("%s is on tmpfs; the data path is measured on disk: set TMPDIR to a folder on disk", work)
	}
	var d *daemon
	defer func() {
		if terr := teardown(work, d); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	fmt.Printf("datapath: working in %s (%s); load average %s\n", work, fsName(work), loadavg())
	d, err = startDaemon(ctx, repo, work, cfg.daemonEnv)
	if err != nil {
		return err
	}

	if cfg.fio {
		if err := runJobs(ctx, d, cfg); err != nil {
			return err
		}
	}
	if cfg.clones {
		if err := runClones(ctx, d, cfg); err != nil {
			return err
		}
	}
	if cfg.burst > 0 {
		if err := runBurst(ctx, d, cfg); err != nil {
			return err
		}
	}
	return nil
}

// runJobs measures every fio job on every volume kind against its floor.
func runJobs(ctx context.Context, d *daemon, cfg config) (err error) {
	vols, err := setup(ctx, d, cfg)
	if err != nil {
		return err
	}
	for _, v := range vols {
		fmt.Printf("datapath: %s: %s against %s\n", v.name, v.file, v.floor)
		if v.note != "" {
			fmt.Printf("datapath: %s: %s\n", v.name, v.note)
		}
	}
	sel := selectJobs(cfg.jobs)
	if len(sel) == 0 {
		return fmt.Errorf("no job matches -jobs %q", cfg.jobs)
	}
	// results[volume][job] holds each round's pair.
	type pair struct{ vol, floor result }
	results := make([][][]pair, len(vols))
	for i := range results {
		results[i] = make([][]pair, len(sel))
	}
	for r := 0; r < cfg.rounds; r++ {
		fmt.Printf("datapath: round %d of %d; load average %s\n", r+1, cfg.rounds, loadavg())
		for ji, j := range sel {
			for vi, v := range vols {
				// Alternate which side goes first, so that neither always
				// runs right after the other's writes.
				var p pair
				first, second := &p.vol, &p.floor
				fileA, fileB := v.file, v.floor
				if r%2 == 1 {
					first, second = second, first
					fileA, fileB = fileB, fileA
				}
				if *first, err = runFio(ctx, cfg.fioPath, j, fileA, v.size, cfg.runtime); err != nil {
					return err
				}
				if *second, err = runFio(ctx, cfg.fioPath, j, fileB, v.size, cfg.runtime); err != nil {
					return err
				}
				results[vi][ji] = append(results[vi][ji], p)
				fmt.Printf("  %-16s %-22s volume %s | floor %s\n", v.name, j.name, p.vol, p.floor)
			}
		}
	}
	fmt.Printf("\ndatapath: %d rounds of %s per job and side; load average %s\n\n", cfg.rounds, cfg.runtime, loadavg())
	fmt.Println("| volume | fio job | floor | volume | IOPS or bandwidth ratio | p99 ratio |")
	fmt.Println("| --- | --- | --- | --- | --- | --- |")
	for vi, v := range vols {
		for ji, j := range sel {
			ps := results[vi][ji]
			var vs, fs []result
			var thr, p99 []float64
			for _, p := range ps {
				vs, fs = append(vs, p.vol), append(fs, p.floor)
				thr = append(thr, ratio(p.vol.throughput(j), p.floor.throughput(j)))
				p99 = append(p99, ratio(p.vol.p99, p.floor.p99))
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", v.name, j.name, summary(fs, j), summary(vs, j), ratioRange(thr), ratioRange(p99))
		}
	}
	return nil
}

// runBurst measures the node burst against its floor.
func runBurst(ctx context.Context, d *daemon, cfg config) error {
	fmt.Printf("\ndatapath: node burst: %d loopfile ext4 volumes, %d clients; load average %s\n", cfg.burst, cfg.clients, loadavg())
	ids, floors, err := burstVolumes(ctx, d, cfg.burst)
	if err != nil {
		return fmt.Errorf("node burst: %w", err)
	}
	// One untimed round of each first: the first burst makes the kernel
	// create loop devices and the first mount of each file reads it cold.
	if _, err := burstDaemon(ctx, d, ids, cfg.clients); err != nil {
		return fmt.Errorf("node burst: warm-up: %w", err)
	}
	if _, err := burstFloor(filepath.Join(d.dir, "burst", "floor"), floors, cfg.clients); err != nil {
		return fmt.Errorf("node burst floor: warm-up: %w", err)
	}
	var ws, fs, rs []float64
	for r := 0; r < cfg.burstRounds; r++ {
		var w, f time.Duration
		var werr, ferr error
		daemonSide := func() { w, werr = burstDaemon(ctx, d, ids, cfg.clients) }
		floorSide := func() { f, ferr = burstFloor(filepath.Join(d.dir, "burst", "floor"), floors, cfg.clients) }
		if r%2 == 0 {
			daemonSide()
			floorSide()
		} else {
			floorSide()
			daemonSide()
		}
		if werr != nil {
			return fmt.Errorf("node burst: round %d: %w", r+1, werr)
		}
		if ferr != nil {
			return fmt.Errorf("node burst floor: round %d: %w", r+1, ferr)
		}
		ws, fs, rs = append(ws, w.Seconds()*1e3), append(fs, f.Seconds()*1e3), append(rs, ratio(w.Seconds(), f.Seconds()))
		fmt.Printf("  round %d: wasmcsi %.0f ms, floor %.0f ms, %.2f×; load average %s\n", r+1, ws[r], fs[r], rs[r], loadavg())
	}
	wlo, whi := minmax(ws)
	flo, fhi := minmax(fs)
	fmt.Printf("\n| node burst | floor (syscalls) | wasmcsi (NodeStage+NodePublish) | ratio |\n| --- | --- | --- | --- |\n")
	fmt.Printf("| %d volumes, %d clients | %.0f ms (%.0f–%.0f) | %.0f ms (%.0f–%.0f) | %s |\n", cfg.burst, cfg.clients, median(fs), flo, fhi, median(ws), wlo, whi, ratioRange(rs))
	return nil
}

func selectJobs(names string) []job {
	if names == "" {
		return jobs
	}
	var sel []job
	for _, j := range jobs {
		for _, n := range strings.Split(names, ",") {
			if strings.TrimSpace(n) == j.name {
				sel = append(sel, j)
			}
		}
	}
	return sel
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func fsName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "?"
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	}
	return fmt.Sprintf("fs type %#x", st.Type)
}
