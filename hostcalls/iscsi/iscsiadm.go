package iscsi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// iscsiadm exit codes (open-iscsi include/iscsi_err.h) that change what a
// caller does. Every other non-zero code is reported with its number.
const (
	admSessNotFound  = 2
	admLogin         = 5
	admInval         = 7
	admTransTimeout  = 8
	admPDUTimeout    = 11
	admTransNotFound = 12
	admAccess        = 13
	admSessExists    = 15
	admIscsidComm    = 18
	admFatalLogin    = 19
	admIscsidNotConn = 20
	admNoObjsFound   = 21
	admSysfsLookup   = 22
	admAuthFailed    = 24
	admBusy          = 28
	admAgain         = 29
)

// admError is a failed iscsiadm run: its exit code and the code callers see.
type admError struct {
	exit int
	err  *abi.Error
}

func (e *admError) Error() string { return e.err.Error() }
func (e *admError) Unwrap() error { return e.err }

// exitCode returns the iscsiadm exit code inside err, or -1.
func exitCode(err error) int {
	var ae *admError
	if errors.As(err, &ae) {
		return ae.exit
	}
	return -1
}

// codeForExit maps an iscsiadm exit code to the status a CSI caller can act on.
func codeForExit(exit int) abi.Code {
	switch exit {
	case admSessNotFound, admNoObjsFound, admSysfsLookup:
		return abi.NotFound
	case admAuthFailed, admAccess:
		return abi.PermissionDenied
	case admSessExists:
		return abi.AlreadyExists
	case admInval:
		return abi.InvalidArgument
	case admTransTimeout, admPDUTimeout, admIscsidComm, admIscsidNotConn, admBusy, admAgain:
		return abi.Unavailable
	case admLogin, admFatalLogin, admTransNotFound:
		return abi.FailedPrecondition
	}
	return abi.Internal
}

// maxOutput bounds how much of iscsiadm's output is kept for an error.
const maxOutput = 4096

// runner runs iscsiadm with validated arguments, a timeout and no shell.
type runner struct {
	prog    string
	timeout time.Duration
}

// run runs iscsiadm. op names the step for errors; arguments are kept out
// of errors. CHAP secrets never reach them: they go into the node record
// file (see configureNode).
func (r runner) run(ctx context.Context, op string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.prog, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.WaitDelay = 2 * time.Second
	var out limitedBuffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err == nil {
		return out.String(), nil
	}
	if ctx.Err() != nil {
		code := abi.DeadlineExceeded
		if errors.Is(ctx.Err(), context.Canceled) {
			code = abi.Canceled
		}
		return "", fmt.Errorf("iscsiadm %s: %w", op, abi.Errorf(code, "%v", ctx.Err()))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() > 0 {
		exit := ee.ExitCode()
		msg := "iscsiadm " + op + ": " + summarize(out.String()) + " (exit " + strconv.Itoa(exit) + ")"
		return out.String(), &admError{exit: exit, err: abi.Errorf(codeForExit(exit), "%s", msg)}
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return "", abi.Errorf(abi.FailedPrecondition, "iscsiadm %s: open-iscsi is not installed: %v", op, err)
	}
	return "", fmt.Errorf("iscsiadm %s: %w", op, err)
}

// summarize keeps iscsiadm's error lines ("iscsiadm: ...") or else the last
// line, on one line.
func summarize(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "iscsiadm:") {
			keep = append(keep, strings.TrimSpace(strings.TrimPrefix(l, "iscsiadm:")))
		}
	}
	if len(keep) == 0 {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		keep = lines[len(lines)-1:]
	}
	s := strings.Join(keep, "; ")
	if s == "" {
		s = "no output"
	}
	return s
}

// limitedBuffer keeps the first maxOutput bytes written to it.
type limitedBuffer struct{ b bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - l.b.Len(); room > 0 {
		if len(p) > room {
			l.b.Write(p[:room])
		} else {
			l.b.Write(p)
		}
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return l.b.String() }
