package main

import (
	"fmt"
	"sort"
)

// throughput is what a job is judged by: bandwidth for 1 MiB jobs, IOPS
// for the others.
func (r result) throughput(j job) float64 {
	if j.bs == "1M" {
		return r.bw
	}
	return r.iops
}

func (r result) String() string {
	return fmt.Sprintf("%7.0f IOPS %7.1f MiB/s p50 %6.0f µs p99 %6.0f µs", r.iops, r.bw/(1<<20), r.p50, r.p99)
}

func median(vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
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

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// ratioRange is the median of per-round ratios and their range.
func ratioRange(rs []float64) string {
	lo, hi := minmax(rs)
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", median(rs), lo, hi)
}

// summary is a side's median throughput (IOPS, or GiB/s for 1 MiB jobs)
// with its range, and its median p50 and p99.
func summary(rs []result, j job) string {
	var thr, p50, p99 []float64
	for _, r := range rs {
		thr = append(thr, r.throughput(j))
		p50 = append(p50, r.p50)
		p99 = append(p99, r.p99)
	}
	lo, hi := minmax(thr)
	var t string
	if j.bs == "1M" {
		t = fmt.Sprintf("%.2f GiB/s (%.2f–%.2f)", median(thr)/(1<<30), lo/(1<<30), hi/(1<<30))
	} else {
		t = fmt.Sprintf("%.1fk IOPS (%.1f–%.1f)", median(thr)/1e3, lo/1e3, hi/1e3)
	}
	return fmt.Sprintf("%s, p50 %s, p99 %s", t, us(median(p50)), us(median(p99)))
}

func us(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1f ms", v/1e3)
	}
	return fmt.Sprintf("%.0f µs", v)
}
