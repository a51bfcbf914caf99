package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The stage cycle is NodeStage+NodeUnstage of a loopfile volume, measured
// against its kernel floor on an image of the same size: attach a loop
// device with direct I/O (LOOP_CTL_GET_FREE, LOOP_CONFIGURE), mount the
// ext4 on it, unmount it, detach it (LOOP_CLR_FD); for block access, which
// stages the device itself, attach and detach. The two alternate cycle by cycle, so that load
// from elsewhere falls on both alike; each round reports the median cycle
// time of each.

// stageCycleKind is one access type of the stage cycle.
type stageCycleKind struct {
	name  string // metric name
	block bool
}

var stageCycleKinds = []stageCycleKind{{"Stage+Unstage, ext4", false}, {"Stage+Unstage, block", true}}

// stageVolumeBytes is the size of the volume and of the floor's image.
const stageVolumeBytes = 64 << 20

func (k stageCycleKind) capability() *csi.VolumeCapability {
	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	if k.block {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: mode}
	}
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}, AccessMode: mode}
}

// stageCycle creates a loopfile volume and a floor image of its size, stages
// the volume once untimed (which formats it) and then, for dur, alternates
// one timed wasmcsi cycle with one timed floor cycle. It returns the median
// cycle times in microseconds. The volume, the image and every loop device
// and mount go away before it returns, also when ctx is cancelled.
func stageCycle(ctx context.Context, d *driver, floorDir string, k stageCycleKind, dur time.Duration) (wasmUs, floorUs float64, err error) {
	vc := k.capability()
	resp, err := d.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               fmt.Sprintf("sbs-stage-%d-%d", os.Getpid(), d.seq.Add(1)),
		CapacityRange:      &csi.CapacityRange{RequiredBytes: stageVolumeBytes},
		VolumeCapabilities: []*csi.VolumeCapability{vc},
		Parameters:         map[string]string{"wasmcsi.dev/backend": "loopfile"},
	})
	if err != nil {
		return 0, 0, fmt.Errorf("CreateVolume: %w", err)
	}
	id, size := resp.GetVolume().GetVolumeId(), resp.GetVolume().GetCapacityBytes()
	staging := filepath.Join(d.dir, "staging", id)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return 0, 0, err
	}
	staged := false
	defer func() {
		bg := context.WithoutCancel(ctx)
		if staged {
			// An interrupt may leave the cancelled call still running in
			// the daemon, which answers Aborted until it is done.
			var uerr error
			for try := 0; try < 50; try++ {
				_, uerr = d.node.NodeUnstageVolume(bg, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
				if status.Code(uerr) != codes.Aborted {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if uerr != nil {
				err = errors.Join(err, fmt.Errorf("NodeUnstageVolume: %w", uerr))
			}
		}
		err = errors.Join(err, d.delete(bg, id))
	}()
	stage := func() error {
		if _, err := d.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: vc}); err != nil {
			return fmt.Errorf("NodeStageVolume: %w", err)
		}
		staged = true
		return nil
	}
	unstage := func() error {
		if _, err := d.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			return fmt.Errorf("NodeUnstageVolume: %w", err)
		}
		staged = false
		return nil
	}
	// The first stage formats the volume; the floor's image is formatted
	// here as well, with the daemon's mkfs options.
	if err := stage(); err != nil {
		return 0, 0, err
	}
	if err := unstage(); err != nil {
		return 0, 0, err
	}
	img, target, err := floorImage(ctx, floorDir, size, !k.block)
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(img)
	defer os.Remove(target)

	var wts, fts []float64
	for deadline := time.Now().Add(dur); time.Now().Before(deadline) || len(wts) < 3; {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		start := time.Now()
		if err := stage(); err != nil {
			return 0, 0, err
		}
		if err := unstage(); err != nil {
			return 0, 0, err
		}
		wts = append(wts, float64(time.Since(start).Nanoseconds())/1e3)
		start = time.Now()
		if err := floorStageCycle(img, target, k.block); err != nil {
			return 0, 0, err
		}
		fts = append(fts, float64(time.Since(start).Nanoseconds())/1e3)
	}
	return median(wts), median(fts), nil
}

// stageSkipped says why the stage cycle cannot run here (no loop devices
// at loopControl, no mkfs.ext4), or "".
func stageSkipped(loopControl string) string {
	if _, err := os.Stat(loopControl); err != nil {
		return "no loop devices: " + err.Error()
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return "the floor's image needs mkfs.ext4: " + err.Error()
	}
	return ""
}

// floorImage makes a file of size bytes in dir, formatted ext4 when fs is
// set, and a mount point beside it.
func floorImage(ctx context.Context, dir string, size int64, fs bool) (img, target string, err error) {
	img = filepath.Join(dir, fmt.Sprintf("stage-%d.img", time.Now().UnixNano()))
	f, err := os.Create(img)
	if err != nil {
		return "", "", err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && fs {
		out, merr := exec.CommandContext(ctx, "mkfs.ext4", "-F", "-q", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", img).CombinedOutput()
		if merr != nil {
			err = fmt.Errorf("mkfs.ext4 %s: %w: %s", img, merr, out)
		}
	}
	target = img + ".mnt"
	if err == nil {
		err = os.Mkdir(target, 0o750)
	}
	if err != nil {
		os.Remove(img)
		return "", "", err
	}
	return img, target, nil
}

// floorStageCycle is what staging cannot do without: attach, mount,
// unmount, detach (attach and detach for block). Whatever it set up is
// undone before it returns, also on failure.
func floorStageCycle(img, target string, block bool) (err error) {
	dev, fd, err := floorAttach(img)
	if err != nil {
		return err
	}
	defer func() {
		if derr := floorDetach(dev, fd); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	if block {
		return nil
	}
	if err := unix.Mount(dev, target, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, target, err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	return nil
}

// floorAttach binds img to a free loop device and returns the device and
// its open descriptor. Another process may take the free device first
// (EBUSY), or still be unbinding it (ENXIO on open): then it asks again.
func floorAttach(img string) (string, int, error) {
	ffd, err := unix.Open(img, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open %s: %w", img, err)
	}
	defer unix.Close(ffd)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open /dev/loop-control: %w", err)
	}
	defer unix.Close(ctl)
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENXIO) && try < 100 {
			continue // being unbound by another process: ask again
		}
		if err != nil {
			return "", -1, fmt.Errorf("open %s: %w", dev, err)
		}
		// Direct I/O as the daemon attaches (its loopfile default): the
		// floor's writes, too, reach the image rather than its page cache.
		cfg := unix.LoopConfig{Fd: uint32(ffd)}
		cfg.Info.Flags = unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if errors.Is(err, unix.EINVAL) {
			cfg.Info.Flags = 0
			err = unix.IoctlLoopConfigure(fd, &cfg)
		}
		if err == nil {
			return dev, fd, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) || try == 100 {
			return "", -1, fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		}
	}
}

// floorDetach unbinds the loop device; the kernel finishes when its last
// descriptor, fd, closes.
func floorDetach(dev string, fd int) error {
	err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", dev, err)
	}
	return nil
}

// loopsUnder lists the loop devices whose backing file lies in dir; the
// teardown detaches them, so that an interrupted run leaks none.
func loopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if p := strings.TrimSpace(string(b)); strings.HasPrefix(p, dir+"/") {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return devs
}

// detachLoops detaches the loop devices whose backing file lies in dir.
func detachLoops(dir string) error {
	var errs []error
	for _, dev := range loopsUnder(dir) {
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("open %s: %w", dev, err))
			continue
		}
		if err := floorDetach(dev, fd); err != nil && !errors.Is(err, unix.ENXIO) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
