package quiesce

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// Every test here freezes real ext4 filesystems on loop devices; a
// cleanup thaws them before they are unmounted, also when a test fails.

// holdEnv makes the test binary a process that pauses one filesystem and
// then waits to be killed: the daemon whose death the guardian must notice.
const holdEnv = "QUIESCE_TEST_HOLD"

func TestMain(m *testing.M) {
	Main()
	if spec := os.Getenv(holdEnv); spec != "" {
		os.Exit(holdUntilKilled(spec))
	}
	os.Exit(m.Run())
}

// holdUntilKilled pauses the filesystem of spec ("<path> <dev> <timeout>"),
// says "paused", and never releases it.
func holdUntilKilled(spec string) int {
	f := strings.Fields(spec)
	dev, _ := strconv.ParseUint(f[1], 10, 64)
	timeout, _ := time.ParseDuration(f[2])
	h, err := Pause(context.Background(), []Target{{Kind: Filesystem, Path: f[0], Dev: dev, Volume: "held"}}, timeout, slog.Default())
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	_ = h
	fmt.Println("paused")
	select {}
}

// volume is a mounted ext4 filesystem on a loop device, thawed and
// unmounted when the test ends.
type volume struct {
	dir string
	dev uint64
}

func newVolume(t *testing.T) volume {
	t.Helper()
	looptest.Require(t)
	loopDev, _ := looptest.Device(t, 16<<20)
	if err := fs.Make(context.Background(), loopDev, fs.Ext4, fs.MakeOptions{}); err != nil {
		t.Skipf("mkfs.ext4: %v", err)
	}
	dir := t.TempDir()
	if err := unix.Mount(loopDev, dir, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A guardian of another process may still be closing the
		// folder it thawed through.
		err := unix.Unmount(dir, 0)
		for i := 0; err == unix.EBUSY && i < 50; i++ {
			time.Sleep(100 * time.Millisecond)
			err = unix.Unmount(dir, 0)
		}
		if err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	dev, err := fs.DeviceOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Thaw(dir, dev) }) // runs before the unmount
	return volume{dir: dir, dev: dev}
}

func (v volume) target(name string) Target {
	return Target{Kind: Filesystem, Path: v.dir, Dev: v.dev, Volume: name}
}

// write starts a write to the volume and returns its result channel.
func (v volume) write(name string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(v.dir, name), []byte(name), 0o644) }()
	return done
}

func wantBlocked(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned (%v) while its filesystem should be frozen", what, err)
	case <-time.After(200 * time.Millisecond):
	}
}

func wantDone(t *testing.T, done <-chan error, within time.Duration, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(within):
		t.Fatalf("%s still blocked after %s", what, within)
	}
}

func TestPauseAndRelease(t *testing.T) {
	a, b := newVolume(t), newVolume(t)
	h, err := Pause(context.Background(), []Target{a.target("a"), b.target("b")}, time.Minute, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	wa, wb := a.write("a"), b.write("b")
	wantBlocked(t, wa, "write to a")
	wantBlocked(t, wb, "write to b")
	if err := h.Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	wantDone(t, wa, 5*time.Second, "write to a")
	wantDone(t, wb, 5*time.Second, "write to b")
	h.Thaw() // idempotent
}

// The deadline thaws while the holder is still busy, and Release then
// says the group cannot be trusted.
func TestDeadlineThaws(t *testing.T) {
	a := newVolume(t)
	start := time.Now()
	h, err := Pause(context.Background(), []Target{a.target("a")}, 300*time.Millisecond, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	wa := a.write("a")
	wantDone(t, wa, 5*time.Second, "write to a")
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("the write went through after %s, before the deadline", d)
	}
	if err := h.Release(); abi.CodeOf(err) != abi.DeadlineExceeded {
		t.Fatalf("release after the deadline = %v, want DEADLINE_EXCEEDED", err)
	}
}

// A thaw behind the hold's back (an operator's fsfreeze -u) makes Release
// fail: the snapshots cut meanwhile may not share one point.
func TestReleaseNoticesForeignThaw(t *testing.T) {
	a, b := newVolume(t), newVolume(t)
	h, err := Pause(context.Background(), []Target{a.target("a"), b.target("b")}, time.Minute, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if was, err := fs.Thaw(b.dir, b.dev); err != nil || !was {
		t.Fatalf("thaw b behind the hold's back: %v, %v", was, err)
	}
	if err := h.Release(); abi.CodeOf(err) != abi.Aborted {
		t.Fatalf("release = %v, want ABORTED", err)
	}
	wantDone(t, a.write("a"), 5*time.Second, "write to a")
}

// A target that cannot be paused fails Pause, and the targets paused
// before it are resumed.
func TestPauseFailureResumesTheOthers(t *testing.T) {
	a, b := newVolume(t), newVolume(t)
	if err := fs.Freeze(b.dir, b.dev); err != nil { // someone else's freeze
		t.Fatal(err)
	}
	_, err := Pause(context.Background(), []Target{a.target("a"), b.target("b")}, time.Minute, slog.Default())
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("pause with b frozen by someone else = %v, want FAILED_PRECONDITION", err)
	}
	wantDone(t, a.write("a"), 5*time.Second, "write to a")
	wb := b.write("b")
	wantBlocked(t, wb, "write to b") // still someone else's freeze: not ours to end
	fs.Thaw(b.dir, b.dev)
	wantDone(t, wb, 5*time.Second, "write to b")
}

func TestPauseNeedsMain(t *testing.T) {
	hooked.Store(false)
	defer hooked.Store(true)
	a := newVolume(t)
	if _, err := Pause(context.Background(), []Target{a.target("a")}, time.Minute, slog.Default()); err != ErrNoGuardian {
		t.Fatalf("pause in a program without Main = %v, want ErrNoGuardian", err)
	}
	wantDone(t, a.write("a"), 5*time.Second, "write to a")
}

// startHolder runs a process that pauses v and never lets go.
func startHolder(t *testing.T, v volume, timeout time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s", holdEnv, v.dir, v.dev, timeout))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "paused\n" {
		t.Fatalf("holder: %q, %v", line, err)
	}
	go io.Copy(io.Discard, out)
	return cmd
}

