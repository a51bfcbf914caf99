package quiesce

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// The guardian is this same program, started again with guardianEnv set:
// a process per hold (holds are rare: one per group snapshot with members
// in use). It reads its plan from stdin, answers "ready", and then waits
// for one line. "release" means the daemon resumes the targets itself; end
// of file means the daemon died (the kernel closes its end of the pipe, so
// nothing the daemon does or fails to do can keep it open); so does a
// silence past the plan's timeout (a daemon that hangs). On either it
// resumes every target. It runs in a process group of its own, so a signal
// to the daemon's group does not take it along, and a SIGTERM, SIGINT or
// SIGHUP makes it resume the targets before it exits.

const guardianEnv = "WASMCSI_QUIESCE_GUARDIAN"

// readyTimeout bounds the guardian's start.
const readyTimeout = 10 * time.Second

// hooked records that this program's main called Main, so that starting
// /proc/self/exe as a guardian runs the guardian and not a second daemon.
var hooked atomic.Bool

// Main runs the quiesce guardian and exits when this process was started
// as one, and returns at once otherwise. Every program that pauses writes
// through this package (the daemon, and test binaries that run it) calls
// Main first thing in main (or TestMain); without it Pause refuses.
func Main() {
	if os.Getenv(guardianEnv) == "" {
		hooked.Store(true)
		return
	}
	os.Exit(runGuardian(os.Stdin, os.Stdout, os.Stderr))
}

// plan is what the daemon sends the guardian.
type plan struct {
	Targets []Target      `json:"targets"`
	Timeout time.Duration `json:"timeout"`
}

type guardian struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	once   sync.Once
	exited chan struct{} // closed once the process is reaped
}

// startGuardian starts a guardian for targets and waits until it is ready.
func startGuardian(targets []Target, timeout time.Duration) (*guardian, error) {
	if !hooked.Load() {
		return nil, ErrNoGuardian
	}
	msg, err := json.Marshal(plan{Targets: targets, Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("quiesce guardian plan: %w", err)
	}
	// /proc/self/exe and not os.Executable: it still runs this program
	// after an upgrade replaced its file.
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"wasmcsi-quiesce-guardian"}
	cmd.Env = []string{guardianEnv + "=1"}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("quiesce guardian: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("quiesce guardian: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, abi.Errorf(abi.Internal, "start quiesce guardian: %v", err)
	}
	g := &guardian{cmd: cmd, in: in, exited: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("answered %q", line)
		}
		ready <- err
		io.Copy(io.Discard, out) // until it exits
	}()
	if _, err := in.Write(append(msg, '\n')); err != nil {
		g.kill()
		return nil, abi.Errorf(abi.Internal, "quiesce guardian: send plan: %v", err)
	}
	select {
	case err = <-ready:
	case <-time.After(readyTimeout):
		err = fmt.Errorf("not ready after %s", readyTimeout)
	}
	if err != nil {
		g.kill()
		return nil, abi.Errorf(abi.Internal, "quiesce guardian: %v", err)
	}
	go g.reap()
	return g, nil
}

// release ends the guardian's watch: it stands down when resumed is true,
// and otherwise (the daemon's own resume failed) resumes everything once
// more, as if the daemon had died.
func (g *guardian) release(resumed bool) {
	if g == nil {
		return
	}
	g.once.Do(func() {
		if resumed {
			g.in.Write([]byte("release\n"))
		}
		g.in.Close()
	})
}

func (g *guardian) kill() {
	g.once.Do(func() {
		// Nothing is paused yet: a guardian that never became ready is
		// stopped without a thaw (SIGKILL) and reaped.
		g.cmd.Process.Kill()
		g.in.Close()
		go g.reap()
	})
}

// reap waits for the guardian to end, whenever it does.
func (g *guardian) reap() {
	g.cmd.Wait()
	close(g.exited)
}

// runGuardian is the guardian's whole life.
func runGuardian(in io.Reader, out, errOut io.Writer) int {
	logf := func(format string, args ...any) {
		fmt.Fprintf(errOut, "wasmcsi quiesce guardian %d: "+format+"\n", append([]any{os.Getpid()}, args...)...)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	r := bufio.NewReader(in)
	line, err := r.ReadBytes('\n')
	if err != nil {
		logf("no plan: %v", err)
		return 2
	}
	var p plan
	if err := json.Unmarshal(line, &p); err != nil {
		logf("bad plan: %v", err)
		return 2
	}
	if _, err := io.WriteString(out, "ready\n"); err != nil {
		logf("cannot answer: %v", err)
		return 2
	}
	word := make(chan string, 1)
	go func() {
		l, err := r.ReadString('\n')
		if err != nil {
			word <- ""
			return
		}
		word <- strings.TrimSpace(l)
	}()
	var why string
	select {
	case w := <-word:
		if w == "release" {
			return 0
		}
		why = "the daemon is gone"
	case <-time.After(p.Timeout):
		why = fmt.Sprintf("no word from the daemon within %s", p.Timeout)
	case s := <-sig:
		why = "signal " + s.String()
	}
	code := 0
	for _, t := range p.Targets {
		was, err := resume(context.Background(), t)
		switch {
		case err != nil:
			logf("resume %s: %v", t, err)
			code = 1
		case was:
			logf("%s: resumed %s", why, t)
		}
	}
	return code
}
