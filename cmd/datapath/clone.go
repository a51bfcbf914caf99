package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// Snapshots, clones and restores of a loopfile volume with 10% and 100%
// of its blocks written, timed per GiB of volume against their floor on
// the pool's filesystem: FICLONE of the volume's file where the pool has
// reflinks, a copy of its data (copy_file_range) where not, then fsync of
// the copy, as the daemon makes every new file durable before it answers.

type cloneOp struct {
	name string
	do   func(ctx context.Context, d *daemon, vol, snap string, n int) (string, bool, error) // new ID; whether it is a snapshot
}

var cloneOps = []cloneOp{
	{"CreateSnapshot", func(ctx context.Context, d *daemon, vol, _ string, n int) (string, bool, error) {
		resp, err := d.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: vol, Name: fmt.Sprintf("dp-snap-%d-%d", os.Getpid(), n)})
		return resp.GetSnapshot().GetSnapshotId(), true, err
	}},
	{"clone (CreateVolume from a volume)", func(ctx context.Context, d *daemon, vol, _ string, n int) (string, bool, error) {
		return createFrom(ctx, d, n, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol}}})
	}},
	{"restore (CreateVolume from a snapshot)", func(ctx context.Context, d *daemon, _, snap string, n int) (string, bool, error) {
		return createFrom(ctx, d, n, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}})
	}},
}

var blockCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func createFrom(ctx context.Context, d *daemon, n int, src *csi.VolumeContentSource) (string, bool, error) {
	resp, err := d.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:                fmt.Sprintf("dp-copy-%d-%d", os.Getpid(), n),
		CapacityRange:       &csi.CapacityRange{RequiredBytes: d.cloneSize},
		VolumeCapabilities:  []*csi.VolumeCapability{blockCap},
		Parameters:          map[string]string{"wasmcsi.dev/backend": "loopfile"},
		VolumeContentSource: src,
	})
	return resp.GetVolume().GetVolumeId(), false, err
}

// runClones times every operation on a volume of cfg.volSize bytes with
// each written share, against the floor, round by round.
func runClones(ctx context.Context, d *daemon, cfg config) error {
	d.cloneSize = cfg.volSize
	pool := filepath.Join(d.dir, "run", "pools", "loopfile")
	floorDir := filepath.Join(d.dir, "run", "pools", "floor")
	if err := os.MkdirAll(floorDir, 0o750); err != nil {
		return err
	}
	fmt.Printf("\ndatapath: snapshots, clones and restores of a %d MiB loopfile volume (pool: %s); load average %s\n", cfg.volSize>>20, fsName(pool), loadavg())
	fmt.Println("| volume written | operation | floor | wasmcsi | ratio |")
	fmt.Println("| --- | --- | --- | --- | --- |")
	n := 0
	for _, share := range []int{10, 100} {
		before, _ := filepath.Glob(filepath.Join(pool, "*"))
		id, _, err := createFrom(ctx, d, n, nil)
		n++
		if err != nil {
			return fmt.Errorf("CreateVolume: %w", err)
		}
		d.cleanup = append(d.cleanup, deleter(d, id, false))
		after, _ := filepath.Glob(filepath.Join(pool, "*"))
		file := newFile(before, after)
		if file == "" {
			return fmt.Errorf("CreateVolume %s made no file in %s", id, pool)
		}
		// Written as a workload would write it: share% of its 1 MiB
		// blocks, spread over the volume.
		if err := writeShare(file, cfg.volSize, share); err != nil {
			return err
		}
		snap, _, err := cloneOps[0].do(ctx, d, id, "", n)
		n++
		if err != nil {
			return fmt.Errorf("CreateSnapshot: %w", err)
		}
		d.cleanup = append(d.cleanup, deleter(d, snap, true))
		gib := float64(cfg.volSize) / (1 << 30)
		for _, op := range cloneOps {
			var ws, fs, rs []float64
			for r := 0; r < cfg.rounds; r++ {
				start := time.Now()
				newID, isSnap, err := op.do(ctx, d, id, snap, n)
				n++
				w := time.Since(start)
				if err != nil {
					return fmt.Errorf("%s: %w", op.name, err)
				}
				if err := deleter(d, newID, isSnap)(ctx); err != nil {
					return err
				}
				f, err := floorCopy(file, floorDir)
				if err != nil {
					return err
				}
				ws, fs, rs = append(ws, w.Seconds()*1e3/gib), append(fs, f.Seconds()*1e3/gib), append(rs, ratio(w.Seconds(), f.Seconds()))
			}
			wlo, whi := minmax(ws)
			flo, fhi := minmax(fs)
			fmt.Printf("| %d%% | %s | %.0f ms/GiB (%.0f–%.0f) | %.0f ms/GiB (%.0f–%.0f) | %s |\n", share, op.name, median(fs), flo, fhi, median(ws), wlo, whi, ratioRange(rs))
		}
	}
	return nil
}

func deleter(d *daemon, id string, snap bool) func(context.Context) error {
	return func(ctx context.Context) error {
		var err error
		if snap {
			_, err = d.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
		} else {
			_, err = d.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		}
		return err
	}
}

// writeShare writes share% of file's 1 MiB blocks, evenly spread, and
// syncs it.
func writeShare(file string, size int64, share int) error {
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	blocks := size >> 20
	for b := int64(0); b < blocks; b++ {
		if b*int64(share)/100 != (b+1)*int64(share)/100 {
			if _, err := f.WriteAt(buf, b<<20); err != nil {
				f.Close()
				return err
			}
		}
	}
	return errors.Join(f.Sync(), f.Close())
}

// floorCopy makes a copy of src in dir as the pool's filesystem allows
// fastest (FICLONE, or its data copied with copy_file_range, holes kept),
// fsyncs it, times that and removes it.
func floorCopy(src, dir string) (time.Duration, error) {
	s, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	dst := filepath.Join(dir, "copy.img")
	start := time.Now()
	t, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer os.Remove(dst)
	if err := unix.IoctlFileClone(int(t.Fd()), int(s.Fd())); err != nil {
		if err := copyData(t, s); err != nil {
			t.Close()
			return 0, err
		}
	}
	err = errors.Join(t.Sync(), t.Close())
	return time.Since(start), err
}

// copyData copies src's data segments to dst and gives dst src's size.
func copyData(dst, src *os.File) error {
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for r, w := data, data; r < hole; {
			n, err := unix.CopyFileRange(int(src.Fd()), &r, int(dst.Fd()), &w, int(hole-r), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
		}
		off = hole
	}
	return dst.Truncate(size)
}
