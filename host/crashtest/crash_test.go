package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
)

// EnvKills sets the number of kill points (default 200, 20 with -short);
// EnvSeed repeats a run; EnvSeeds spreads the kill points over that many
// runs with seeds of their own, each with a fresh daemon (default 4, or 1
// when EnvKills or EnvSeed is set): every seed starts from an empty pool
// and takes another course, so one make test covers more of them.
const (
	EnvKills = "WASMCSI_CRASH_KILLS"
	EnvSeed  = "WASMCSI_CRASH_SEED"
	EnvSeeds = "WASMCSI_CRASH_SEEDS"
)

// callTimeout bounds one CSI call; a call that takes longer has hung.
const callTimeout = 60 * time.Second

type workload struct {
	t     *testing.T
	d     *daemon
	seed  uint64
	rng   *rand.Rand
	m     model
	an    *anomalies
	est   latency
	stats runStats
	// onlineGrow says the kernel lets this process grow a mounted ext4
	// (CAP_SYS_RESOURCE; sandboxes often drop it).
	onlineGrow bool
}

func hasCapability(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

func TestCrash(t *testing.T) {
	daemontest.Require(t)
	kills := 200
	if testing.Short() {
		kills = 20
	}
	seeds := 4
	if s := os.Getenv(EnvKills); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", EnvKills, s)
		}
		kills, seeds = n, 1
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(EnvSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", EnvSeed, s, err)
		}
		seed, seeds = n, 1
	}
	if s := os.Getenv(EnvSeeds); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", EnvSeeds, s)
		}
		seeds = n
	}
	if seeds == 1 {
		crashRun(t, seed, kills)
		return
	}
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	for i := range seeds {
		s, k := rng.Uint64(), kills/seeds
		if i < kills%seeds {
			k++
		}
		if !t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) { crashRun(t, s, k) }) {
			t.Logf("%s=%d %s=%d repeats the failed run", EnvSeed, s, EnvKills, k)
		}
	}
}

// crashRun runs the crash test with one seed and kill count, on a daemon
// of its own.
func crashRun(t *testing.T, seed uint64, kills int) {
	// The seed fixes every choice of the run; where in a call a kill lands
	// also depends on timing, so a repeat follows the same path as far as
	// the calls cut off are the same.
	t.Logf("seed %d (%s=%d repeats this run's choices), %d kill points", seed, EnvSeed, seed, kills)
	online := hasCapability(unix.CAP_SYS_RESOURCE)
	if !online {
		t.Log("no CAP_SYS_RESOURCE: the kernel refuses to grow a mounted ext4, so expanded mount volumes are not node-expanded while staged")
	}

	begin := time.Now()
	d := newDaemon(t)
	w := &workload{
		t: t, d: d, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		m:   model{gone: map[string]*volume{}, goneS: map[string]*snapshot{}},
		an:  &anomalies{t: t, counted: map[string]bool{}},
		est: latency{}, onlineGrow: online,
		stats: runStats{kills: map[string]*killStats{}, retryCodes: map[string]int{},
			findings: map[string]int{}, phase: map[string]time.Duration{}},
	}
	defer func() {
		t.Log("\n" + w.report(time.Since(begin)))
		if n := len(w.an.list); n > 0 {
			t.Errorf("%d anomalies (seed %d)", n, seed)
		}
	}()
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	for w.killPoints() < kills {
		w.an.round++
		if !w.round() {
			return
		}
	}
	w.final()
}

