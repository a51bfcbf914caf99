package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// The node burst is what a node sees when it reboots or a StatefulSet
// scales: many volumes staged and published at once by many clients. n
// loopfile ext4 volumes, already formatted (clones of one formatted
// volume), are staged and published by c concurrent clients
// (NodeStageVolume, then NodePublishVolume); the time until the last one
// is published is set against the kernel operations the same work needs,
// issued by c goroutines through system calls on copies of the same
// formatted file: open the file, LOOP_CTL_GET_FREE and LOOP_CONFIGURE with
// direct I/O, mount ext4 on a staging folder, bind it to a target folder.
// Rounds alternate the two; each round then undoes what it set up, untimed.

const burstVolumeBytes = 64 << 20

var burstCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// burstVolumes creates n formatted loopfile volumes and n copies of the
// first one's file for the floor. It returns the volume IDs and the floor's
// files.
func burstVolumes(ctx context.Context, d *daemon, n int) (ids, floors []string, err error) {
	create := func(name string, src *csi.VolumeContentSource) (string, error) {
		resp, err := d.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name:                name,
			CapacityRange:       &csi.CapacityRange{RequiredBytes: burstVolumeBytes},
			VolumeCapabilities:  []*csi.VolumeCapability{burstCap},
			Parameters:          map[string]string{"wasmcsi.dev/backend": "loopfile"},
			VolumeContentSource: src,
		})
		if err != nil {
			return "", fmt.Errorf("CreateVolume %s: %w", name, err)
		}
		id := resp.GetVolume().GetVolumeId()
		d.cleanup = append(d.cleanup, func(ctx context.Context) error {
			_, err := d.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		})
		return id, nil
	}
	pool := filepath.Join(d.dir, "run", "pools", "loopfile")
	before, _ := filepath.Glob(filepath.Join(pool, "*"))
	first, err := create(fmt.Sprintf("burst-%d-0", os.Getpid()), nil)
	if err != nil {
		return nil, nil, err
	}
	after, _ := filepath.Glob(filepath.Join(pool, "*"))
	img := newFile(before, after)
	if img == "" {
		return nil, nil, fmt.Errorf("CreateVolume %s made no file in %s", first, pool)
	}
	// Format it: one stage and unstage.
	staging := filepath.Join(d.dir, "burst", "format")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, nil, err
	}
	if _, err := d.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: first, StagingTargetPath: staging, VolumeCapability: burstCap}); err != nil {
		return nil, nil, fmt.Errorf("NodeStageVolume: %w", err)
	}
	if _, err := d.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: first, StagingTargetPath: staging}); err != nil {
		return nil, nil, fmt.Errorf("NodeUnstageVolume: %w", err)
	}
	ids = []string{first}
	src := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: first}}}
	for i := 1; i < n; i++ {
		id, err := create(fmt.Sprintf("burst-%d-%d", os.Getpid(), i), src)
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
	}
	floorDir := filepath.Join(d.dir, "run", "pools", "floor", "burst")
	if err := os.MkdirAll(floorDir, 0o750); err != nil {
		return nil, nil, err
	}
	for i := 0; i < n; i++ {
		f := filepath.Join(floorDir, fmt.Sprintf("%d.img", i))
		if err := copyFile(f, img); err != nil {
			return nil, nil, err
		}
		floors = append(floors, f)
	}
	return ids, floors, nil
}

func newFile(before, after []string) string {
	seen := map[string]bool{}
	for _, f := range before {
		seen[f] = true
	}
	for _, f := range after {
		if !seen[f] {
			return f
		}
	}
	return ""
}

// copyFile copies src to dst, holes kept where the kernel keeps them
// (copy_file_range).
func copyFile(dst, src string) error {
	s, err := os.Open(src)
	if err != nil {
		return err
	}
	defer s.Close()
	t, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(t, s)
	return errors.Join(err, t.Close())
}

