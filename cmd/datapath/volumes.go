package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// daemon is bin/wasmcsi serve and a client of it.
type daemon struct {
	cmd     *exec.Cmd
	dir     string
	conn    *grpc.ClientConn
	ctrl    csi.ControllerClient
	node    csi.NodeClient
	cleanup []func(context.Context) error // undo what was created, last first
	// cloneSize is the size of the volumes the clone measurements make.
	cloneSize int64
}

// startDaemon serves bin/wasmcsi with the embedded configuration in a
// folder of work: its relative paths (socket, records, pools) land there,
// on work's filesystem. The daemon dies with this process.
func startDaemon(ctx context.Context, repo, work, extraEnv string) (*daemon, error) {
	dir := filepath.Join(work, "wasmcsi")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CSI_ENDPOINT=") && !strings.HasPrefix(kv, "WASMCSI_") {
			env = append(env, kv)
		}
	}
	// The embedded configuration's one global name.
	env = append(env, fmt.Sprintf("WASMCSI_MODULES__DMTHIN__CONFIG__POOL=wasmcsi-thin-datapath-%d", os.Getpid()))
	if extraEnv != "" {
		env = append(env, strings.Split(extraEnv, ",")...)
	}
	log, err := os.Create(filepath.Join(dir, "wasmcsi.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(repo, "bin", "wasmcsi"), "serve", "--module_dir", filepath.Join(repo, "bin", "modules"))
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting bin/wasmcsi (make build first): %w", err)
	}
	d := &daemon{cmd: cmd, dir: dir}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	sock := filepath.Join(dir, "run", "csi.sock")
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		select {
		case <-exited:
			return d, fmt.Errorf("wasmcsi exited before serving:\n%s", tail(log.Name()))
		case <-ctx.Done():
			return d, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("wasmcsi did not serve %s within 2 minutes:\n%s", sock, tail(log.Name()))
		}
	}
	d.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return d, err
	}
	d.ctrl, d.node = csi.NewControllerClient(d.conn), csi.NewNodeClient(d.conn)
	return d, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// volume is one published volume and its floor, both ready for fio.
type volume struct {
	name  string
	file  string // what fio opens on the volume: the device node or a file in it
	floor string // what fio opens on the floor
	size  int64  // bytes fio uses on either
	note  string // the loop device's settings, where there is one
}

type volumeKind struct {
	name    string
	backend string
	block   bool
}

var volumeKinds = []volumeKind{
	{"loopfile-block", "loopfile", true},
	{"loopfile-mount", "loopfile", false},
	{"localdir-mount", "localdir", false},
}

// setup creates, stages and publishes one volume of each kind asked for,
// makes each floor, and writes both in full once.
func setup(ctx context.Context, d *daemon, cfg config) ([]volume, error) {
	floorDir := filepath.Join(d.dir, "run", "pools", "floor")
	if err := os.MkdirAll(floorDir, 0o750); err != nil {
		return nil, err
	}
	var vols []volume
	for _, k := range volumeKinds {
		if cfg.only != "" && !strings.Contains(","+cfg.only+",", ","+k.name+",") {
			continue
		}
		v, err := publish(ctx, d, k, cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.name, err)
		}
		// The floor lies on the pool's filesystem: for the loopfile block
		// volume it is what its file would be without the loop device; for
		// mount volumes a file as fio makes one on the volume's
		// filesystem (ext4 on both sides for loopfile here).
		v.floor = filepath.Join(floorDir, k.name+".img")
		for _, f := range []string{v.file, v.floor} {
			if err := fill(ctx, cfg.fioPath, f, v.size); err != nil {
				return nil, fmt.Errorf("%s: %w", k.name, err)
			}
		}
		vols = append(vols, v)
	}
	if len(vols) == 0 {
		return nil, fmt.Errorf("no volume kind matches -volumes %q", cfg.only)
	}
	return vols, nil
}

