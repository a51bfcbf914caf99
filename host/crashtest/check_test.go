package crashtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// The checks. After every restart: the List calls against the model, the
// kernel's mounts and loop devices against what is staged and published,
// the node records through NodeGetVolumeStats and the start-up reports,
// and the data of every published volume plus a sample of the others. At
// the end: every volume and snapshot, then cleanup through CSI and what is
// left on the machine and in the records, seen from outside the daemon.

func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

func (w *workload) verify(victims []*op) {
	t0 := time.Now()
	defer func() { w.stats.phase["verify"] += time.Since(t0) }()
	w.checkLists(false)
	w.checkNode(false)
	w.checkNodeRecords()
	w.checkPublishedData()
	// A sample of the others: the volumes the kill hit, snapshots whose
	// creation it cut off, and the volume checked longest ago.
	for _, o := range victims {
		if v := o.vol; v != nil && v.broken == "" && !v.published && slices.Contains(w.m.vols, v) {
			w.checkVolume(v)
		}
		if s := o.snap; o.kind == "snapshot" && s.suspect != "" && s.broken == "" && slices.Contains(w.m.snaps, s) {
			w.checkSnapshot(s)
		}
	}
	var oldest *volume
	for _, v := range w.m.live(func(v *volume) bool { return !v.published }) {
		if oldest == nil || v.checked < oldest.checked {
			oldest = v
		}
	}
	if oldest != nil {
		w.checkVolume(oldest)
	}
}

// listVolumes pages through ListVolumes (a small page, so paging is used).
func (w *workload) listVolumes() (map[string]*csi.Volume, error) {
	out := map[string]*csi.Volume{}
	token := ""
	for {
		ctx, cancel := callCtx()
		resp, err := w.d.Controller().ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 5, StartingToken: token})
		cancel()
		if err != nil {
			return nil, err
		}
		for _, e := range resp.GetEntries() {
			out[e.GetVolume().GetVolumeId()] = e.GetVolume()
		}
		if token = resp.GetNextToken(); token == "" {
			return out, nil
		}
	}
}

func (w *workload) listSnapshots() (map[string]*csi.Snapshot, error) {
	out := map[string]*csi.Snapshot{}
	token := ""
	for {
		ctx, cancel := callCtx()
		resp, err := w.d.Controller().ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 5, StartingToken: token})
		cancel()
		if err != nil {
			return nil, err
		}
		for _, e := range resp.GetEntries() {
			out[e.GetSnapshot().GetSnapshotId()] = e.GetSnapshot()
		}
		if token = resp.GetNextToken(); token == "" {
			return out, nil
		}
	}
}

// checkLists compares ListVolumes and ListSnapshots with the model: every
// acknowledged volume and snapshot is there, nothing deleted came back.
func (w *workload) checkLists(final bool) {
	vols, err := w.listVolumes()
	if err != nil {
		w.an.add(callFailed, "", "ListVolumes: %v", err)
		return
	}
	known := map[string]bool{}
	for _, v := range w.m.vols {
		if v.id == "" {
			continue
		}
		known[v.id] = true
		got, ok := vols[v.id]
		switch {
		case !ok && v.broken == "":
			w.an.add(lostVolume, v.id, "%s (%s) is not listed by ListVolumes", v, v.origin)
			v.broken = "lost"
		case ok && v.broken == "" && got.GetCapacityBytes() < v.capacity:
			w.an.add(capacityLost, v.id, "%s is listed with %d bytes, %d were acknowledged", v, got.GetCapacityBytes(), v.capacity)
		}
	}
	for id := range vols {
		if known[id] {
			continue
		}
		if g, ok := w.m.gone[id]; ok {
			w.an.add(staleRecord, id, "volume %s is listed again after its DeleteVolume was acknowledged", g)
		} else if !final {
			w.an.add(staleRecord, id, "ListVolumes lists %s, which no acknowledged CreateVolume returned", id)
		}
	}
	snaps, err := w.listSnapshots()
	if err != nil {
		w.an.add(callFailed, "", "ListSnapshots: %v", err)
		return
	}
	known = map[string]bool{}
	for _, s := range w.m.snaps {
		if s.id == "" {
			continue
		}
		known[s.id] = true
		got, ok := snaps[s.id]
		switch {
		case !ok && s.broken == "":
			w.an.add(lostSnapshot, s.id, "%s is not listed by ListSnapshots", s)
			s.broken = "lost"
		case ok && s.broken == "" && (got.GetSourceVolumeId() != s.sourceID || !got.GetReadyToUse()):
			w.an.add(lostSnapshot, s.id, "%s is listed with source %q, ready %v", s, got.GetSourceVolumeId(), got.GetReadyToUse())
		}
	}
	for id := range snaps {
		if known[id] {
			continue
		}
		if g, ok := w.m.goneS[id]; ok {
			w.an.add(staleRecord, id, "snapshot %s is listed again after its DeleteSnapshot was acknowledged", g)
		} else if !final {
			w.an.add(staleRecord, id, "ListSnapshots lists %s, which no acknowledged CreateSnapshot returned", id)
		}
	}
}