// round runs a few calls to their answer, then kills the daemon: mostly
// while one call, or a few side by side, are in flight, sometimes between
// calls or while the daemon starts. It restarts the daemon, retries the
// calls that were cut off and checks everything against the model. It
// reports false when the daemon cannot be started again.
func (w *workload) round() bool {
	t0 := time.Now()
	for range w.rng.IntN(3) {
		w.run(w.pick(false))
	}
	w.stats.phase["workload"] += time.Since(t0)
	switch n := w.rng.IntN(20); {
	case n < 2:
		w.an.what = "killed during start-up"
		return w.killDuringStart()
	case n < 3:
		w.an.what = "killed between calls"
		return w.killBetweenCalls()
	}
	victims := w.victims()
	res := make([]chan error, len(victims))
	begin := time.Now()
	for i, o := range victims {
		res[i] = make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			res[i] <- o.call(ctx, w.d)
		}()
	}
	sleepPrecisely(w.est.delay(w.rng, victims[w.rng.IntN(len(victims))].label()))
	w.kill()
	w.an.what = "killed while these ran: " + opList(victims)
	w.stats.inCalls++
	var cut []*op
	for i, o := range victims {
		err := <-res[i]
		label := o.label()
		ks := w.stats.kills[label]
		if ks == nil {
			ks = &killStats{}
			w.stats.kills[label] = ks
		}
		if err == nil {
			ks.answered++
			if len(victims) == 1 {
				w.est.observe(label, time.Since(begin))
			}
			o.done()
			continue
		}
		ks.cutOff++
		cut = append(cut, o)
		// Whatever the call did before the kill is for its retry to
		// finish: a copy it started may be partial.
		if o.copies {
			why := fmt.Sprintf("%s cut off by a kill in round %d", o.kind, w.an.round)
			if o.kind == "snapshot" {
				o.snap.suspect = why
			} else {
				o.vol.suspect = why
			}
		}
	}
	if !w.restart(victims) {
		return false
	}
	t0 = time.Now()
	w.an.what += "; cut off:"
	for _, o := range cut {
		if undo := w.abandon(o); undo != nil {
			w.an.what += fmt.Sprintf(" %v, undone by %s instead of retried;", o, undo.kind)
			w.stats.abandoned++
			w.run(undo)
			continue
		}
		w.an.what += fmt.Sprintf(" %v, retried;", o)
		w.retry(o)
	}
	w.stats.phase["retry"] += time.Since(t0)
	w.verify(victims)
	return true
}

// victims picks the calls the kill will cut off: one, or in one round of
// four two or three side by side on distinct volumes and snapshots, as a
// CO runs the calls of different volumes. A pod's write picked meanwhile
// runs to its end first.
func (w *workload) victims() []*op {
	w.makeRoom()
	want := 1
	if w.rng.IntN(4) == 0 {
		want = 2 + w.rng.IntN(2)
	}
	var out []*op
	busy := map[any]bool{}
	for tries := 0; len(out) < want && (tries < 20 || len(out) == 0); tries++ {
		o := w.pick(true)
		if slices.ContainsFunc(o.touches(), func(x any) bool { return busy[x] }) {
			continue
		}
		if !o.isCSI {
			w.run(o)
			continue
		}
		for _, x := range o.touches() {
			busy[x] = true
		}
		out = append(out, o)
	}
	return out
}

// makeRoom deletes the oldest volumes and snapshots (unpublishing and
// unstaging first) until creating, cloning and restoring are possible, so
// that the kill finds those calls as often as the others.
func (w *workload) makeRoom() {
	for vs := w.m.live(nil); len(vs) >= maxVolumes-1; vs = w.m.live(nil) {
		v := vs[0]
		if (!v.published || w.run(w.unpublishOp(v))) && (!v.staged || w.run(w.unstageOp(v))) {
			w.run(w.deleteOp(v))
		}
	}
	for ss := w.m.liveSnaps(); len(ss) >= maxSnapshots; ss = w.m.liveSnaps() {
		w.run(w.deleteSnapOp(ss[0]))
	}
}

// killBetweenCalls runs a call to its answer and kills the daemon a moment
// later, while no call is in flight: what the answer did not wait for (a
// record deletion, a log sync) is cut off.
func (w *workload) killBetweenCalls() bool {
	w.stats.betweenKills++
	o := w.pick(true)
	w.run(o)
	time.Sleep(time.Duration(w.rng.Float64() * float64(20*time.Millisecond)))
	w.kill()
	if !w.restart(nil) {
		return false
	}
	w.verify([]*op{o})
	return true
}

// killDuringStart kills the daemon while it starts again (opening its
// records, loading modules, reconciling) and starts it once more.
func (w *workload) killDuringStart() bool {
	w.stats.startupKills++
	w.kill()
	if err := w.d.Spawn(); err != nil {
		w.an.add(noStart, "", "%v", err)
		return false
	}
	time.Sleep(time.Duration(w.rng.Float64() * float64(400*time.Millisecond)))
	w.kill()
	if !w.restart(nil) {
		return false
	}
	w.verify(nil)
	return true
}