// publish takes one volume of kind k through CreateVolume, NodeStageVolume
// and NodePublishVolume and registers their undoing.
func publish(ctx context.Context, d *daemon, k volumeKind, cfg config) (volume, error) {
	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	vc := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}, AccessMode: mode}
	if k.block {
		vc = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: mode}
	} else if k.backend == "localdir" {
		vc = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}, AccessMode: mode}
	}
	resp, err := d.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               fmt.Sprintf("datapath-%s-%d", k.name, os.Getpid()),
		CapacityRange:      &csi.CapacityRange{RequiredBytes: cfg.volSize},
		VolumeCapabilities: []*csi.VolumeCapability{vc},
		Parameters:         map[string]string{"wasmcsi.dev/backend": k.backend},
	})
	if err != nil {
		return volume{}, fmt.Errorf("CreateVolume: %w", err)
	}
	id := resp.GetVolume().GetVolumeId()
	d.cleanup = append(d.cleanup, func(ctx context.Context) error {
		_, err := d.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	})
	staging := filepath.Join(d.dir, "staging", k.name)
	target := filepath.Join(d.dir, "publish", k.name)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return volume{}, err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return volume{}, err
	}
	if _, err := d.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: vc, VolumeContext: resp.GetVolume().GetVolumeContext()}); err != nil {
		return volume{}, fmt.Errorf("NodeStageVolume: %w", err)
	}
	d.cleanup = append(d.cleanup, func(ctx context.Context) error {
		_, err := d.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	})
	if _, err := d.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc, VolumeContext: resp.GetVolume().GetVolumeContext()}); err != nil {
		return volume{}, fmt.Errorf("NodePublishVolume: %w", err)
	}
	d.cleanup = append(d.cleanup, func(ctx context.Context) error {
		_, err := d.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		return err
	})
	v := volume{name: k.name, file: target, size: cfg.fileSize}
	if k.block {
		v.size = resp.GetVolume().GetCapacityBytes()
	} else {
		v.file = filepath.Join(target, "fio.img")
	}
	v.note = loopNote(target)
	return v, nil
}

// loopNote describes the loop device behind path (the device node itself
// or a folder on a filesystem on it) from sysfs, or "" when there is none.
func loopNote(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ""
	}
	dev := st.Dev
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		dev = st.Rdev
	}
	if unix.Major(dev) != 7 {
		return ""
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d/", unix.Major(dev), unix.Minor(dev))
	var parts []string
	for _, a := range []string{"loop/dio", "queue/logical_block_size", "queue/physical_block_size", "queue/nr_requests", "queue/read_ahead_kb", "queue/rotational", "queue/scheduler"} {
		b, err := os.ReadFile(sys + a)
		if err != nil {
			continue
		}
		parts = append(parts, filepath.Base(a)+"="+strings.TrimSpace(string(b)))
	}
	return fmt.Sprintf("loop%d: %s", unix.Minor(dev), strings.Join(parts, " "))
}

// fill writes size bytes of file once, sequentially and with O_DIRECT,
// creating it when it is missing.
func fill(ctx context.Context, fio, file string, size int64) error {
	out, err := exec.CommandContext(ctx, fio, "--name=fill", "--filename="+file, "--size="+strconv.FormatInt(size, 10),
		"--ioengine=libaio", "--direct=1", "--rw=write", "--bs=1M", "--iodepth=8", "--output-format=terse").CombinedOutput()
	if err != nil {
		return fmt.Errorf("fio writing %s: %w: %s", file, err, out)
	}
	return nil
}

// teardown undoes the publications, stagings and volumes, stops the
// daemon, unmounts whatever is still mounted below work (deepest first),
// detaches the loop devices of its files and removes it.
func teardown(work string, d *daemon) error {
	var errs []error
	if d != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		for i := len(d.cleanup) - 1; i >= 0; i-- {
			if err := d.cleanup[i](ctx); err != nil {
				errs = append(errs, err)
			}
		}
		cancel()
		if d.conn != nil {
			d.conn.Close()
		}
		if p := d.cmd.Process; p != nil {
			p.Signal(syscall.SIGTERM)
			for deadline := time.Now().Add(15 * time.Second); p.Signal(syscall.Signal(0)) == nil; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					p.Kill()
					break
				}
			}
		}
	}
	for _, m := range mountsUnder(work) {
		if err := unix.Unmount(m, 0); err != nil {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
			}
		}
	}
	if left := mountsUnder(work); len(left) > 0 {
		return errors.Join(append(errs, fmt.Errorf("teardown left mounts under %s: %v", work, left))...)
	}
	errs = append(errs, detachLoops(work))
	if err := os.RemoveAll(work); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var ms []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) < 5 {
			continue
		}
		// Octal escapes (\040 for a space) do not occur in the paths made here.
		if m := fs[4]; m == dir || strings.HasPrefix(m, dir+"/") {
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	return ms
}

// detachLoops detaches the loop devices whose backing file lies in dir,
// which an interrupted run may leave.
func detachLoops(dir string) error {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var errs []error
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("open %s: %w", dev, err))
			continue
		}
		if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
			errs = append(errs, fmt.Errorf("LOOP_CLR_FD %s: %w", dev, err))
		}
		unix.Close(fd)
	}
	return errors.Join(errs...)
}
