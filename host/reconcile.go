package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls/node"
)

// Start-up reconciliation. After a daemon restart the records and the
// kernel agree, but for records whose deletion a crash lost: a stage
// record marked as being unstaged (host/RATIONALE.md, "Records", says
// why) whose mount and device are gone describes an unstage
// the CO saw succeed, and a publication record whose target is not mounted
// describes nothing; both are dropped, whatever clean says, and reported
// once. After a reboot every mount and loop device is gone and the
// unmarked stage records still list them: NodeStageVolume and
// NodePublishVolume re-create them when the CO calls again (kubelet does
// after a reboot), so they are kept, reported once each, and nothing is
// done eagerly here. What the daemon owns that no record explains — a loop
// device backed by a file in a granted pool, a mount of such a device or of
// a pool directory — is reported, and released when clean is set. A mount
// that no publication record explains but that binds a recorded stage is
// a publication whose record a crash lost (NodePublish does not wait for
// it): its record is written again from the mount, never released.

// Finding is one thing reconciliation found.
type Finding struct {
	// "stage-lost" (kept for the CO's next NodeStage), "stale-stage" and
	// "stale-publication" (records of nothing, dropped),
	// "adopted-publication" (a publication recorded again from the mount
	// table), "orphan-loop", "orphan-mount" (released with clean);
	// "orphan-volume", "orphan-snapshot" (a module's storage no record
	// names, owned.go: deleted through the module with clean)
	Kind   string
	Path   string
	Detail string
}

func (f Finding) String() string { return f.Kind + " " + f.Path + ": " + f.Detail }

// Reconcile compares the node records with the kernel's loop devices and
// mounts, logs every finding and, with clean, releases orphans.
func (s *Server) Reconcile(ctx context.Context, clean bool) []Finding {
	findings, err := s.reconcile(ctx, clean)
	if err != nil {
		s.log.Warn("reconcile", "err", err)
	}
	for _, f := range findings {
		cleaned := strings.HasPrefix(f.Kind, "stale-") || clean && strings.HasPrefix(f.Kind, "orphan-")
		s.log.Warn("reconcile", "kind", f.Kind, "path", f.Path, "detail", f.Detail, "cleaned", cleaned)
	}
	return findings
}