// restart starts the daemon after a kill and reads its start-up reports.
func (w *workload) restart(victims []*op) bool {
	t0 := time.Now()
	defer func() { w.stats.phase["restart"] += time.Since(t0) }()
	if err := w.d.Start(); err != nil {
		w.an.add(noStart, "", "after the kill during %s: %v", opList(victims), err)
		return false
	}
	w.startupFindings(victims)
	return true
}

// run runs an op to its answer; an error is an anomaly.
func (w *workload) run(o *op) bool {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	begin := time.Now()
	err := o.call(ctx, w.d)
	if err != nil {
		if !w.deleteRefused(o, err) {
			w.an.add(callFailed, "", "%v: %v", o, err)
		}
		w.markBroken(o, fmt.Sprintf("%s failed: %v", o.kind, err))
		return false
	}
	w.est.observe(o.label(), time.Since(begin))
	o.done()
	w.podStarts(o)
	return true
}

// podStarts writes data into a volume the op just published, as the pod
// that uses it does: always into an empty one, so that almost every copy
// has something to lose, and now and then a new generation.
func (w *workload) podStarts(o *op) {
	if o.kind == "publish" && o.vol.broken == "" && (o.vol.token == "" || w.rng.IntN(4) == 0) {
		w.run(w.writeOp(o.vol))
	}
}

// markBroken stops the harness from using what a failed op left in an
// unknown state.
func (w *workload) markBroken(o *op, why string) {
	switch o.kind {
	case "snapshot", "deletesnap":
		o.snap.broken = why
		if o.kind == "snapshot" && !slices.Contains(w.m.snaps, o.snap) {
			// It may exist: cleanup deletes what ListSnapshots still shows.
			w.m.snaps = append(w.m.snaps, o.snap)
		}
	case "create", "clone", "restore":
		o.vol.broken = why
		if !slices.Contains(w.m.vols, o.vol) {
			w.m.vols = append(w.m.vols, o.vol)
		}
	default:
		if o.vol != nil {
			o.vol.broken = why
		}
	}
}

// retry repeats a call that the kill cut off, with the same request, as a
// CO does, until the daemon answers anything but UNAVAILABLE or ABORTED.
// Every retry here must answer OK: each call is valid for the model, and
// the spec makes every one of them idempotent.
func (w *workload) retry(o *op) {
	w.stats.retries++
	deadline := time.Now().Add(callTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := o.call(ctx, w.d)
		cancel()
		if err == nil {
			w.stats.retriesOK++
			o.done()
			w.podStarts(o)
			return
		}
		c := status.Code(err)
		if (c == codes.Unavailable || c == codes.Aborted) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		w.stats.retryCodes[c.String()]++
		if !w.deleteRefused(o, err) {
			w.an.add(retryFailed, "", "%v, cut off by the kill, retried: %v", o, err)
		}
		w.markBroken(o, fmt.Sprintf("retry of %s failed: %v", o.kind, err))
		return
	}
}

// abandon returns, for one cut-off NodeStage or NodePublish in four, the
// call that undoes it, which the CO makes instead of the retry: kubelet
// takes down a mount whose state a failure left uncertain when the pod
// goes away meanwhile.
func (w *workload) abandon(o *op) *op {
	if w.rng.IntN(4) != 0 {
		return nil
	}
	switch o.kind {
	case "stage":
		return w.unstageOp(o.vol)
	case "publish":
		return w.unpublishOp(o.vol)
	}
	return nil
}

// deleteRefused counts a DeleteVolume refused with FAILED_PRECONDITION
// for a volume the CO has neither staged nor published: the daemon or its
// backend holds on to something (a node record, a loop device) the CO
// knows nothing of, and the volume cannot be deleted.
func (w *workload) deleteRefused(o *op, err error) bool {
	if o.kind != "delete" || status.Code(err) != codes.FailedPrecondition || o.vol.staged || o.vol.published {
		return false
	}
	w.an.add(refusedDelete, fmt.Sprintf("%s/%d", o.vol.name, o.vol.unstages),
		"DeleteVolume of %s, which is neither staged nor published (%d NodeUnstage acknowledged), is refused: %v", o.vol, o.vol.unstages, err)
	return true
}

// kill kills the daemon, with its child processes or (one kill in three)
// alone.
func (w *workload) kill() {
	alone := w.rng.IntN(3) == 0
	if alone {
		w.stats.aloneKills++
	}
	w.d.Kill(!alone)
}