// checkNode compares the kernel's mounts and loop devices under the run's
// folder with what the model has staged and published. A leftover is
// counted once while it lasts. A loop device is released when its last
// opener closes it (udev may be probing it), so what is found is looked at
// again for up to two seconds before it counts.
func (w *workload) checkNode(final bool) {
	var found []nodeFinding
	for try := 0; try < 10; try++ {
		if found = w.nodeFindings(final); len(found) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, f := range found {
		w.an.add(f.class, f.key, "%s", f.detail)
	}
}

type nodeFinding struct{ class, key, detail string }

func (w *workload) nodeFindings(final bool) []nodeFinding {
	var out []nodeFinding
	add := func(class, key, format string, args ...any) {
		if final {
			key = "final " + key
		}
		out = append(out, nodeFinding{class, key, fmt.Sprintf(format, args...)})
	}
	mounts, err := daemontest.MountsUnder(w.d.Dir)
	if err != nil {
		w.t.Fatal(err)
	}
	mounted := map[string]bool{}
	for _, m := range mounts {
		mounted[m] = true
	}
	devs, err := daemontest.LoopsUnder(w.d.Dir)
	if err != nil {
		w.t.Fatal(err)
	}
	loops := map[string][]string{}
	for _, dev := range devs {
		loops[dev.BackingFile] = append(loops[dev.BackingFile], dev.Path)
	}
	explained := map[string]bool{} // mount points and backing files of volumes in use, or of broken ones
	for _, v := range w.m.vols {
		staging, target := w.d.staging(v), w.d.target(v)
		if v.broken != "" {
			explained[staging], explained[target], explained[v.file()] = true, true, true
			continue
		}
		if v.staged && !v.block {
			explained[staging] = true
			if !mounted[staging] {
				add(missingMount, staging, "%s is staged but %s is not mounted", v, staging)
			}
		}
		if v.published {
			explained[target] = true
			if !mounted[target] {
				add(missingMount, target, "%s is published but %s is not mounted", v, target)
			}
		}
		if v.backend == "loopfile" && v.staged {
			switch n := len(loops[v.file()]); {
			case n == 0:
				add(missingMount, v.file(), "%s is staged but no loop device backs its file", v)
			case n == 1:
				explained[v.file()] = true
			}
		}
	}
	where := ""
	if final {
		where = " after cleanup"
	}
	for _, m := range mounts {
		if !explained[m] {
			add(leakedMount, m, "%s is mounted%s; %s", m, where, w.whose(m))
		}
	}
	for file, paths := range loops {
		// A staged volume's file explains one device, not two.
		if !explained[file] {
			add(leakedLoop, file, "%v backed by %s%s; %s", paths, file, where, w.whose(file))
		}
	}
	return out
}

// whose names the volume a path belongs to, for the anomaly's detail.
func (w *workload) whose(path string) string {
	for _, group := range [][]*volume{w.m.vols, valuesOf(w.m.gone)} {
		for _, v := range group {
			if path == w.d.staging(v) || path == w.d.target(v) || (v.file() != "" && path == v.file()) {
				state := fmt.Sprintf("staged %v, published %v", v.staged, v.published)
				if w.m.gone[v.id] == v {
					state = "deleted"
				}
				return fmt.Sprintf("it belongs to %s (%s)", v, state)
			}
		}
	}
	return "it belongs to no volume the CO knows"
}

func valuesOf[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// checkNodeRecords asks the daemon, through NodeGetVolumeStats at each
// staging path, whether it holds a stage record the CO does not know of:
// NOT_FOUND is the answer for a volume that is not staged. For a staged
// block volume it also reports the device's size, which must be the
// acknowledged capacity once no node expansion is pending.
func (w *workload) checkNodeRecords() {
	for _, v := range w.m.live(func(v *volume) bool { return v.staged && v.block && !v.nodeExpand }) {
		ctx, cancel := callCtx()
		resp, err := w.d.Node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: w.d.staging(v)})
		cancel()
		switch {
		case err != nil:
			w.an.add(callFailed, "", "NodeGetVolumeStats of staged %s: %v", v, err)
		case len(resp.GetUsage()) == 0 || resp.GetUsage()[0].GetTotal() < v.capacity:
			w.an.add(capacityLost, v.id+" device", "the device of staged %s has %v bytes, %d were acknowledged", v, resp.GetUsage(), v.capacity)
		}
	}
	for _, v := range w.m.live(func(v *volume) bool { return !v.staged && !v.block }) {
		ctx, cancel := callCtx()
		_, err := w.d.Node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: w.d.staging(v)})
		cancel()
		if err == nil {
			w.an.add(staleNode, fmt.Sprintf("%s/%d", v.name, v.unstages), "%s is not staged (%d NodeUnstage acknowledged), yet NodeGetVolumeStats at its staging path answers OK: the daemon still holds its stage record", v, v.unstages)
		} else if status.Code(err) != codes.NotFound {
			w.an.add(callFailed, "", "NodeGetVolumeStats of unstaged %s: %v", v, err)
		}
	}
}

