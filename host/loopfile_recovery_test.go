package host_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// Recovery of block-backed volumes (the loopfile example: a file in the
// pool on a loop device) across repeated calls, daemon restarts and
// reboots. A reboot takes every mount and every loop device away, and the
// device numbers are handed out afresh: the /dev/loopN a volume had may
// back another file afterwards, so a recorded device number proves
// nothing. Every test here uses real loop devices, ext4 and mounts, and
// undoes them when it ends, also when it fails half-way.

// loopfileVolumeBytes is small enough for a quick mkfs, big enough for ext4.
const loopfileVolumeBytes = 16 << 20

// loopfileDaemon starts a daemon serving the loopfile example. Every loop
// device backed by a file under the daemon's folder and every mount under
// it is released when the test ends (after the test's own cleanups of
// volumes and paths registered later have run).
func loopfileDaemon(t *testing.T) *daemon {
	t.Helper()
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	if _, err := os.Stat("../examples/loopfile"); err != nil {
		t.Skip("example modules not present: ", err)
	}
	d := startDaemon(t, daemonOptions{
		backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go),
		hostcalls: []string{"file", "loop"},
	})
	releaseUnder(t, filepath.Dir(d.pool))
	return d
}

// releaseUnder registers a cleanup that unmounts everything at or below
// each dir (deepest first) and detaches every loop device whose backing
// file lies below one of them, so that nothing a failed test left behind
// outlives it.
func releaseUnder(t *testing.T, dirs ...string) {
	t.Helper()
	t.Cleanup(func() {
		for _, dir := range dirs {
			unmountAll(t, dir)
		}
		devs, err := loop.List(context.Background())
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, dev := range devs {
			for _, dir := range dirs {
				if strings.HasPrefix(dev.BackingFile, dir+"/") {
					if err := loop.DetachBound(context.Background(), dev); err != nil {
						t.Errorf("cleanup: detach %s (%s): %v", dev.Path, dev.BackingFile, err)
					}
					break
				}
			}
		}
	})
}

// loopVolume is a loopfile volume with its node paths and the file that
// backs it.
type loopVolume struct {
	vol             *csi.Volume
	file            string
	block           bool
	staging, target string
}

func loopCapability(block bool) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}
	}
	return c
}

func accessName(block bool) string { return map[bool]string{false: "mount", true: "block"}[block] }

func newLoopVolume(t *testing.T, d *daemon, name string, block bool) *loopVolume {
	t.Helper()
	vol := createVolume(t, d, &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: loopfileVolumeBytes},
		VolumeCapabilities: []*csi.VolumeCapability{loopCapability(block)},
		Parameters:         map[string]string{backendParam: "loopfile"},
	})
	file := vol.GetVolumeContext()["path"]
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("volume %s: its file %q: %v", name, file, err)
	}
	w := workDir(t)
	releaseUnder(t, w) // before the volume's deletion, whatever the test left
	return &loopVolume{vol: vol, file: file, block: block, staging: stagingPath(w, name), target: targetPath(w, name)}
}

func (v *loopVolume) stage(ctx context.Context, d *daemon) error {
	_, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging,
		VolumeCapability: loopCapability(v.block), VolumeContext: v.vol.GetVolumeContext(),
	})
	return err
}

func (v *loopVolume) publishAt(ctx context.Context, d *daemon, target string) error {
	_, err := d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging, TargetPath: target,
		VolumeCapability: loopCapability(v.block), VolumeContext: v.vol.GetVolumeContext(),
	})
	return err
}

func (v *loopVolume) publish(ctx context.Context, d *daemon) error {
	return v.publishAt(ctx, d, v.target)
}

func (v *loopVolume) unpublishAt(ctx context.Context, d *daemon, target string) error {
	_, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.vol.GetVolumeId(), TargetPath: target})
	return err
}

func (v *loopVolume) unstage(ctx context.Context, d *daemon) error {
	_, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging})
	return err
}

