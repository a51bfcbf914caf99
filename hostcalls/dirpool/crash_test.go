package dirpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// A copy killed half way must leave nothing under its target's name, and
// the next Open or Copy must clear what it left. The copy runs in a child
// process (this test binary, re-executed) that SIGKILLs itself from inside
// the copy: its context kills the process at the n-th look at it, which
// the copy takes once per entry and per chunk of data.

const (
	copyChildEnv = "WASMCSI_DIRPOOL_COPY_CHILD" // root|src|dst|n
)

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

// TestCopyChild is the child's side; it does nothing in a normal run.
func TestCopyChild(t *testing.T) {
	arg := os.Getenv(copyChildEnv)
	if arg == "" {
		t.Skip("the child half of TestCopyKilled")
	}
	f := strings.Split(arg, "|")
	n, _ := strconv.Atoi(f[3])
	p, err := Open(f[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := &killingCtx{Context: context.Background()}
	ctx.n.Store(int64(n))
	err = p.Copy(ctx, f[1], f[2])
	fmt.Fprintln(os.Stderr, "copy ended before the kill:", err)
	os.Exit(3)
}

// copyKilled runs Copy(src, dst) of the pool at root in a child process
// that dies by SIGKILL at the n-th context check.
func copyKilled(t *testing.T, root, src, dst string, n int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCopyChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), copyChildEnv+"="+strings.Join([]string{root, src, dst, strconv.Itoa(n)}, "|"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die by SIGKILL (%v):\n%s", err, out)
	}
}

// scratchEntries lists the pool's scratch folder; nil when there is none.
func scratchEntries(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, scratch.Dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	must(t, err)
	names := []string{}
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestCopyKilled kills a copy half way, on a filesystem with an ordered
// journal (ext4 with one: write-back per file), on tmpfs (syncfs) and in
// the test's temporary folder (either, by its filesystem), and
// retries it the way a backend does after a crash: "copy unless the
// target exists". The retry must produce a whole copy, whether it runs
// through a pool opened afresh (a restarted daemon) or the pool that was
// open before (a long-running one), and no temporary may stay behind.
func TestCopyKilled(t *testing.T) {
	roots := map[string]func(t *testing.T) string{
		"tempdir": func(t *testing.T) string { return t.TempDir() },
		"tmpfs": func(t *testing.T) string {
			mounttest.RequireRoot(t)
			return mounttest.Tmpfs(t, "size=512m")
		},
		"ext4": func(t *testing.T) string { return freshFS(t, 256<<20, "ext4", "mkfs.ext4", "-q", "-F") },
	}
	for name, mkRoot := range roots {
		for _, reopen := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/reopen=%v", name, reopen), func(t *testing.T) {
				ctx := context.Background()
				root := mkRoot(t)
				p := newPool(t, root)
				if name == "ext4" && !p.ordered {
					t.Fatal("a pool on a journaled ext4 is not ordered: this case would not test write-back")
				}
				src, err := p.Create(ctx, "src", 0)
				must(t, err)
				buildTree(t, src)
				must(t, os.Mkdir(filepath.Join(src, "many"), 0o755))
				for i := range 400 {
					writeFile(t, filepath.Join(src, "many", strconv.Itoa(i)), strings.Repeat(strconv.Itoa(i), 4000), 0o644)
				}

				copyKilled(t, root, "src", "dst", 200)

				if _, err := os.Lstat(filepath.Join(root, "dst")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("a killed copy left %s under the target's name (%v)", filepath.Join(root, "dst"), err)
				}
				if p.Exists(ctx, "dst") {
					t.Fatal("Exists sees the target of a killed copy")
				}
				if left := scratchEntries(t, root); len(left) != 1 {
					t.Fatalf("scratch folder after the kill holds %v, want the one abandoned copy", left)
				}
				retry := p
				if reopen {
					retry = newPool(t, root)
					if left := scratchEntries(t, root); left != nil {
						t.Fatalf("Open left the abandoned copy: %v", left)
					}
				}
				if !retry.Exists(ctx, "dst") {
					must(t, retry.Copy(ctx, "src", "dst"))
				}
				compareTrees(t, src, filepath.Join(root, "dst"))
				if left := scratchEntries(t, root); left != nil {
					t.Fatalf("scratch folder after the retried copy: %v", left)
				}
			})
		}
	}
}

// TestSweepSparesLiveCopies: a sweep removes temporaries nobody holds and
// leaves one that a live copy (here: another open file description of
// this process, as good as another process) holds locked.
func TestSweepSparesLiveCopies(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	p := newPool(t, root)
	live, err := scratch.Create(p.fd, func(dir int, name string) (int, error) {
		if err := unix.Mkdirat(dir, name, 0o700); err != nil {
			return -1, err
		}
		return openBeneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	})
	must(t, err)
	writeFile(t, filepath.Join(root, scratch.Dir, live.Name, "data"), "in progress", 0o600)
	dead := filepath.Join(root, scratch.Dir, "0123abcd")
	must(t, os.MkdirAll(filepath.Join(dead, "sub"), 0o700))
	writeFile(t, filepath.Join(dead, "sub", "half"), "abandoned", 0o600)

	newPool(t, root) // a daemon starting while another one copies
	if got := scratchEntries(t, root); len(got) != 1 || got[0] != live.Name {
		t.Fatalf("scratch folder after Open: %v, want only the live copy %s", got, live.Name)
	}
	if n, err := p.Sweep(ctx); n != 0 || err != nil {
		t.Fatalf("Sweep = %d, %v; want nothing to remove", n, err)
	}
	// The folder is the pool's: no caller can name it.
	wantCode(t, "Remove of the scratch folder", p.Remove(ctx, scratch.Dir), abi.InvalidArgument)
	if p.Exists(ctx, scratch.Dir) {
		t.Fatal("Exists answers for the scratch folder")
	}
	must(t, removeTree(ctx, live.Dir, live.Name))
	live.Close()
	if got := scratchEntries(t, root); got != nil {
		t.Fatalf("scratch folder stays after its last temporary: %v", got)
	}
}