// startupFindings reads what start-up reconciliation reported. A stage
// reported lost belongs to a volume the CO has unstaged (or deleted) —
// unless the kill cut off that very NodeUnstage — and is a stale record.
func (w *workload) startupFindings(victims []*op) {
	// A logged create or a marked deletion start-up could not finish
	// stays until the next start, and again then: a replay that does not
	// converge (a create's older request against a volume expanded
	// since) never does.
	for _, u := range w.d.unfinished() {
		w.an.add(replayStuck, u, "start-up: %s", u)
	}
	for _, f := range w.d.findings() {
		w.stats.findings[f.Kind]++
		if f.Kind != "stage-lost" {
			continue // orphans show up in checkNode as leaks
		}
		for _, v := range append(w.m.live(nil), valuesOf(w.m.gone)...) {
			hit := slices.ContainsFunc(victims, func(o *op) bool { return o.vol == v })
			if w.d.staging(v) != f.Path || hit || (v.staged && w.m.gone[v.id] != v) {
				continue
			}
			what := "not staged"
			if w.m.gone[v.id] == v {
				what = "deleted"
			}
			w.an.add(staleNode, fmt.Sprintf("%s/%d", v.name, v.unstages), "start-up reports the stage of %s at %s lost, but the volume is %s (%d NodeUnstage acknowledged): a stale stage record", v, f.Path, what, v.unstages)
		}
	}
}

// checkPublishedData reads every published volume.
func (w *workload) checkPublishedData() {
	for _, v := range w.m.live(func(v *volume) bool { return v.published }) {
		w.stats.dataChecks++
		v.checked = w.an.round
		if err := checkData(w.d.target(v), v.block, v.token); err != nil {
			w.dataAnomaly(v, err)
		}
	}
}

func (w *workload) dataAnomaly(v *volume, err error) {
	switch {
	case v.suspect != "":
		w.an.add(partialCopy, v.id, "%s (%s; %s): %v", v, v.origin, v.suspect, err)
	case v.copied:
		w.an.add(restoreMissing, v.id, "%s (%s): %v", v, v.origin, err)
	default:
		w.an.add(dataLost, v.id, "%s: %v", v, err)
	}
	v.broken = "data: " + err.Error()
}

// checkVolume stages and publishes a volume as a pod would use it, reads
// its data, and puts it back as it was.
func (w *workload) checkVolume(v *volume) {
	if v.broken != "" {
		return
	}
	wasStaged, wasPublished := v.staged, v.published
	if !v.staged && !w.runCheck(w.stageOp(v), unusable) {
		return
	}
	if !v.published && !w.runCheck(w.publishOp(v), unusable) {
		return
	}
	w.stats.dataChecks++
	v.checked = w.an.round
	if err := checkData(w.d.target(v), v.block, v.token); err != nil {
		w.dataAnomaly(v, err)
		return
	}
	if v.token == "" && !w.run(w.writeOp(v)) {
		return
	}
	if !wasPublished && !w.runCheck(w.unpublishOp(v), callFailed) {
		return
	}
	if !wasStaged {
		w.runCheck(w.unstageOp(v), callFailed)
	}
}

