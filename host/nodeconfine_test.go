package host_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// mountTmpfs mounts a tmpfs at a new folder dir/name holding a file, as
// something else on the node would, and returns the folder; the test's
// work folder detaches it at the end.
func mountTmpfs(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	if err := os.WriteFile(filepath.Join(p, "data"), []byte("someone's"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantIntact checks that the tmpfs at p is still mounted with its file.
func wantIntact(t *testing.T, p, after string) {
	t.Helper()
	if n := mountsAt(t, p); n != 1 {
		t.Errorf("after %s: %d mounts at %s, want the tmpfs still there", after, n, p)
	}
	if b, err := os.ReadFile(filepath.Join(p, "data")); err != nil || string(b) != "someone's" {
		t.Errorf("after %s: file of the tmpfs at %s: %q, %v", after, p, b, err)
	}
}

// TestNodeCallsTouchOnlyTheVolumes: NodeUnpublishVolume and
// NodeUnstageVolume unmount and remove only what the records show to be
// the volume's. A volume with no record, or a path the volume is not at,
// answers OK (not published or staged there) and leaves the file or mount
// at that path as it was; the volume's own stage and publication stay.
func TestNodeCallsTouchOnlyTheVolumes(t *testing.T) {
	d, _ := specDaemon(t)
	w := workDir(t)
	v := newLocalVolume(t, d, "owner")
	if err := v.stage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if err := v.publish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	id := v.vol.GetVolumeId()
	unknown := "localdir:x" // a backend of ours, a volume no record names

	victim := filepath.Join(w, "some", "dir", "victim.txt")
	if err := os.MkdirAll(filepath.Dir(victim), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := mountTmpfs(t, w, "unrelated")

	unpublish := func(vol, target string) {
		t.Helper()
		if _, err := d.node().NodeUnpublishVolume(callCtx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
			t.Errorf("NodeUnpublish %s at %s: %v, want OK (not published there)", vol, target, err)
		}
	}
	unstage := func(vol, staging string) {
		t.Helper()
		if _, err := d.node().NodeUnstageVolume(callCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
			t.Errorf("NodeUnstage %s at %s: %v, want OK (not staged there)", vol, staging, err)
		}
	}

	unpublish(unknown, victim)
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Errorf("NodeUnpublish of a volume with no record removed %s: %q, %v", victim, b, err)
	}
	unpublish(unknown, tmp)
	wantIntact(t, tmp, "NodeUnpublish of a volume with no record")
	unpublish(id, tmp) // staged and published, but elsewhere
	wantIntact(t, tmp, "NodeUnpublish of a volume published elsewhere")
	unpublish(unknown, v.target) // another volume's publication
	unstage(unknown, tmp)
	wantIntact(t, tmp, "NodeUnstage of a volume with no record")
	unstage(id, tmp) // staged, but elsewhere
	wantIntact(t, tmp, "NodeUnstage of a volume staged elsewhere")
	unstage(unknown, v.staging) // another volume's stage
	unstage(unknown, v.target)  // another volume's publication
	link := filepath.Join(w, "link-to-staging")
	if err := os.Symlink(v.staging, link); err != nil {
		t.Fatal(err)
	}
	unstage(unknown, link) // another volume's stage, through a link
	if mountsAt(t, v.staging) != 1 || mountsAt(t, v.target) != 1 {
		t.Errorf("calls for other volumes took the stage or publication of %s: %d mounts at staging, %d at target", id, mountsAt(t, v.staging), mountsAt(t, v.target))
	}

	// A NodeStage at a path where something else is mounted fails and
	// leaves it mounted.
	tmp2 := mountTmpfs(t, w, "unrelated2")
	other := newLocalVolume(t, d, "other")
	other.staging = tmp2
	if err := other.stage(callCtx(t), d); err == nil {
		t.Errorf("NodeStage over an unrelated mount: OK")
	}
	wantIntact(t, tmp2, "a NodeStage that failed over it")

	// The volume's own calls still take everything down.
	if err := v.unpublish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, v.staging) + mountsAt(t, v.target); n != 0 {
		t.Errorf("%d mounts left after the volume's own unpublish and unstage", n)
	}
}

// TestNodeCallsReleaseLostRecords: a mount whose record a crash lost is
// still the volume's where the mount table ties it to the volume: a
// publication that binds the recorded stage, a stage mount of the
// volume's pool. NodeUnpublish and NodeUnstage take them down.
func TestNodeCallsReleaseLostRecords(t *testing.T) {
	d, _ := specDaemon(t)
	v := newLocalVolume(t, d, "lost")
	if err := v.stage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if err := v.publish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	id := v.vol.GetVolumeId()
	if err := d.srv.ForgetPublication(id, v.target); err != nil {
		t.Fatal(err)
	}
	if err := v.unpublish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, v.target); n != 0 {
		t.Errorf("NodeUnpublish of a publication whose record was lost left %d mounts", n)
	}
	if _, err := os.Stat(v.target); !os.IsNotExist(err) {
		t.Errorf("NodeUnpublish of a publication whose record was lost left the target: %v", err)
	}
	if err := d.srv.ForgetStage(id); err != nil {
		t.Fatal(err)
	}
	if err := v.unstage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, v.staging); n != 0 {
		t.Errorf("NodeUnstage of a stage whose record was lost left %d mounts", n)
	}
}

