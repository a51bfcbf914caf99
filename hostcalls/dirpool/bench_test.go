package dirpool

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// BenchmarkCopy measures one Copy of a volume (1,000 files of 16 KiB and
// four of 8 MiB) on a fresh ext4, made durable the way Copy does on ext4
// and xfs ("writeback": each file written back, one fsync of the pool) and
// the way it does elsewhere ("syncfs"), on a quiet filesystem and on one
// where another volume holds 256 MiB of unwritten data, which syncfs has
// to write too.
func BenchmarkCopy(b *testing.B) {
	mounttest.RequireRoot(b)
	root, err := mounttest.FS(b, "ext4", 2<<30, []string{"-q"}, "")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	p, err := Open(root)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if !p.ordered {
		b.Fatal("ext4 not taken for an ordered filesystem")
	}
	src, err := p.Create(ctx, "src", 0)
	if err != nil {
		b.Fatal(err)
	}
	small := []byte(strings.Repeat("0123456789abcdef", 1<<10))
	for i := range 1000 {
		if err := os.WriteFile(filepath.Join(src, strconv.Itoa(i)), small, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	big := []byte(strings.Repeat("x", 8<<20))
	for i := range 4 {
		if err := os.WriteFile(filepath.Join(src, "big"+strconv.Itoa(i)), big, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	other, err := p.Create(ctx, "other", 0)
	if err != nil {
		b.Fatal(err)
	}
	dirty := []byte(strings.Repeat("d", 256<<20))
	for _, mode := range []string{"writeback", "syncfs"} {
		for _, load := range []string{"quiet", "dirty"} {
			b.Run(mode+"/"+load, func(b *testing.B) {
				p.ordered = mode == "writeback"
				defer func() { p.ordered = true }()
				for b.Loop() {
					b.StopTimer()
					if err := p.Remove(ctx, "dst"); err != nil {
						b.Fatal(err)
					}
					os.Remove(filepath.Join(other, "data"))
					if err := unix.Syncfs(p.fd); err != nil {
						b.Fatal(err)
					}
					if load == "dirty" {
						if err := os.WriteFile(filepath.Join(other, "data"), dirty, 0o644); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					if err := p.Copy(ctx, "src", "dst"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkQuotaCommit measures what makes a quota change durable: the
// folder's attribute re-applied and the folder fsynced (commitQuota), and
// the syncfs it replaced, on a quiet filesystem and on one where another
// volume holds 256 MiB of unwritten data, on xfs and ext4. The quota itself
// is not set (the kernel may lack quota support); both commit the journal
// the same way with one.
func BenchmarkQuotaCommit(b *testing.B) {
	mounttest.RequireRoot(b)
	ctx := context.Background()
	dirty := []byte(strings.Repeat("d", 256<<20))
	for _, fstype := range []string{"xfs", "ext4"} {
		root, err := mounttest.FS(b, fstype, 2<<30, []string{"-q"}, "")
		if err != nil {
			b.Fatal(err)
		}
		p, err := Open(root)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		if _, err := p.Create(ctx, "vol", 0); err != nil {
			b.Fatal(err)
		}
		other, err := p.Create(ctx, "other", 0)
		if err != nil {
			b.Fatal(err)
		}
		fd, err := p.openVolume("vol")
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		for _, mode := range []string{"commit", "syncfs"} {
			for _, load := range []string{"quiet", "dirty"} {
				b.Run(fstype+"/"+mode+"/"+load, func(b *testing.B) {
					for b.Loop() {
						b.StopTimer()
						os.Remove(filepath.Join(other, "data"))
						if err := unix.Syncfs(p.fd); err != nil {
							b.Fatal(err)
						}
						if load == "dirty" {
							if err := os.WriteFile(filepath.Join(other, "data"), dirty, 0o644); err != nil {
								b.Fatal(err)
							}
						}
						b.StartTimer()
						if mode == "commit" {
							err = commitQuota(fd)
						} else {
							err = unix.Syncfs(p.fd)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