// runCheck runs an op of a check (no kill); a failure is counted in class.
func (w *workload) runCheck(o *op, class string) bool {
	ctx, cancel := callCtx()
	defer cancel()
	if err := o.call(ctx, w.d); err != nil {
		w.an.add(class, "", "%v: %v", o, err)
		w.markBroken(o, fmt.Sprintf("%s failed: %v", o.kind, err))
		return false
	}
	o.done()
	return true
}

// checkSnapshot restores a snapshot into a new volume, checks the data
// there, and deletes that volume again.
func (w *workload) checkSnapshot(s *snapshot) {
	if s.broken != "" || s.source == nil {
		return
	}
	w.stats.restoreChecks++
	o := w.createOp(s.source.backend, s.source.block, nil, s)
	ctx, cancel := callCtx()
	err := o.call(ctx, w.d)
	cancel()
	if err != nil {
		w.an.add(snapUnusable, s.id, "restore of %s: %v", s, err)
		s.broken = "restore failed"
		w.markBroken(o, "restore check failed") // cleanup asks for it again
		return
	}
	o.done()
	v := o.vol
	w.stats.created-- // a check's volume, not the workload's
	w.checkVolume(v)
	if v.broken != "" {
		s.broken = "restore: " + v.broken
		return
	}
	w.runCheck(w.deleteOp(v), callFailed)
	w.stats.deleted--
}

// final checks every volume and snapshot, deletes everything through CSI,
// restarts the daemon cleanly, and looks for anything left: in the List
// calls, in start-up reports, in the kernel, in the pools, in the records.
func (w *workload) final() {
	w.an.round++
	w.an.what = "final checks and cleanup, no kill"
	w.t.Logf("final checks after round %d", w.an.round-1)
	w.verify(nil)
	for _, v := range w.m.live(nil) {
		w.checkVolume(v)
	}
	for _, s := range w.m.liveSnaps() {
		w.checkSnapshot(s)
	}

	// Cleanup, as the CO would: pods go, volumes are unstaged and deleted.
	for _, v := range append([]*volume(nil), w.m.vols...) {
		w.cleanupVolume(v)
	}
	for _, s := range append([]*snapshot(nil), w.m.snaps...) {
		if s.id == "" {
			continue
		}
		ctx, cancel := callCtx()
		_, err := w.d.Controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.id})
		cancel()
		if err != nil {
			w.an.add(cleanupFailed, "", "DeleteSnapshot %s: %v", s, err)
			continue
		}
		w.m.goneS[s.id] = s
	}
	w.m.snaps = nil
	w.checkLists(true)
	w.deleteListed()

	// A clean restart: start-up must report nothing, and list nothing.
	if err := w.d.Stop(); err != nil {
		w.an.add(noStart, "", "%v", err)
	}
	if err := w.d.Start(); err != nil {
		w.an.add(noStart, "", "after cleanup: %v", err)
		return
	}
	for _, f := range w.d.findings() {
		// Orphan mounts and loop devices are counted from outside below.
		if !strings.HasPrefix(f.Kind, "orphan-") {
			w.an.add(staleNode, "final "+f.Path, "after cleanup, start-up reports %s %s: %s", f.Kind, f.Path, f.Detail)
		}
	}
	w.checkLists(true)
	w.deleteListed()
	if err := w.d.Stop(); err != nil {
		w.an.add(noStart, "", "%v", err)
	}

	// From outside the daemon.
	time.Sleep(100 * time.Millisecond) // loop devices clear on their last close
	w.checkNode(true)
	for backend, pool := range w.d.pools {
		entries, err := os.ReadDir(pool)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, e := range entries {
			w.an.add(leakedFile, "final "+e.Name(), "%s pool holds %s after cleanup", backend, filepath.Join(pool, e.Name()))
		}
	}
	w.checkRecordFile()
}

