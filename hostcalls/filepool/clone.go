package filepool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// copyChunk bounds one copy_file_range call, so that a canceled context
// stops a large copy soon.
const copyChunk = 64 << 20

// Clone makes dst a copy of src. Where the pool's filesystem supports
// reflinks (xfs with reflink=1, btrfs) the copy shares src's extents
// (FICLONE) and takes no space until either file is written; elsewhere it
// copies only src's data segments (SEEK_DATA/SEEK_HOLE + copy_file_range),
// so holes stay holes. dst appears only when complete; an existing dst is
// abi.AlreadyExists and is never replaced.
func (p *Pool) Clone(ctx context.Context, src, dst string) error {
	if err := checkName(src); err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	if err := checkName(dst); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	if src == dst {
		return fmt.Errorf("clone %s: %w", src, abi.Errorf(abi.InvalidArgument, "source and destination are the same"))
	}
	in, err := p.openRegular(src, unix.O_RDONLY)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer in.Close()
	// Fail before copying gigabytes; the link at the end still decides.
	if f, err := p.openBeneath(dst, unix.O_PATH, 0); err == nil {
		f.Close()
		return fmt.Errorf("clone %s to %s: %w", src, dst, abi.Errorf(abi.AlreadyExists, "exists"))
	}
	if err := p.build(ctx, dst, false, func(tmp *os.File) error { return cloneInto(ctx, tmp, in) }); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			// The copy ran out of room: the CO's RESOURCE_EXHAUSTED.
			err = &abi.Error{Code: abi.ResourceExhausted, Message: err.Error()}
		}
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}

// cloneInto makes the empty file dst a copy of src, by reflink if it can.
func cloneInto(ctx context.Context, dst, src *os.File) error {
	err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
	if err == nil {
		return nil
	}
	if !noReflink(err) {
		return fmt.Errorf("FICLONE: %w", err)
	}
	return sparseCopy(ctx, dst, src)
}

// noReflink reports the errors of a filesystem (or pair of files) that
// cannot share extents.
func noReflink(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EXDEV) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)
}

// sparseCopy copies src's data segments into the empty file dst, sized like
// src, so that src's holes stay holes in dst.
func sparseCopy(ctx context.Context, dst, src *os.File) error {
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if err := dst.Truncate(size); err != nil {
		return err
	}
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole up to the end
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE: %w", err)
		}
		if err := copyRange(ctx, dst, src, data, min(hole, size)-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies [off, off+n) of src to the same offsets of dst, in the
// kernel where it can (copy_file_range), else through a buffer.
func copyRange(ctx context.Context, dst, src *os.File, off, n int64) error {
	rOff, wOff, end := off, off, off+n
	for rOff < end {
		if err := ctx.Err(); err != nil {
			return err
		}
		got, err := unix.CopyFileRange(int(src.Fd()), &rOff, int(dst.Fd()), &wOff, int(min(end-rOff, copyChunk)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) ||
				errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
				return bufferedCopy(ctx, dst, src, rOff, end-rOff)
			}
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if got == 0 {
			return nil // src shrank under us
		}
	}
	return nil
}

func bufferedCopy(ctx context.Context, dst, src *os.File, off, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		got, err := src.ReadAt(buf[:min(n, int64(len(buf)))], off)
		if got > 0 {
			if _, werr := dst.WriteAt(buf[:got], off); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		off += int64(got)
		n -= int64(got)
	}
	return nil
}
