package dirpool

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// buildTree fills dir with one of every kind of entry Copy must keep.
func buildTree(t *testing.T, dir string) {
	t.Helper()
	asRoot := os.Geteuid() == 0
	must(t, os.MkdirAll(filepath.Join(dir, "sub", "deeper"), 0o755))
	writeFile(t, filepath.Join(dir, "plain"), "hello\n", 0o640)
	writeFile(t, filepath.Join(dir, "sub", "exec"), "#!/bin/sh\n", 0o755)
	writeFile(t, filepath.Join(dir, "sub", "deeper", "setuid"), "s", 0o4755)
	writeFile(t, filepath.Join(dir, "empty"), "", 0o600)
	writeFile(t, filepath.Join(dir, "big"), strings.Repeat("0123456789abcdef", 300<<10), 0o644)
	must(t, os.Link(filepath.Join(dir, "plain"), filepath.Join(dir, "sub", "hardlink")))
	must(t, os.Symlink("../plain", filepath.Join(dir, "sub", "rel-link")))
	must(t, os.Symlink("/nonexistent/target", filepath.Join(dir, "dangling")))
	must(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o620))

	sparse, err := os.OpenFile(filepath.Join(dir, "sparse"), os.O_RDWR|os.O_CREATE, 0o644)
	must(t, err)
	if _, err := sparse.WriteAt([]byte("tail"), 64<<20); err != nil {
		t.Fatal(err)
	}
	must(t, sparse.Close())

	if err := unix.Setxattr(filepath.Join(dir, "plain"), "user.origin", []byte("test"), 0); err != nil &&
		!errors.Is(err, unix.ENOTSUP) {
		t.Fatal(err)
	}
	must(t, os.Chmod(filepath.Join(dir, "sub"), 0o750))
	if asRoot {
		must(t, os.Lchown(filepath.Join(dir, "plain"), 1234, 5678))
		must(t, os.Lchown(filepath.Join(dir, "sub", "rel-link"), 4321, 8765))
		must(t, os.Chown(filepath.Join(dir, "sub"), 2000, 2001))
		must(t, os.Chmod(filepath.Join(dir, "sub", "deeper", "setuid"), 0o4755)) // chown cleared nothing yet
		must(t, unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	for _, rel := range []string{"plain", "sub/deeper", "sub", "."} {
		must(t, os.Chtimes(filepath.Join(dir, rel), old, old))
	}
	must(t, unix.Lutimes(filepath.Join(dir, "dangling"), []unix.Timeval{unix.NsecToTimeval(old.UnixNano()), unix.NsecToTimeval(old.UnixNano())}))
}

// compareTrees checks that dst is a faithful copy of src.
func compareTrees(t *testing.T, src, dst string) {
	t.Helper()
	asRoot := os.Geteuid() == 0
	srcLinks := map[uint64]string{}
	dstLinks := map[uint64]string{}
	n := 0
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		n++
		var s, d unix.Stat_t
		must(t, unix.Lstat(path, &s))
		if err := unix.Lstat(filepath.Join(dst, rel), &d); err != nil {
			t.Errorf("%s: missing in copy: %v", rel, err)
			return nil
		}
		if s.Mode != d.Mode {
			t.Errorf("%s: mode %o, want %o", rel, d.Mode, s.Mode)
		}
		if asRoot && (s.Uid != d.Uid || s.Gid != d.Gid) {
			t.Errorf("%s: owner %d:%d, want %d:%d", rel, d.Uid, d.Gid, s.Uid, s.Gid)
		}
		if s.Mode&unix.S_IFMT != unix.S_IFDIR && s.Size != d.Size {
			t.Errorf("%s: size %d, want %d", rel, d.Size, s.Size)
		}
		if s.Mtim != d.Mtim {
			t.Errorf("%s: mtime %v, want %v", rel, d.Mtim, s.Mtim)
		}
		if s.Rdev != d.Rdev {
			t.Errorf("%s: rdev %d, want %d", rel, d.Rdev, s.Rdev)
		}
		switch s.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			a, _ := os.Readlink(path)
			b, _ := os.Readlink(filepath.Join(dst, rel))
			if a != b {
				t.Errorf("%s: link target %q, want %q", rel, b, a)
			}
		case unix.S_IFREG:
			a, _ := os.ReadFile(path)
			b, _ := os.ReadFile(filepath.Join(dst, rel))
			if !bytes.Equal(a, b) {
				t.Errorf("%s: content differs", rel)
			}
			if s.Nlink > 1 {
				if first, ok := srcLinks[s.Ino]; ok {
					if dstLinks[d.Ino] != first {
						t.Errorf("%s: not a hard link of %s in the copy", rel, first)
					}
				} else {
					srcLinks[s.Ino], dstLinks[d.Ino] = rel, rel
				}
			}
			if d.Blocks > s.Blocks+64 {
				t.Errorf("%s: %d blocks in the copy, %d in the source (holes filled?)", rel, d.Blocks, s.Blocks)
			}
			if v, err := unix.Getxattr(path, "user.origin", make([]byte, 64)); err == nil {
				buf := make([]byte, 64)
				m, err := unix.Getxattr(filepath.Join(dst, rel), "user.origin", buf)
				if err != nil || m != v || string(buf[:m]) != "test" {
					t.Errorf("%s: xattr user.origin = %q, %v", rel, buf[:max(m, 0)], err)
				}
			}
		}
		return nil
	})
	must(t, err)
	if n < 10 {
		t.Fatalf("walked only %d entries of the source", n)
	}
}