// parallel runs f(i) for i in [0, n) from c goroutines and returns the
// time until the last one returned, and the first error.
func parallel(n, c int, f func(i int) error) (time.Duration, error) {
	next := make(chan int, n)
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	errs := make([]error, c)
	start := time.Now()
	for g := 0; g < c; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil && errs[g] == nil {
					errs[g] = err
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// burstDaemon stages and publishes every volume from c clients, and then,
// untimed, unpublishes and unstages them.
func burstDaemon(ctx context.Context, d *daemon, ids []string, c int) (time.Duration, error) {
	base := filepath.Join(d.dir, "burst")
	for i := range ids {
		if err := os.MkdirAll(filepath.Join(base, "staging", fmt.Sprint(i)), 0o750); err != nil {
			return 0, err
		}
	}
	took, err := parallel(len(ids), c, func(i int) error {
		staging := filepath.Join(base, "staging", fmt.Sprint(i))
		if _, err := d.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: ids[i], StagingTargetPath: staging, VolumeCapability: burstCap}); err != nil {
			return fmt.Errorf("NodeStageVolume %s: %w", ids[i], err)
		}
		_, err := d.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: ids[i], StagingTargetPath: staging, TargetPath: filepath.Join(base, "target", fmt.Sprint(i)), VolumeCapability: burstCap})
		if err != nil {
			return fmt.Errorf("NodePublishVolume %s: %w", ids[i], err)
		}
		return nil
	})
	_, uerr := parallel(len(ids), c, func(i int) error {
		staging := filepath.Join(base, "staging", fmt.Sprint(i))
		if _, err := d.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: ids[i], TargetPath: filepath.Join(base, "target", fmt.Sprint(i))}); err != nil {
			return fmt.Errorf("NodeUnpublishVolume %s: %w", ids[i], err)
		}
		if _, err := d.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: ids[i], StagingTargetPath: staging}); err != nil {
			return fmt.Errorf("NodeUnstageVolume %s: %w", ids[i], err)
		}
		return nil
	})
	return took, errors.Join(err, uerr)
}

// burstFloor does what staging and publishing the floor's files cannot
// do without, from c goroutines, and then undoes it, untimed.
func burstFloor(dir string, files []string, c int) (time.Duration, error) {
	type setUp struct {
		dev             string
		fd              int
		staging, target string
	}
	done := make([]setUp, len(files))
	took, err := parallel(len(files), c, func(i int) error {
		s := setUp{fd: -1, staging: filepath.Join(dir, "staging", fmt.Sprint(i)), target: filepath.Join(dir, "target", fmt.Sprint(i))}
		if err := os.MkdirAll(s.staging, 0o750); err != nil {
			return err
		}
		if err := os.MkdirAll(s.target, 0o750); err != nil {
			return err
		}
		dev, fd, err := floorAttach(files[i])
		if err != nil {
			return err
		}
		s.dev, s.fd = dev, fd
		done[i] = s
		if err := unix.Mount(dev, s.staging, "ext4", 0, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", dev, s.staging, err)
		}
		if err := unix.Mount(s.staging, s.target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", s.staging, s.target, err)
		}
		return nil
	})
	var errs []error
	for _, s := range done {
		if s.fd < 0 || s.dev == "" {
			continue
		}
		for _, m := range []string{s.target, s.staging} {
			if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
		if err := unix.IoctlSetInt(s.fd, unix.LOOP_CLR_FD, 0); err != nil {
			errs = append(errs, fmt.Errorf("LOOP_CLR_FD %s: %w", s.dev, err))
		}
		unix.Close(s.fd)
	}
	return took, errors.Join(append(errs, err)...)
}

// floorAttach binds file to a free loop device with direct I/O, as the
// daemon attaches, and returns the device and its open descriptor.
// Another attacher may take the free device first (EBUSY), or still be
// unbinding it (ENXIO on open): then it asks again.
func floorAttach(file string) (string, int, error) {
	ffd, err := unix.Open(file, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open %s: %w", file, err)
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
		if errors.Is(err, unix.ENXIO) && try < 1000 {
			continue
		}
		if err != nil {
			return "", -1, fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(ffd)}
		cfg.Info.Flags = unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err == nil {
			return dev, fd, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) || try >= 1000 {
			return "", -1, fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		}
	}
}
