package filepool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/scratch"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// A clone killed half way (the copy that keeps holes, where the pool has
// no reflinks: ext4, tmpfs) must leave nothing under its target's name nor
// anything else in the pool once it is opened again, with O_TMPFILE and
// with the named temporaries of filesystems without it. The clone runs in
// a child process (this test binary, re-executed) that SIGKILLs itself from
// inside the copy: its context kills the process at the n-th look at it,
// which the copy takes once per data segment.

const cloneChildEnv = "WASMCSI_FILEPOOL_CLONE_CHILD" // root|src|dst|n|named

// killingCtx SIGKILLs the process at the n-th call of Err.
type killingCtx struct {
	context.Context
	n atomic.Int64
}

func (c *killingCtx) Err() error {
	if c.n.Add(-1) == 0 {
		unix.Kill(os.Getpid(), unix.SIGKILL)
		select {} // the signal is on its way
	}
	return nil
}

// TestCloneChild is the child's side; it does nothing in a normal run.
func TestCloneChild(t *testing.T) {
	arg := os.Getenv(cloneChildEnv)
	if arg == "" {
		t.Skip("the child half of TestCloneKilled")
	}
	f := strings.Split(arg, "|")
	n, _ := strconv.Atoi(f[3])
	p, err := Open(f[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p.noTmpfile.Store(f[4] == "named")
	ctx := &killingCtx{Context: context.Background()}
	ctx.n.Store(int64(n))
	err = p.Clone(ctx, f[1], f[2])
	fmt.Fprintln(os.Stderr, "clone ended before the kill:", err)
	os.Exit(3)
}

func cloneKilled(t *testing.T, root, src, dst string, n int, named bool) {
	t.Helper()
	mode := map[bool]string{false: "tmpfile", true: "named"}[named]
	cmd := exec.Command(os.Args[0], "-test.run=^TestCloneChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), cloneChildEnv+"="+strings.Join([]string{root, src, dst, strconv.Itoa(n), mode}, "|"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die by SIGKILL (%v):\n%s", err, out)
	}
}

// entries lists dir; nil when it does not exist.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestCloneKilled(t *testing.T) {
	roots := map[string]func(t *testing.T) string{
		"tempdir": func(t *testing.T) string { return t.TempDir() },
		"tmpfs": func(t *testing.T) string {
			mounttest.RequireRoot(t)
			return mounttest.Tmpfs(t, "size=256m")
		},
	}
	for fsName, mkRoot := range roots {
		for _, named := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/named=%v", fsName, named), func(t *testing.T) {
				ctx := context.Background()
				root := mkRoot(t)
				p, err := Open(root)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				// 256 data segments of 4 KiB, 256 KiB apart: the copy
				// looks at its context once per segment at least.
				const size, step, segments = 64 << 20, 256 << 10, 256
				if err := p.Create(ctx, "src", size, false); err != nil {
					t.Fatal(err)
				}
				for i := range segments {
					writeFile(t, p, "src", int64(i)*step, bytes.Repeat([]byte{byte(i) | 1}, 4096))
				}
				syncPool(t, p)
				if err := reflinkProbe(p, "src"); !noReflink(err) {
					t.Skipf("the pool's filesystem may reflink (%v): this test is about the copy", err)
				}

				cloneKilled(t, root, "src", "dst", segments/2, named)

				if _, err := os.Lstat(filepath.Join(root, "dst")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("a killed clone left %s under the target's name (%v)", filepath.Join(root, "dst"), err)
				}
				left := entries(t, root)
				if named {
					if !slices.Equal(left, []string{scratch.Dir, "src"}) || len(entries(t, filepath.Join(root, scratch.Dir))) != 1 {
						t.Fatalf("pool after the kill holds %v (scratch: %v), want src and the abandoned temporary",
							left, entries(t, filepath.Join(root, scratch.Dir)))
					}
				} else if !slices.Equal(left, []string{"src"}) {
					t.Fatalf("pool after the kill holds %v, want only src", left)
				}

				retry, err := Open(root) // a restarted daemon's first call
				if err != nil {
					t.Fatal(err)
				}
				defer retry.Close()
				if left := entries(t, root); !slices.Equal(left, []string{"src"}) {
					t.Fatalf("pool after Open holds %v, want only src", left)
				}
				retry.noTmpfile.Store(named)
				// The backends' retry: clone, and a target already there
				// is the earlier attempt's.
				if err := retry.Clone(ctx, "src", "dst"); err != nil && abi.CodeOf(err) != abi.AlreadyExists {
					t.Fatal(err)
				}
				if !bytes.Equal(readFile(t, retry, "dst"), readFile(t, retry, "src")) {
					t.Fatal("the retried clone differs from its source")
				}
				if _, alloc, err := retry.Stat(ctx, "dst"); err != nil || alloc > 4<<20 {
					t.Fatalf("the retried clone allocates %d bytes (%v): holes filled", alloc, err)
				}
				if left := entries(t, root); !slices.Equal(left, []string{"dst", "src"}) {
					t.Fatalf("pool after the retry holds %v, want dst and src", left)
				}
			})
		}
	}
}

// reflinkProbe tries to reflink the pool's file name into a file beside
// the pool and returns FICLONE's answer.
func reflinkProbe(p *Pool, name string) error {
	in, err := p.openRegular(name, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.CreateTemp(p.Root(), ".probe-")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	return unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
}
