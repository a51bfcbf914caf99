package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"time"
)

// job is one fio workload. Every job runs with libaio and O_DIRECT, one
// process, for the configured time.
type job struct {
	name  string
	rw    string // fio's rw: randread, randwrite, read, write, randrw
	bs    string
	depth int
	mix   int // rwmixread for randrw
}

var jobs = []job{
	{name: "4k randread QD1", rw: "randread", bs: "4k", depth: 1},
	{name: "4k randread QD32", rw: "randread", bs: "4k", depth: 32},
	{name: "4k randwrite QD1", rw: "randwrite", bs: "4k", depth: 1},
	{name: "4k randwrite QD32", rw: "randwrite", bs: "4k", depth: 32},
	{name: "1M read QD8", rw: "read", bs: "1M", depth: 8},
	{name: "1M write QD8", rw: "write", bs: "1M", depth: 8},
	{name: "4k 70/30 randrw QD32", rw: "randrw", bs: "4k", depth: 32, mix: 70},
}

// result is what one fio run measured: both directions added up for
// IOPS and bandwidth; the latencies are of the reads for a job that reads
// (the mixed job too) and of the writes otherwise.
type result struct {
	iops     float64
	bw       float64 // bytes per second
	p50, p99 float64 // completion latency, microseconds
}

// fioArgs is the command line of j against file (a block device or a
// regular file of size bytes, created by fio when missing).
func fioArgs(j job, file string, size int64, runtime time.Duration) []string {
	args := []string{
		"--name=datapath", "--filename=" + file, "--size=" + strconv.FormatInt(size, 10),
		"--ioengine=libaio", "--direct=1", "--rw=" + j.rw, "--bs=" + j.bs,
		"--iodepth=" + strconv.Itoa(j.depth), "--numjobs=1",
		"--time_based", "--runtime=" + strconv.FormatFloat(runtime.Seconds(), 'f', -1, 64) + "s",
		"--ramp_time=1s", "--randrepeat=0", "--norandommap",
		"--output-format=json",
	}
	if j.mix > 0 {
		args = append(args, "--rwmixread="+strconv.Itoa(j.mix))
	}
	return args
}

// runFio runs j against file and parses its report.
func runFio(ctx context.Context, fio string, j job, file string, size int64, runtime time.Duration) (result, error) {
	out, err := exec.CommandContext(ctx, fio, fioArgs(j, file, size, runtime)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return result{}, fmt.Errorf("fio %s on %s: %w: %s", j.name, file, err, ee.Stderr)
		}
		return result{}, fmt.Errorf("fio %s on %s: %w", j.name, file, err)
	}
	r, err := parseFio(out, j)
	if err != nil {
		return result{}, fmt.Errorf("fio %s on %s: %w", j.name, file, err)
	}
	return r, nil
}

type fioSide struct {
	IOPS    float64 `json:"iops"`
	BW      float64 `json:"bw_bytes"`
	TotalIO int64   `json:"total_ios"`
	Clat    struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

// parseFio reads fio's JSON report of one job.
func parseFio(out []byte, j job) (result, error) {
	var rep struct {
		Jobs []struct {
			Error int     `json:"error"`
			Read  fioSide `json:"read"`
			Write fioSide `json:"write"`
		} `json:"jobs"`
	}
	// fio may print notes before the JSON document.
	start := 0
	for start < len(out) && out[start] != '{' {
		start++
	}
	if err := json.Unmarshal(out[start:], &rep); err != nil {
		return result{}, fmt.Errorf("parsing the report: %w", err)
	}
	if len(rep.Jobs) != 1 {
		return result{}, fmt.Errorf("report has %d jobs, want 1", len(rep.Jobs))
	}
	jr := rep.Jobs[0]
	if jr.Error != 0 {
		return result{}, fmt.Errorf("job error %d", jr.Error)
	}
	lat := jr.Read
	if j.rw == "randwrite" || j.rw == "write" {
		lat = jr.Write
	}
	if jr.Read.TotalIO+jr.Write.TotalIO == 0 {
		return result{}, errors.New("no I/O completed")
	}
	p50, ok50 := lat.Clat.Percentile["50.000000"]
	p99, ok99 := lat.Clat.Percentile["99.000000"]
	if !ok50 || !ok99 {
		return result{}, errors.New("report has no 50th/99th latency percentile")
	}
	return result{
		iops: jr.Read.IOPS + jr.Write.IOPS,
		bw:   jr.Read.BW + jr.Write.BW,
		p50:  p50 / 1e3,
		p99:  p99 / 1e3,
	}, nil
}