// loopsOf lists the loop devices backed by file, matched by the file's
// identity (device and inode numbers), as the kernel reports them.
func loopsOf(t *testing.T, file string) []loop.Device {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatalf("stat %s: %v", file, err)
	}
	devs, err := loop.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []loop.Device
	for _, dev := range devs {
		if dev.Dev == st.Dev && dev.Inode == st.Ino {
			out = append(out, dev)
		}
	}
	return out
}

// loopOf returns the one loop device that backs file, failing the test
// unless there is exactly one.
func loopOf(t *testing.T, file string) loop.Device {
	t.Helper()
	devs := loopsOf(t, file)
	if len(devs) != 1 {
		t.Fatalf("%d loop devices back %s, want 1: %v", len(devs), file, devs)
	}
	return devs[0]
}

// want checks the loop devices of the volume's file and the mounts at its
// staging path and at each target. A staged block volume mounts nothing at
// its staging path: only a mount volume counts one there.
func (v *loopVolume) want(t *testing.T, loops int, staged bool, targets map[string]int) {
	t.Helper()
	if n := len(loopsOf(t, v.file)); n != loops {
		t.Errorf("%d loop devices back %s, want %d", n, v.file, loops)
	}
	wantStaging := 0
	if staged && !v.block {
		wantStaging = 1
	}
	if n := mountsAt(t, v.staging); n != wantStaging {
		t.Errorf("%d mounts at the staging path, want %d", n, wantStaging)
	}
	for target, want := range targets {
		if n := mountsAt(t, target); n != want {
			t.Errorf("%d mounts at %s, want %d", n, target, want)
		}
	}
}

// wantPublishedDevice checks that what is published at target is the loop
// device backing the volume's file: for block access the device node bound
// there, for mount access the filesystem mounted there.
func (v *loopVolume) wantPublishedDevice(t *testing.T, target string) {
	t.Helper()
	dev := loopOf(t, v.file)
	var dst unix.Stat_t
	if err := unix.Stat(dev.Path, &dst); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		t.Fatal(err)
	}
	got := st.Dev // the filesystem's device
	if v.block {
		got = st.Rdev // the device node's
	}
	if got != dst.Rdev {
		t.Errorf("%s shows device %d:%d, not %s (%d:%d) that backs %s",
			target, unix.Major(got), unix.Minor(got), dev.Path, unix.Major(dst.Rdev), unix.Minor(dst.Rdev), v.file)
	}
}

// The data a test writes through a published volume and reads back: a
// file in the filesystem for mount access, bytes at an offset of the
// device for block access.
const (
	keptName   = "kept"
	keptOffset = 1 << 20
)

// keptData is 4 KiB that differ from volume to volume (the ID ends in a
// hash of the volume's name).
func keptData(v *loopVolume) []byte {
	id := v.vol.GetVolumeId()
	return bytes.Repeat([]byte(id[len(id)-16:]), 256)
}

