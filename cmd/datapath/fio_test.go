package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// A report as fio 3.33 prints it (trimmed to the fields read), after a
// note fio prints before the document.
const mixedReport = `note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "datapath",
      "error" : 0,
      "read" : {
        "bw_bytes" : 70000000, "iops" : 17089.8, "total_ios" : 85449,
        "clat_ns" : { "percentile" : { "50.000000" : 1400000, "99.000000" : 4200000 } }
      },
      "write" : {
        "bw_bytes" : 30000000, "iops" : 7324.2, "total_ios" : 36621,
        "clat_ns" : { "percentile" : { "50.000000" : 900000, "99.000000" : 3000000 } }
      }
    }
  ]
}`

func TestParseFio(t *testing.T) {
	mixed := jobs[len(jobs)-1]
	r, err := parseFio([]byte(mixedReport), mixed)
	if err != nil {
		t.Fatal(err)
	}
	if r.iops != 17089.8+7324.2 || r.bw != 100000000 || r.p50 != 1400 || r.p99 != 4200 {
		t.Errorf("mixed job: got %+v, want both directions' IOPS and bandwidth added, the reads' latency in µs", r)
	}
	write := job{rw: "randwrite", bs: "4k", depth: 1}
	if r, err = parseFio([]byte(mixedReport), write); err != nil || r.p99 != 3000 {
		t.Errorf("write job: got %+v, %v, want the writes' latency", r, err)
	}
	for _, bad := range []string{
		`{"jobs": []}`,
		`{"jobs": [{"error": 5, "read": {"total_ios": 1}}]}`,
		`{"jobs": [{"read": {"total_ios": 0}, "write": {"total_ios": 0}}]}`,
		`{"jobs": [{"read": {"total_ios": 3, "clat_ns": {"percentile": {}}}}]}`,
		`not json`,
	} {
		if _, err := parseFio([]byte(bad), mixed); err == nil {
			t.Errorf("parseFio(%s) succeeded, want an error", bad)
		}
	}
}

func TestFioArgs(t *testing.T) {
	args := fioArgs(jobs[len(jobs)-1], "/dev/loop9", 1<<30, 5*time.Second)
	for _, want := range []string{"--direct=1", "--ioengine=libaio", "--rw=randrw", "--rwmixread=70", "--iodepth=32", "--runtime=5s", "--size=1073741824", "--filename=/dev/loop9"} {
		if !slices.Contains(args, want) {
			t.Errorf("fio arguments %s lack %s", strings.Join(args, " "), want)
		}
	}
}

func TestSelectJobs(t *testing.T) {
	if got := selectJobs(""); len(got) != len(jobs) {
		t.Errorf("no selection gave %d jobs, want all %d", len(got), len(jobs))
	}
	if got := selectJobs("1M read QD8, 4k randread QD1"); len(got) != 2 {
		t.Errorf("two names selected %d jobs", len(got))
	}
}