// TestNodePathRoots: with node.path_roots set, staging and target paths
// outside them are INVALID_ARGUMENT before anything is touched; inside
// them the volume stages and publishes as usual.
func TestNodePathRoots(t *testing.T) {
	w := workDir(t)
	o := localdirOptions(t)
	o.pathRoots = []string{filepath.Join(w, "kubelet")}
	d := startDaemon(t, o)
	v := newLocalVolume(t, d, "rooted")
	id := v.vol.GetVolumeId()
	inside := &localVolume{vol: v.vol, staging: filepath.Join(w, "kubelet", "staging", "rooted"), target: filepath.Join(w, "kubelet", "pods", "rooted", "mount")}
	outside := filepath.Join(w, "elsewhere", "victim")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Join(w, "kubeletx", "staging") // a prefix of a root's name is not inside it
	_, err := d.node().NodeStageVolume(callCtx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: outside, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
	wantCode(t, err, codes.InvalidArgument, "path roots")
	_, err = d.node().NodeStageVolume(callCtx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: prefix, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
	wantCode(t, err, codes.InvalidArgument, "path roots")
	if n := mountsAt(t, outside) + mountsAt(t, prefix); n != 0 {
		t.Errorf("NodeStage outside the roots mounted %d", n)
	}
	// A path that cannot lead anywhere is the request's fault, not a
	// moment's: a file where a folder must be, a loop of links.
	file := filepath.Join(w, "kubelet", "file")
	loop := filepath.Join(w, "kubelet", "loop")
	if err := errors.Join(os.MkdirAll(filepath.Dir(file), 0o755), os.WriteFile(file, nil, 0o644), os.Symlink(loop, loop)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(file, "staging"), filepath.Join(loop, "staging")} {
		_, err = d.node().NodeStageVolume(callCtx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: p, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
		wantCode(t, err, codes.InvalidArgument, "staging_target_path")
	}
	if err := inside.stage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	_, err = d.node().NodePublishVolume(callCtx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: inside.staging, TargetPath: outside, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
	wantCode(t, err, codes.InvalidArgument, "path roots")
	_, err = d.node().NodeUnpublishVolume(callCtx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: outside})
	wantCode(t, err, codes.InvalidArgument, "path roots")
	_, err = d.node().NodeUnstageVolume(callCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: outside})
	wantCode(t, err, codes.InvalidArgument, "path roots")
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("a call outside the roots removed %s: %v", outside, err)
	}
	if err := inside.publish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if err := inside.unpublish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if err := inside.unstage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
}

// TestDaemonNodeCallsTouchNothingOfOthers runs the daemon binary and makes
// the two calls that used to destroy what the daemon does not own: a
// NodeUnpublishVolume of a volume no record names at a file's path, and a
// NodeUnstageVolume of such a volume at an unrelated tmpfs. Both answer OK
// (not published, not staged there); the file and the tmpfs stay. The
// socket the daemon serves on is 0600.
func TestDaemonNodeCallsTouchNothingOfOthers(t *testing.T) {
	p := newProcDaemon(t)
	w := workDir(t)
	victim := filepath.Join(w, "some", "dir", "victim.txt")
	if err := os.MkdirAll(filepath.Dir(victim), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := mountTmpfs(t, w, "unrelated")
	n := csi.NewNodeClient(p.conn)
	if _, err := n.NodeUnpublishVolume(callCtx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: "localdir:x", TargetPath: victim}); err != nil {
		t.Errorf("NodeUnpublishVolume: %v, want OK", err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Errorf("NodeUnpublishVolume of a volume with no record removed %s: %q, %v", victim, b, err)
	}
	if _, err := n.NodeUnstageVolume(callCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: "localdir:x", StagingTargetPath: tmp}); err != nil {
		t.Errorf("NodeUnstageVolume: %v, want OK", err)
	}
	wantIntact(t, tmp, "NodeUnstageVolume of a volume with no record")
	// The socket the calls went through is the owner's alone.
	if st, err := os.Stat(p.Socket); err != nil {
		t.Error(err)
	} else if st.Mode().Perm() != 0o600 {
		t.Errorf("the daemon's socket %s has mode %v, want 0600", p.Socket, st.Mode().Perm())
	}
}

// TestNodeUnstageTakesOnlyTheStage: NodeUnstage of a recorded stage
// unmounts the stage's own mount, not a mount of something else stacked
// over the staging path.
func TestNodeUnstageTakesOnlyTheStage(t *testing.T) {
	d, _ := specDaemon(t)
	v := newLocalVolume(t, d, "stacked")
	if err := v.stage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	// Something else mounts over the stage (the work folder of the
	// volume detaches both at the end).
	tmp := mountTmpfs(t, filepath.Dir(v.staging), filepath.Base(v.staging))
	if _, err := d.node().NodeUnstageVolume(callCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging}); err != nil {
		t.Logf("NodeUnstage under another mount: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "data")); err != nil || string(b) != "someone's" {
		t.Errorf("NodeUnstage took the mount stacked over the stage: file %q, %v", b, err)
	}
}

// TestNodePathRootsTeardown: node.path_roots configured after a volume
// was staged and published elsewhere does not keep the recorded stage and
// publication from being taken down; and a link inside a root cannot
// lead a stage outside the roots.
func TestNodePathRootsTeardown(t *testing.T) {
	w := workDir(t)
	o := localdirOptions(t)
	d := startDaemon(t, o)
	v := newLocalVolume(t, d, "before-roots")
	if err := v.stage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	if err := v.publish(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	d.stop()
	d.cfg.Node.PathRoots = []string{filepath.Join(w, "kubelet")}
	d.start(t)
	if err := v.unpublish(callCtx(t), d); err != nil {
		t.Errorf("NodeUnpublish of a recorded publication outside roots set later: %v", err)
	}
	if err := v.unstage(callCtx(t), d); err != nil {
		t.Errorf("NodeUnstage of a recorded stage outside roots set later: %v", err)
	}
	if n := mountsAt(t, v.staging) + mountsAt(t, v.target); n != 0 {
		t.Errorf("%d mounts left after the teardown", n)
	}

	// An unrecorded path outside the roots is still refused.
	_, err := d.node().NodeUnstageVolume(callCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging})
	wantCode(t, err, codes.InvalidArgument, "path roots")

	// A link inside the roots to a folder outside them.
	outside := filepath.Join(w, "elsewhere")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(w, "kubelet"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(w, "kubelet", "escape")); err != nil {
		t.Fatal(err)
	}
	via := filepath.Join(w, "kubelet", "escape", "staging")
	_, err = d.node().NodeStageVolume(callCtx(t), &csi.NodeStageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: via, VolumeCapability: rwCap, VolumeContext: v.vol.GetVolumeContext()})
	wantCode(t, err, codes.InvalidArgument, "path roots")
	if n := mountsAt(t, filepath.Join(outside, "staging")); n != 0 {
		t.Errorf("NodeStage through a link out of the roots mounted %d", n)
	}
}