// The guardian resumes the writes when the process that paused them is
// killed outright.
func TestGuardianResumesWhenHolderDies(t *testing.T) {
	a := newVolume(t)
	holder := startHolder(t, a, time.Hour)
	wa := a.write("a")
	wantBlocked(t, wa, "write to a")
	start := time.Now()
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wantDone(t, wa, 5*time.Second, "write to a after the holder died")
	t.Logf("writes resumed %s after SIGKILL of the holder", time.Since(start).Round(time.Millisecond))
}

// A holder that hangs (stopped, so even its own deadline timer cannot run)
// is outlived by the guardian's timer: deadline plus grace.
func TestGuardianResumesWhenHolderHangs(t *testing.T) {
	a := newVolume(t)
	holder := startHolder(t, a, 200*time.Millisecond)
	if err := holder.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wa := a.write("a")
	wantDone(t, wa, 200*time.Millisecond+guardGrace+5*time.Second, "write to a while the holder hangs")
	t.Logf("writes resumed %s after the holder stopped", time.Since(start).Round(time.Millisecond))
	holder.Process.Signal(syscall.SIGKILL)
	holder.Process.Signal(syscall.SIGCONT)
}

// Recover resumes what a journal lists when the daemon and its guardian
// both died, once.
func TestJournalRecover(t *testing.T) {
	a, b := newVolume(t), newVolume(t)
	j, err := OpenJournals(t.TempDir(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	rec := Journal{Group: "g1", Sources: []string{"x:a", "x:b"}, Targets: []Target{a.target("a"), b.target("b")}}
	if err := j.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := j.Write(Journal{Group: "idle group", Sources: []string{"x:c"}}); err != nil {
		t.Fatal(err)
	}
	if err := fs.Freeze(a.dir, a.dev); err != nil { // b was never reached
		t.Fatal(err)
	}
	wa := a.write("a")
	wantBlocked(t, wa, "write to a")
	n, err := j.Recover(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("recover = %d, %v; want 1 resumed", n, err)
	}
	wantDone(t, wa, 5*time.Second, "write to a after recovery")
	got, ok, err := j.Read("g1")
	if err != nil || !ok || len(got.Targets) != 0 || len(got.Sources) != 2 {
		t.Fatalf("journal after recovery: %+v, %v, %v; want its sources and no targets", got, ok, err)
	}
	if n, err := j.Recover(context.Background()); err != nil || n != 0 {
		t.Fatalf("second recover = %d, %v", n, err)
	}
	if err := j.Remove("g1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := j.Read("g1"); ok || err != nil {
		t.Fatalf("read after remove: %v, %v", ok, err)
	}
	if err := j.Remove("g1"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

// The guardian stands down on "release", and resumes the targets when the
// daemon closes the pipe without it (its own resume failed).
func TestGuardianRelease(t *testing.T) {
	a := newVolume(t)
	for _, resumed := range []bool{true, false} {
		if err := fs.Freeze(a.dir, a.dev); err != nil {
			t.Fatal(err)
		}
		g, err := startGuardian([]Target{a.target("a")}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		g.release(resumed)
		wa := a.write("a")
		if resumed {
			wantBlocked(t, wa, "write to a after the guardian stood down")
			fs.Thaw(a.dir, a.dev)
		}
		wantDone(t, wa, 5*time.Second, "write to a")
		<-g.exited
	}
}