func TestCopy(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	p := newPool(t, root)
	src, err := p.Create(ctx, "src", 0)
	must(t, err)
	buildTree(t, src)

	must(t, p.Copy(ctx, "src", "dst"))
	compareTrees(t, src, filepath.Join(root, "dst"))

	wantCode(t, "Copy onto an existing volume", p.Copy(ctx, "src", "dst"), abi.AlreadyExists)
	wantCode(t, "Copy of a missing volume", p.Copy(ctx, "missing", "x"), abi.NotFound)
	wantCode(t, "Copy onto itself", p.Copy(ctx, "src", "src"), abi.InvalidArgument)
	if p.Exists(ctx, "x") {
		t.Fatal("failed Copy created its target")
	}
}

// countdownCtx is cancelled after n calls of Err: a deterministic way to
// interrupt a copy half way.
type countdownCtx struct {
	context.Context
	n atomic.Int64
}

func (c *countdownCtx) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

func TestCopyCancelledRemovesPartial(t *testing.T) {
	p := newPool(t, t.TempDir())
	src, err := p.Create(context.Background(), "src", 0)
	must(t, err)
	for i := 0; i < 40; i++ {
		writeFile(t, filepath.Join(src, strings.Repeat("f", i+1)), "data", 0o644)
	}
	ctx := &countdownCtx{Context: context.Background()}
	ctx.n.Store(20)
	err = p.Copy(ctx, "src", "dst")
	wantCode(t, "cancelled Copy", err, abi.Canceled)
	if p.Exists(context.Background(), "dst") {
		t.Fatal("cancelled Copy left a partial copy")
	}
}

func TestCopyOutOfSpaceRemovesPartial(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	p := newPool(t, mounttest.Tmpfs(t, "size=4m"))
	src, err := p.Create(ctx, "src", 0)
	must(t, err)
	for _, name := range []string{"a", "b", "c"} {
		writeFile(t, filepath.Join(src, name), strings.Repeat("x", 900<<10), 0o644)
	}
	err = p.Copy(ctx, "src", "dst")
	wantCode(t, "Copy into a full filesystem", err, abi.ResourceExhausted)
	if p.Exists(ctx, "dst") {
		t.Fatal("failed Copy left a partial copy")
	}
	st, err := p.Statfs(ctx)
	must(t, err)
	if st.FreeBytes < 1<<20 {
		t.Fatalf("only %d bytes free after the failed copy: partial data left behind", st.FreeBytes)
	}
}