// TestNodeUnstageLostRecordLeavesWhatIsUnder: NodeUnstage of a stage
// whose record a crash lost unmounts the volume's own mount at the
// staging path, not a mount of something else stacked under it.
func TestNodeUnstageLostRecordLeavesWhatIsUnder(t *testing.T) {
	d, _ := specDaemon(t)
	w := workDir(t)
	v := newLocalVolume(t, d, "lostover")
	if err := v.stage(callCtx(t), d); err != nil {
		t.Fatal(err)
	}
	// Put a tmpfs between the stage and a second bind of the volume's
	// pool folder: keep a copy of the stage aside, mount the tmpfs over
	// the stage, bind the copy over the tmpfs (the work folders detach
	// everything left at the end).
	aside := filepath.Join(w, "aside")
	if err := os.MkdirAll(aside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(v.staging, aside, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount (needs root): %v", err)
	}
	tmp := mountTmpfs(t, filepath.Dir(v.staging), filepath.Base(v.staging))
	if err := unix.Mount(aside, v.staging, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(aside, 0); err != nil {
		t.Fatal(err)
	}
	before := mountsAt(t, v.staging)
	id := v.vol.GetVolumeId()
	if err := d.srv.ForgetStage(id); err != nil {
		t.Fatal(err)
	}
	if _, err := d.node().NodeUnstageVolume(callCtx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: v.staging}); err != nil {
		t.Errorf("NodeUnstage of a stage whose record was lost: %v", err)
	}
	if n := mountsAt(t, v.staging); n != before-1 {
		t.Errorf("NodeUnstage of a stage whose record was lost: %d mounts at the staging path, want %d (only the volume's top one gone)", n, before-1)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "data")); err != nil || string(b) != "someone's" {
		t.Errorf("NodeUnstage of a stage whose record was lost took the tmpfs under it: file %q, %v", b, err)
	}
}