func (s *Server) reconcile(ctx context.Context, clean bool) ([]Finding, error) {
	if s.cfg.Role == "controller" {
		return nil, nil
	}
	known := map[string]bool{} // devices, staging paths and targets the records explain
	var out []Finding
	listed, _, err := s.store.ListPublishes("", 0)
	if err != nil {
		return nil, err
	}
	var pubs []state.Publish // the records kept
	for _, p := range listed {
		drop, err := s.dropPublication(p)
		if err != nil {
			return out, err
		}
		if drop {
			out = append(out, Finding{Kind: "stale-publication", Path: p.TargetPath, Detail: fmt.Sprintf("record of volume %s at a target that is not mounted, dropped", p.VolumeID)})
			continue
		}
		known[p.TargetPath] = true
		pubs = append(pubs, p)
	}
	listedStages, _, err := s.store.ListStages("", 0)
	if err != nil {
		return out, err
	}
	var stages []state.Stage // the records kept
	for i := range listedStages {
		rec := &listedStages[i]
		f, drop, err := s.reconcileStage(ctx, rec)
		if err != nil {
			return out, err
		}
		if f != nil {
			out = append(out, *f)
		}
		if drop {
			continue
		}
		stages = append(stages, *rec)
		known[rec.StagingPath] = true
		// A recorded loop device explains the device of that number only
		// while it still backs the file it was staged with: after a reboot
		// it may back another. A record that kept no file identity (not a
		// loop device, or written by an older daemon) explains it by
		// number, and so does one whose backend is not loaded.
		if rec.Device != "" {
			b, loaded := s.backends.Load().get(rec.Backend)
			if rec.DeviceFile == "" || !loaded || s.stagedDevice(ctx, b, rec) {
				known[rec.Device] = true
			}
		}
	}
	var roots []string
	for _, m := range s.cfg.Modules {
		roots = append(roots, m.Roots...)
	}
	seen, err := s.node.Observe(ctx, roots)
	for _, p := range s.unrecordedPublications(stages, seen, roots, known) {
		// A publication whose record cannot be written now is still never
		// released.
		known[p.TargetPath] = true
		if s.adopt(p) {
			pubs = append(pubs, p)
			out = append(out, Finding{Kind: "adopted-publication", Path: p.TargetPath, Detail: fmt.Sprintf("publication of volume %s with no record, recorded again", p.VolumeID)})
		}
	}
	out = append(out, readOnlyOrphans(stages, pubs, seen.Loops)...)
	for _, d := range seen.Loops {
		// A device another block device holds (a dm-thin pool over pool
		// files) belongs to that device's owner, not to a stage.
		if !d.InRoots || known[d.Path] || d.Held {
			continue
		}
		out = append(out, Finding{Kind: "orphan-loop", Path: d.Path, Detail: "backed by " + d.BackingFile + " with no stage record"})
	}
	var orphanMounts []string
	for _, m := range seen.Mounts {
		if !m.Ours || known[m.Mountpoint] || node.Within(roots, m.Mountpoint) {
			continue
		}
		out = append(out, Finding{Kind: "orphan-mount", Path: m.Mountpoint, Detail: "mount of " + m.Source + m.Root + " with no record"})
		orphanMounts = append(orphanMounts, m.Mountpoint)
	}
	if err != nil {
		return out, err
	}
	if !clean {
		return out, nil
	}
	// Deepest mounts first, then the devices they held.
	slices.SortFunc(orphanMounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range orphanMounts {
		if err := s.node.Unmount(ctx, m); err != nil {
			s.log.Warn("reconcile: unmount", "path", m, "err", err)
		}
	}
	// Each device as observed: one freed since may back another's file.
	observed := map[string]node.Loop{}
	for _, d := range seen.Loops {
		observed[d.Path] = d
	}
	for _, f := range out {
		if d, ok := observed[f.Path]; ok && f.Kind == "orphan-loop" {
			if err := s.node.Detach(ctx, d.Device); err != nil {
				s.log.Warn("reconcile: detach", "device", f.Path, "err", err)
			}
		}
	}
	return out, nil
}

// dropPublication deletes a publication record whose target is not
// mounted: a NodeUnpublish whose deletion a crash lost, or a reboot, which
// the CO follows with NodePublish again. A volume busy with a call is left
// for that call.
func (s *Server) dropPublication(p state.Publish) (bool, error) {
	unlock, err := s.lock(volKey(p.VolumeID))
	if err != nil {
		return false, nil
	}
	defer unlock()
	if mounted, err := s.node.IsMounted(p.TargetPath); err != nil || mounted {
		return false, nil
	}
	if err := s.store.DeletePublish(p.VolumeID, p.TargetPath); err != nil && !errors.Is(err, state.ErrNotFound) {
		return false, err
	}
	return true, nil
}

// reconcileStage checks one stage record against the kernel. A record
// marked as being unstaged of which nothing remains is deleted (drop);
// one whose stage is gone otherwise is kept for the CO's next call and
// reported the first time only. A volume busy with a call is left for
// that call.
func (s *Server) reconcileStage(ctx context.Context, rec *state.Stage) (f *Finding, drop bool, err error) {
	unlock, err := s.lock(volKey(rec.VolumeID))
	if err != nil {
		return nil, false, nil
	}
	defer unlock()
	if *rec, err = s.store.GetStage(rec.VolumeID); errors.Is(err, state.ErrNotFound) {
		return nil, true, nil
	} else if err != nil {
		return nil, false, err
	}
	if ok, _ := s.stagePresent(ctx, rec); ok {
		return nil, false, nil
	}
	switch {
	case rec.Unstaging && !s.stageRemains(ctx, rec):
		if err := s.store.DeleteStage(rec.VolumeID); err != nil && !errors.Is(err, state.ErrNotFound) {
			return nil, false, err
		}
		return &Finding{Kind: "stale-stage", Path: rec.StagingPath, Detail: fmt.Sprintf("record of volume %s, which was unstaged, dropped", rec.VolumeID)}, true, nil
	case rec.LostReported:
		return nil, false, nil
	}
	detail := fmt.Sprintf("volume %s will be re-staged on its next NodeStage or NodePublish", rec.VolumeID)
	if rec.Unstaging {
		detail = fmt.Sprintf("an unstage of volume %s was cut short; the CO's next NodeUnstage finishes it", rec.VolumeID)
	}
	rec.LostReported = true
	if err := s.store.PutStage(*rec); err != nil {
		return nil, false, err
	}
	return &Finding{Kind: "stage-lost", Path: rec.StagingPath, Detail: detail}, false, nil
}

// stageRemains reports whether anything of a stage is still there: a
// mount at its staging path, or its device (a loop device only while it
// backs the volume's file). What cannot be checked counts as there.
func (s *Server) stageRemains(ctx context.Context, rec *state.Stage) bool {
	if mounted, err := s.node.IsMounted(rec.StagingPath); err != nil || mounted {
		return true
	}
	if rec.Device == "" {
		return false
	}
	if _, err := os.Stat(rec.Device); errors.Is(err, os.ErrNotExist) {
		return false
	}
	b, loaded := s.backends.Load().get(rec.Backend)
	return !loaded || s.stagedDevice(ctx, b, rec)
}

// readOnlyOrphans finds read-only loop devices over staged devices that no
// read-only block publication of the volume explains. Such a device is the
// host's own (NodePublish makes one for each read-only block volume, see
// node.Node.ReadOnlyDevice); its backing is a device node, never a pool
// file, so the pool check does not see it. A crash between its attach and
// its record's sync leaves one.
func readOnlyOrphans(stages []state.Stage, pubs []state.Publish, devs []node.Loop) []Finding {
	readOnly := map[string]bool{} // volumes with a read-only block publication
	for _, p := range pubs {
		if p.Block && p.ReadOnly {
			readOnly[p.VolumeID] = true
		}
	}
	type node struct{ dev, ino uint64 }
	staged := map[node]*state.Stage{}
	for i := range stages {
		if rec := &stages[i]; rec.Device != "" {
			var st unix.Stat_t
			if unix.Stat(rec.Device, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
				staged[node{st.Dev, st.Ino}] = rec
			}
		}
	}
	var out []Finding
	for _, d := range devs {
		rec, ok := staged[node{d.Dev, d.Inode}]
		if !ok || !d.ReadOnly || readOnly[rec.VolumeID] {
			continue
		}
		out = append(out, Finding{Kind: "orphan-loop", Path: d.Path, Detail: "read-only device over " + rec.Device +
			" of volume " + rec.VolumeID + " with no read-only block publication record"})
	}
	return out
}

// unrecordedPublications rebuilds the publication records of the mounts
// that no record explains but that publish a recorded stage: a bind of its
// staging path (the same filesystem and folder within it, at another
// place), or of its device node or of the read-only loop device over it
// (a read-only block publication). Only what the mount table shows is
// rebuilt: the mount flags of a publication are not (the bind does not
// apply them), nor when it was made, so the record has neither, and a
// repeated NodePublish takes the caller's (publishAt).
func (s *Server) unrecordedPublications(stages []state.Stage, seen node.Observation, roots []string, known map[string]bool) []state.Publish {
	type fsDir struct {
		major, minor int
		root         string
	}
	type devNode struct{ dev, rdev uint64 } // the filesystem holding a device node, and its number
	mounted := map[fsDir]*state.Stage{}
	nodes := map[devNode]*state.Stage{}
	type roDevice struct {
		path string
		rec  *state.Stage
	}
	readOnly := map[devNode]roDevice{} // read-only loop devices over staged ones, by their node
	byDevice := map[[2]uint64]*state.Stage{}
	nodeFS := map[uint64]bool{} // filesystems holding a staged device node
	for i := range stages {
		rec := &stages[i]
		if rec.Block {
			var st unix.Stat_t
			if rec.Device == "" || unix.Stat(rec.Device, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
				continue
			}
			nodes[devNode{st.Dev, st.Rdev}] = rec
			nodeFS[st.Dev] = true
			byDevice[[2]uint64{st.Dev, st.Ino}] = rec
			continue
		}
		// The topmost mount at the staging path is the stage.
		for _, m := range seen.Mounts {
			if m.Mountpoint == rec.StagingPath {
				mounted[fsDir{m.Major, m.Minor, m.Root}] = rec
			}
		}
	}
	for _, d := range seen.Loops {
		rec, ok := byDevice[[2]uint64{d.Dev, d.Inode}]
		if !ok || !d.ReadOnly {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(d.Path, &st) == nil {
			readOnly[devNode{st.Dev, st.Rdev}] = roDevice{d.Path, rec}
		}
	}
	stagingPaths := map[string]bool{}
	for _, rec := range stages {
		stagingPaths[rec.StagingPath] = true
	}
	var out []state.Publish
	for _, m := range seen.Mounts {
		if known[m.Mountpoint] || stagingPaths[m.Mountpoint] || node.Within(roots, m.Mountpoint) {
			continue
		}
		p := state.Publish{TargetPath: m.Mountpoint, ReadOnly: m.ReadOnly()}
		if rec, ok := mounted[fsDir{m.Major, m.Minor, m.Root}]; ok {
			p.VolumeID, p.StagingPath = rec.VolumeID, rec.StagingPath
			out = append(out, p)
			continue
		}
		// Only a bind of a file on a filesystem that holds a staged device
		// node can bind one: the mountpoint of no other is looked at (a
		// network filesystem's may hang).
		dev := unix.Mkdev(uint32(m.Major), uint32(m.Minor))
		var st unix.Stat_t
		if m.Root == "/" || !nodeFS[dev] || unix.Stat(m.Mountpoint, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
			continue
		}
		if rec, ok := nodes[devNode{dev, st.Rdev}]; ok {
			p.VolumeID, p.StagingPath, p.Block = rec.VolumeID, rec.StagingPath, true
			out = append(out, p)
		} else if ro, ok := readOnly[devNode{dev, st.Rdev}]; ok {
			// The read-only loop device's node lies beside the staged one.
			p.VolumeID, p.StagingPath, p.Block, p.ReadOnly, p.Device = ro.rec.VolumeID, ro.rec.StagingPath, true, true, ro.path
			out = append(out, p)
		}
	}
	return out
}

// adopt writes the record of a publication found in the mount table,
// unless its volume is busy with a call, which then decides.
func (s *Server) adopt(p state.Publish) bool {
	unlock, err := s.lock(volKey(p.VolumeID))
	if err != nil {
		return false
	}
	defer unlock()
	durable, err := s.store.PutPublishAsync(p)
	if err == nil {
		err = durable()
	}
	if err != nil {
		s.log.Warn("reconcile: record publication", "volume", p.VolumeID, "target", p.TargetPath, "err", err)
		return false
	}
	return true
}