// cleanupVolume unpublishes, unstages and deletes a volume, broken or not.
func (w *workload) cleanupVolume(v *volume) {
	if v.id == "" && v.create != nil {
		// A create whose retry failed: ask once more, for its ID.
		ctx, cancel := callCtx()
		err := v.create.call(ctx, w.d)
		cancel()
		if err != nil {
			// Counted when it first failed; whatever it left behind is
			// counted below as a record or file nobody asked for.
			w.t.Logf("%v, asked again at cleanup: %v", v.create, err)
			w.m.vols = deleteItem(w.m.vols, v)
			return
		}
		v.create.done()
	}
	steps := []struct {
		what string
		call func(ctx context.Context) error
	}{
		{"NodeUnpublishVolume", func(ctx context.Context) error {
			_, err := w.d.Node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: w.d.target(v)})
			if err == nil {
				v.published = false
			}
			return err
		}},
		{"NodeUnstageVolume", func(ctx context.Context) error {
			wasStaged := v.staged
			_, err := w.d.Node().NodeUnstageVolume(ctx, w.unstageReq(v))
			if err == nil && wasStaged {
				v.staged = false
				v.unstages++
			}
			return err
		}},
		{"DeleteVolume", func(ctx context.Context) error {
			_, err := w.d.Controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
			return err
		}},
	}
	for _, s := range steps {
		ctx, cancel := callCtx()
		err := s.call(ctx)
		cancel()
		if err != nil {
			if s.what != "DeleteVolume" || !w.deleteRefused(&op{kind: "delete", vol: v}, err) {
				w.an.add(cleanupFailed, "", "%s %s: %v", s.what, v, err)
			}
			return
		}
	}
	w.m.vols = deleteItem(w.m.vols, v)
	w.m.gone[v.id] = v
}

func deleteItem[T comparable](s []T, x T) []T {
	out := s[:0]
	for _, y := range s {
		if y != x {
			out = append(out, y)
		}
	}
	return out
}

// deleteListed deletes whatever the daemon still lists (counted by
// checkLists), so that the checks after it see what deletion leaves.
func (w *workload) deleteListed() {
	if vols, err := w.listVolumes(); err == nil {
		for id := range vols {
			if _, ok := w.m.gone[id]; !ok {
				w.an.add(staleRecord, id, "ListVolumes lists %s after cleanup; no acknowledged CreateVolume returned it", id)
			}
			ctx, cancel := callCtx()
			_, err := w.d.Controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			cancel()
			if err != nil {
				w.an.add(cleanupFailed, "", "DeleteVolume %s (listed after cleanup): %v", id, err)
			}
		}
	}
	if snaps, err := w.listSnapshots(); err == nil {
		for id := range snaps {
			if _, ok := w.m.goneS[id]; !ok {
				w.an.add(staleRecord, id, "ListSnapshots lists %s after cleanup; no acknowledged CreateSnapshot returned it", id)
			}
			ctx, cancel := callCtx()
			_, err := w.d.Controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
			cancel()
			if err != nil {
				w.an.add(cleanupFailed, "", "DeleteSnapshot %s (listed after cleanup): %v", id, err)
			}
		}
	}
}

// checkRecordFile opens the stopped daemon's record file and counts what
// it still holds: after cleanup, nothing.
func (w *workload) checkRecordFile() {
	st, err := state.Open(filepath.Join(w.d.State, "wasmcsi.db"))
	if err != nil {
		w.an.add(staleRecord, "", "open the records after cleanup: %v", err)
		return
	}
	defer st.Close()
	left := func(class, key, format string, args ...any) {
		w.an.add(class, key, "the record file holds "+format+" after cleanup", args...)
	}
	failed := func(kind string, err error) bool {
		if err != nil {
			w.an.add(staleRecord, "", "list %s records: %v", kind, err)
		}
		return err != nil
	}
	if vols, _, err := st.ListVolumes("", 0); !failed("volume", err) {
		for _, v := range vols {
			left(staleRecord, v.ID, "volume %s (%s)", v.ID, v.Name)
		}
	}
	if snaps, _, err := st.ListSnapshots(state.SnapshotFilter{}, "", 0); !failed("snapshot", err) {
		for _, s := range snaps {
			left(staleRecord, s.ID, "snapshot %s (%s)", s.ID, s.Name)
		}
	}
	if stages, _, err := st.ListStages("", 0); !failed("stage", err) {
		for _, s := range stages {
			left(staleNode, "final "+s.StagingPath, "the stage of %s at %s", s.VolumeID, s.StagingPath)
		}
	}
	if pubs, _, err := st.ListPublishes("", 0); !failed("publication", err) {
		for _, p := range pubs {
			left(staleNode, "final "+p.TargetPath, "the publication of %s at %s", p.VolumeID, p.TargetPath)
		}
	}
}
