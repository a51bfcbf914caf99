package crashtest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// Anomaly classes: each is something a user of the volumes would notice,
// named by what went wrong, not by where in the daemon.
const (
	lostVolume     = "lost acknowledged volume"
	lostSnapshot   = "lost acknowledged snapshot"
	dataLost       = "data lost in volume"
	restoreMissing = "data missing in restore or clone"
	partialCopy    = "partial copy adopted"
	retryFailed    = "retry failed"
	callFailed     = "call failed"
	unusable       = "volume unusable"
	snapUnusable   = "snapshot unusable"
	capacityLost   = "capacity lost"
	missingMount   = "mount missing"
	leakedMount    = "leaked mount"
	leakedLoop     = "leaked loop device"
	leakedFile     = "leaked pool file"
	staleRecord    = "stale record"
	staleNode      = "stale node record"
	noStart        = "daemon does not start"
	cleanupFailed  = "cleanup failed"
	refusedDelete  = "delete refused"
	replayStuck    = "replay not finished"
)

var classes = []string{
	lostVolume, lostSnapshot, dataLost, restoreMissing, partialCopy, retryFailed, callFailed,
	unusable, snapUnusable, capacityLost, missingMount, leakedMount, leakedLoop, leakedFile,
	staleRecord, staleNode, refusedDelete, replayStuck, noStart, cleanupFailed,
}

type anomaly struct {
	class  string
	round  int
	detail string
}

// anomalies collects what the checks find. A condition that persists (a
// leaked mount, a stale record) is counted once, when first seen, by its
// key.
type anomalies struct {
	t       *testing.T
	round   int
	list    []anomaly
	counted map[string]bool
	// what says what the round's kill hit, logged before its first anomaly.
	what       string
	whatLogged int
}

func (a *anomalies) add(class, key, format string, args ...any) {
	if key != "" {
		if a.counted[class+"\x00"+key] {
			return
		}
		a.counted[class+"\x00"+key] = true
	}
	if a.what != "" && a.whatLogged != a.round {
		a.whatLogged = a.round
		a.t.Logf("round %d: %s", a.round, a.what)
	}
	an := anomaly{class: class, round: a.round, detail: fmt.Sprintf(format, args...)}
	a.list = append(a.list, an)
	a.t.Logf("ANOMALY [%s] round %d: %s", class, an.round, an.detail)
}

func (a *anomalies) count(class string) int {
	n := 0
	for _, an := range a.list {
		if an.class == class {
			n++
		}
	}
	return n
}

// killStats counts the kill points of one kind of op.
type killStats struct {
	cutOff   int // the call had not answered when the daemon died
	answered int // it had: the kill came while the daemon finished what the answer did not wait for
}

type runStats struct {
	created, snapshots, deleted, writes int
	dataChecks, restoreChecks           int
	inCalls, startupKills, betweenKills int // kills: while calls ran, between calls, during start-up
	aloneKills                          int // kills that left the daemon's child processes running
	retries, retriesOK, abandoned       int
	retryCodes                          map[string]int
	kills                               map[string]*killStats
	findings                            map[string]int
	phase                               map[string]time.Duration
}

// report prints the summary: the run's parameters, where the kills landed,
// and the count of each anomaly class.
func (w *workload) report(elapsed time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "crash test summary: seed %d, %d kill points in %d rounds, %d daemon starts, %v\n",
		w.seed, w.killPoints(), w.an.round, w.d.Starts(), elapsed.Round(time.Second))
	fmt.Fprintf(&b, "  workload: %d volumes created, %d snapshots, %d deleted, %d writes, %d data checks, %d snapshot restores checked\n",
		w.stats.created, w.stats.snapshots, w.stats.deleted, w.stats.writes, w.stats.dataChecks, w.stats.restoreChecks)
	fmt.Fprintf(&b, "  kills: %d while calls ran, %d between calls, %d during start-up; %d of the daemon alone, the others with its child processes\n",
		w.stats.inCalls, w.stats.betweenKills, w.stats.startupKills, w.stats.aloneKills)
	fmt.Fprintf(&b, "  %-34s %8s %8s\n", "calls running at a kill", "cut off", "answered")
	for _, k := range slices.Sorted(maps.Keys(w.stats.kills)) {
		s := w.stats.kills[k]
		fmt.Fprintf(&b, "  %-34s %8d %8d\n", k, s.cutOff, s.answered)
	}
	codes := ""
	for _, c := range slices.Sorted(maps.Keys(w.stats.retryCodes)) {
		codes += fmt.Sprintf(" %s×%d", c, w.stats.retryCodes[c])
	}
	fmt.Fprintf(&b, "  retried calls: %d, answered OK: %d%s; abandoned (undone instead): %d\n", w.stats.retries, w.stats.retriesOK, codes, w.stats.abandoned)
	if len(w.stats.findings) > 0 {
		var fs []string
		for _, k := range slices.Sorted(maps.Keys(w.stats.findings)) {
			fs = append(fs, fmt.Sprintf("%s×%d", k, w.stats.findings[k]))
		}
		fmt.Fprintf(&b, "  start-up reconcile reports: %s\n", strings.Join(fs, " "))
	}
	var ph []string
	for _, k := range slices.Sorted(maps.Keys(w.stats.phase)) {
		ph = append(ph, fmt.Sprintf("%s %v", k, w.stats.phase[k].Round(time.Millisecond)))
	}
	fmt.Fprintf(&b, "  time in: %s\n", strings.Join(ph, ", "))
	fmt.Fprintf(&b, "  %-34s %8s\n", "anomaly", "count")
	total := 0
	for _, c := range classes {
		n := w.an.count(c)
		total += n
		fmt.Fprintf(&b, "  %-34s %8d\n", c, n)
	}
	fmt.Fprintf(&b, "  %-34s %8d\n", "total", total)
	return b.String()
}

// killPoints counts the kills (one kill may cut off several calls).
func (w *workload) killPoints() int {
	return w.stats.inCalls + w.stats.startupKills + w.stats.betweenKills
}