func (v *loopVolume) writeKept(t *testing.T, target string) {
	t.Helper()
	data := keptData(v)
	if !v.block {
		f, err := os.Create(filepath.Join(target, keptName))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.OpenFile(target, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, keptOffset); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func (v *loopVolume) readKept(t *testing.T, target string) {
	t.Helper()
	want := keptData(v)
	var got []byte
	var err error
	if v.block {
		got = make([]byte, len(want))
		var f *os.File
		if f, err = os.Open(target); err == nil {
			_, err = f.ReadAt(got, keptOffset)
			f.Close()
		}
	} else {
		got, err = os.ReadFile(filepath.Join(target, keptName))
	}
	if err != nil {
		t.Fatalf("read the data back through %s: %v", target, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("data read back through %s differs from what was written (%q... against %q...)", target, got[:min(16, len(got))], want[:16])
	}
}

// TestLoopfileRepeatedNodeCalls: for mount and block access, a second
// NodeStage and a second NodePublish add no mount and no loop device, and
// unpublish and unstage leave neither behind.
func TestLoopfileRepeatedNodeCalls(t *testing.T) {
	d := loopfileDaemon(t)
	for _, block := range []bool{false, true} {
		t.Run(accessName(block), func(t *testing.T) {
			ctx := callCtx(t)
			v := newLoopVolume(t, d, "repeat-"+accessName(block), block)
			for i := range 2 {
				if err := v.stage(ctx, d); err != nil {
					t.Fatalf("NodeStage #%d: %v", i+1, err)
				}
				v.want(t, 1, true, map[string]int{v.target: 0})
			}
			for i := range 2 {
				if err := v.publish(ctx, d); err != nil {
					t.Fatalf("NodePublish #%d: %v", i+1, err)
				}
				v.want(t, 1, true, map[string]int{v.target: 1})
			}
			if err := v.stage(ctx, d); err != nil {
				t.Fatalf("NodeStage while published: %v", err)
			}
			v.want(t, 1, true, map[string]int{v.target: 1})
			v.wantPublishedDevice(t, v.target)
			v.writeKept(t, v.target)
			v.readKept(t, v.target)

			if err := v.unpublishAt(ctx, d, v.target); err != nil {
				t.Fatal(err)
			}
			if err := v.unstage(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.want(t, 0, false, map[string]int{v.target: 0})
		})
	}
}

// TestLoopfileDaemonRestart: a volume staged and published before the
// daemon restarts (its mounts and device untouched) publishes to a new
// target after it, a repeated NodeStage changes nothing, and unpublish and
// unstage release every mount and the loop device.
func TestLoopfileDaemonRestart(t *testing.T) {
	d := loopfileDaemon(t)
	var vols []*loopVolume
	for _, block := range []bool{false, true} {
		v := newLoopVolume(t, d, "restart-"+accessName(block), block)
		if err := v.stage(callCtx(t), d); err != nil {
			t.Fatal(err)
		}
		if err := v.publish(callCtx(t), d); err != nil {
			t.Fatal(err)
		}
		v.writeKept(t, v.target)
		vols = append(vols, v)
	}

	d.restart(t)

	if findings := d.srv.Reconcile(callCtx(t), false); len(findings) != 0 {
		t.Errorf("Reconcile after a restart found %v, want nothing", findings)
	}
	for _, v := range vols {
		t.Run(accessName(v.block), func(t *testing.T) {
			ctx := callCtx(t)
			second := v.target + "-2"
			if err := v.publishAt(ctx, d, second); err != nil {
				t.Fatalf("NodePublish to a new target after restart: %v", err)
			}
			if err := v.stage(ctx, d); err != nil {
				t.Fatalf("NodeStage after restart: %v", err)
			}
			if err := v.publish(ctx, d); err != nil {
				t.Fatalf("NodePublish to the old target after restart: %v", err)
			}
			v.want(t, 1, true, map[string]int{v.target: 1, second: 1})
			v.wantPublishedDevice(t, second)
			v.readKept(t, second)

			for _, target := range []string{v.target, second} {
				if err := v.unpublishAt(ctx, d, target); err != nil {
					t.Fatal(err)
				}
			}
			if err := v.unstage(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.want(t, 0, false, map[string]int{v.target: 0, second: 0})
			if ms := mountsUnder(t, filepath.Dir(filepath.Dir(v.staging))); len(ms) != 0 {
				t.Errorf("mounts left after unstage: %v", ms)
			}
		})
	}
}

// attachAt binds file to the loop device dev itself (LOOP_CONFIGURE), as
// when, after a reboot, another file is attached first and gets the number
// a volume had before. It reports false when another process took dev
// meanwhile; the file is then attached elsewhere.
func attachAt(t *testing.T, dev, file string) bool {
	t.Helper()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
	copy(cfg.Info.File_name[:], file)
	err = unix.IoctlLoopConfigure(int(d.Fd()), &cfg)
	if errors.Is(err, unix.EBUSY) {
		if _, err := loop.Attach(context.Background(), file, loop.Options{}); err != nil {
			t.Fatalf("attach %s: %v", file, err)
		}
		return false
	}
	if err != nil {
		t.Fatalf("attach %s at %s: %v", file, dev, err)
	}
	return true
}

// TestLoopfileReboot simulates a reboot under a staged and published
// volume: with the daemon stopped, the target and staging mounts go and
// the loop device is detached, and another file is attached to the very
// device number the volume had — a file outside the pool, or the file of
// another volume in the same pool, which the host's grant checks alone
// cannot tell from the volume's. The new daemon's Reconcile reports the
// lost stage; NodeStage and NodePublish re-attach the volume's own file
// and mount it once each, and the data written before the reboot is there.
func TestLoopfileReboot(t *testing.T) {
	d := loopfileDaemon(t)
	outside := t.TempDir()
	releaseUnder(t, outside)
	for _, block := range []bool{false, true} {
		for _, inPool := range []bool{false, true} {
			name := accessName(block) + map[bool]string{false: "-other-file", true: "-other-volume"}[inPool]
			t.Run(name, func(t *testing.T) {
				ctx := callCtx(t)
				v := newLoopVolume(t, d, "reboot-"+name, block)
				other := filepath.Join(outside, name+".img")
				if inPool {
					other = newLoopVolume(t, d, "neighbour-"+name, false).file
				} else if err := os.WriteFile(other, nil, 0o644); err != nil {
					t.Fatal(err)
				} else if err := os.Truncate(other, loopfileVolumeBytes); err != nil {
					t.Fatal(err)
				}
				if err := v.stage(ctx, d); err != nil {
					t.Fatal(err)
				}
				if err := v.publish(ctx, d); err != nil {
					t.Fatal(err)
				}
				v.writeKept(t, v.target)
				before := loopOf(t, v.file).Path

				// The reboot, behind the stopped daemon's back.
				d.stop()
				if err := unix.Unmount(v.target, 0); err != nil {
					t.Fatalf("unmount %s: %v", v.target, err)
				}
				if !block {
					if err := unix.Unmount(v.staging, 0); err != nil {
						t.Fatalf("unmount %s: %v", v.staging, err)
					}
				}
				if err := loop.Detach(context.Background(), before); err != nil {
					t.Fatal(err)
				}
				reused := attachAt(t, before, other)
				if !reused {
					t.Logf("%s was taken by another process before the test could reuse it", before)
				}
				v.want(t, 0, false, map[string]int{v.target: 0})
				d.start(t)

				findings := d.srv.Reconcile(ctx, false)
				if !slices.ContainsFunc(findings, func(f host.Finding) bool { return f.Kind == "stage-lost" && f.Path == v.staging }) {
					t.Errorf("Reconcile does not report the lost stage at %s: %v", v.staging, findings)
				}
				if inPool && reused && !slices.ContainsFunc(findings, func(f host.Finding) bool { return f.Kind == "orphan-loop" && f.Path == before }) {
					t.Errorf("Reconcile does not report %s, which backs a pool file no record explains: %v", before, findings)
				}

				if err := v.stage(ctx, d); err != nil {
					t.Fatalf("NodeStage after reboot: %v", err)
				}
				v.want(t, 1, true, map[string]int{v.target: 0})
				if err := v.publish(ctx, d); err != nil {
					t.Fatalf("NodePublish after reboot: %v", err)
				}
				v.want(t, 1, true, map[string]int{v.target: 1})
				v.wantPublishedDevice(t, v.target)
				v.readKept(t, v.target)
				if findings := d.srv.Reconcile(ctx, false); slices.ContainsFunc(findings, func(f host.Finding) bool { return f.Path == v.staging || f.Path == v.target }) {
					t.Errorf("Reconcile after re-staging still reports the volume: %v", findings)
				}
				// Repeats stay at one device and one mount each.
				if err := v.stage(ctx, d); err != nil {
					t.Fatal(err)
				}
				if err := v.publish(ctx, d); err != nil {
					t.Fatal(err)
				}
				v.want(t, 1, true, map[string]int{v.target: 1})

				if err := v.unpublishAt(ctx, d, v.target); err != nil {
					t.Fatal(err)
				}
				if err := v.unstage(ctx, d); err != nil {
					t.Fatal(err)
				}
				v.want(t, 0, false, map[string]int{v.target: 0})
				// The other file's device was never the host's to touch.
				if got := loopOf(t, other); reused && got.Path != before {
					t.Errorf("%s moved from %s to %s", other, before, got.Path)
				}
				if err := loop.Detach(context.Background(), loopOf(t, other).Path); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestLoopfileReconcileOrphans: a loop device backed by a pool file that
// no record explains, and a filesystem mounted from it, are reported as
// orphan-loop and orphan-mount; a report-only run leaves them alone and a
// cleaning run releases them. Staged and published volumes (mount and
// block access) are neither reported nor touched.
func TestLoopfileReconcileOrphans(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	var kept []*loopVolume
	for _, block := range []bool{false, true} {
		v := newLoopVolume(t, d, "kept-"+accessName(block), block)
		if err := v.stage(ctx, d); err != nil {
			t.Fatal(err)
		}
		if err := v.publish(ctx, d); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, v)
	}
	leaked := newLoopVolume(t, d, "leaked", false)
	dev, err := loop.Attach(ctx, leaked.file, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Make(ctx, dev.Path, "ext4", fs.MakeOptions{}); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(workDir(t), "leaked-mount")
	if err := os.MkdirAll(orphan, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev.Path, orphan, "ext4", 0, ""); err != nil {
		t.Fatalf("mount %s at %s: %v", dev.Path, orphan, err)
	}

	isLoop := func(f host.Finding) bool { return f.Kind == "orphan-loop" && f.Path == dev.Path }
	isMount := func(f host.Finding) bool { return f.Kind == "orphan-mount" && f.Path == orphan }
	checkKept := func(findings []host.Finding) {
		t.Helper()
		for _, v := range kept {
			dev := loopOf(t, v.file).Path
			for _, f := range findings {
				if f.Path == v.staging || f.Path == v.target || f.Path == dev {
					t.Errorf("recorded %s volume reported: %v", accessName(v.block), f)
				}
			}
			v.want(t, 1, true, map[string]int{v.target: 1})
		}
	}

	findings := d.srv.Reconcile(ctx, false)
	if !slices.ContainsFunc(findings, isLoop) || !slices.ContainsFunc(findings, isMount) {
		t.Errorf("orphan device %s and its mount at %s not both reported: %v", dev.Path, orphan, findings)
	}
	checkKept(findings)
	if n := len(loopsOf(t, leaked.file)); n != 1 {
		t.Errorf("report-only reconcile changed the orphan device: %d devices back %s", n, leaked.file)
	}
	if n := mountsAt(t, orphan); n != 1 {
		t.Errorf("report-only reconcile changed the orphan mount: %d mounts", n)
	}

	start := time.Now()
	findings = d.srv.Reconcile(ctx, true)
	t.Logf("cleaning reconcile took %v", time.Since(start))
	if !slices.ContainsFunc(findings, isLoop) || !slices.ContainsFunc(findings, isMount) {
		t.Errorf("cleaning run does not report the orphans: %v", findings)
	}
	if n := mountsAt(t, orphan); n != 0 {
		t.Errorf("orphan still mounted after clean (%d mounts)", n)
	}
	if n := len(loopsOf(t, leaked.file)); n != 0 {
		t.Errorf("orphan device still attached after clean: %d devices back %s", n, leaked.file)
	}
	checkKept(findings)
	if findings := d.srv.Reconcile(ctx, false); slices.ContainsFunc(findings, isLoop) || slices.ContainsFunc(findings, isMount) {
		t.Errorf("orphans reported after clean: %v", findings)
	}

	for _, v := range kept {
		if err := v.unpublishAt(ctx, d, v.target); err != nil {
			t.Fatal(err)
		}
		if err := v.unstage(ctx, d); err != nil {
			t.Fatal(err)
		}
		v.want(t, 0, false, map[string]int{v.target: 0})
	}
}

// TestLoopfileFailedStageLeavesNoRecord: the stage record is written before
// the mount it describes; a mount that fails must take it out again, so
// that the next NodeStage with other arguments starts afresh instead of
// meeting a record of a stage that never happened.
func TestLoopfileFailedStageLeavesNoRecord(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "failed-stage", false)
	bad := loopCapability(false)
	bad.GetMount().MountFlags = []string{"no_such_ext4_option"}
	_, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging,
		VolumeCapability: bad, VolumeContext: v.vol.GetVolumeContext(),
	})
	if err == nil {
		t.Fatal("NodeStage with a mount option ext4 does not know succeeded")
	}
	v.want(t, 0, false, map[string]int{v.target: 0})
	if err := v.stage(ctx, d); err != nil {
		t.Fatalf("NodeStage after a failed one: %v", err)
	}
	v.want(t, 1, true, map[string]int{v.target: 0})
	if err := v.unstage(ctx, d); err != nil {
		t.Fatal(err)
	}
	v.want(t, 0, false, map[string]int{v.target: 0})
}

// TestLoopfileUnstageRefusedWhilePublished: NodeUnstage checks that each
// recorded publication is still mounted before it lets a volume go; a live
// one, a bound device node for block access or a bind for mount access,
// keeps refusing it.
func TestLoopfileUnstageRefusedWhilePublished(t *testing.T) {
	d := loopfileDaemon(t)
	for _, block := range []bool{false, true} {
		t.Run(accessName(block), func(t *testing.T) {
			ctx := callCtx(t)
			v := newLoopVolume(t, d, "busy-"+accessName(block), block)
			if err := v.stage(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := v.publish(ctx, d); err != nil {
				t.Fatal(err)
			}
			if err := v.unstage(ctx, d); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("NodeUnstage while published = %v, want FAILED_PRECONDITION", err)
			}
			v.want(t, 1, true, map[string]int{v.target: 1})
			if err := v.unpublishAt(ctx, d, v.target); err != nil {
				t.Fatal(err)
			}
			if err := v.unstage(ctx, d); err != nil {
				t.Fatal(err)
			}
			v.want(t, 0, false, map[string]int{v.target: 0})
		})
	}
}

// TestLoopfileUnstageReleasesUnrecordedDevice: a daemon killed during
// NodeStage after the backend attached the volume's file, before the stage
// record was written, leaves a loop device that no record names. When the
// CO then gives up the stage (kubelet does when the pod goes away while
// the stage is uncertain) and calls NodeUnstage, the device goes too, and
// the volume can be deleted. The loop device is attached here as that
// NodeStage left it.
func TestLoopfileUnstageReleasesUnrecordedDevice(t *testing.T) {
	d := loopfileDaemon(t)
	ctx := callCtx(t)
	v := newLoopVolume(t, d, "unrecorded", false)
	if _, err := loop.Attach(ctx, v.file, loop.Options{}); err != nil {
		t.Fatal(err)
	}
	v.want(t, 1, false, nil)
	if err := v.unstage(ctx, d); err != nil {
		t.Fatalf("NodeUnstage of a volume with no stage record: %v", err)
	}
	v.want(t, 0, false, nil)
	if _, err := d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.vol.GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume after NodeUnstage: %v", err)
	}
}
