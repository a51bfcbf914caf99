// Package lvm drives LVM2 on volume groups an operator already runs: it
// creates, extends, snapshots, activates and removes logical volumes and
// reports the space of volume groups and thin pools. LVM has no stable
// library (liblvm2app was removed in 2.03; lvm2's own daemons link its
// internals), so every operation runs the lvm tool, with --reportformat
// json for reports, as topolvm's lvmd does (see RATIONALE.md). No syscall
// does these jobs: the VG metadata and its locks are LVM's.
//
// The package only ever sees the LVs it created: each carries the tag
// abi.LvmOwnerTag, and an LV without it answers NOT_FOUND whatever its
// name, so an operator's own LVs in the same VG are never touched.
package lvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
)

// DefaultTimeout bounds one lvm command when the call's context has no
// nearer deadline. LVM waits for a VG's lock held by another command, so a
// command can take long; none should take minutes.
const DefaultTimeout = 2 * time.Minute

// Runner runs one lvm command and answers its standard output. Tests fake
// it; Tool is the real one.
type Runner interface {
	Run(ctx context.Context, args ...string) ([]byte, error)
}

// Tool runs the lvm binary (lvm <command> <args>).
type Tool struct {
	// Path is the lvm binary; empty finds "lvm" in PATH.
	Path string
	// Timeout bounds each command; 0 means DefaultTimeout.
	Timeout time.Duration
}

// noUdevConfig is passed where udev does not run (a container without
// /run/udev, a minimal guest): LVM then lists devices itself and makes
// the /dev nodes of the LVs it activates, instead of waiting for udev
// rules that never run.
const noUdevConfig = "devices/obtain_device_list_from_udev=0 activation/udev_sync=0 activation/udev_rules=0"

// udevRunning reports whether udev's control socket exists.
func udevRunning() bool {
	_, err := os.Stat("/run/udev/control")
	return err == nil
}

// Run runs lvm with args after the command name (args[0]). Its standard
// error becomes the error's message; the exit status decides the code
// (see Classify).
func (t Tool) Run(ctx context.Context, args ...string) ([]byte, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("lvm: no command")
	}
	path := t.Path
	if path == "" {
		p, err := exec.LookPath("lvm")
		if err != nil {
			return nil, abi.Errorf(abi.FailedPrecondition, "lvm: the lvm2 tools are not installed: %v", err)
		}
		path = p
	}
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The settings go right after the command, before any "--".
	full := []string{args[0]}
	if !udevRunning() {
		full = append(full, "--config", noUdevConfig)
	}
	full = append(full, args[1:]...)
	cmd := exec.CommandContext(ctx, path, full...)
	// LVM warns about every inherited descriptor; the daemon holds many.
	// Messages in English, whatever the daemon's locale: Classify reads them.
	cmd.Env = []string{"LVM_SUPPRESS_FD_WARNINGS=1", "LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	msg := strings.TrimSpace(stderr.String())
	if ctx.Err() != nil {
		return nil, abi.Errorf(abi.DeadlineExceeded, "lvm %s: no answer within %v (%s)", args[0], timeout, msg)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return nil, fmt.Errorf("lvm %s: %w", args[0], err)
	}
	return nil, Classify(args[0], msg)
}

// Classify turns lvm's complaint into an error with the code it means.
// LVM exits 5 for nearly every failure, so its message decides.
func Classify(cmd, msg string) error {
	lower := strings.ToLower(msg)
	code := abi.Internal
	switch {
	case containsAny(lower, "insufficient free space", "insufficient suitable", "not enough free",
		"free space in thin pool", "out of data space", "cannot create new thin volume",
		"thin pool has insufficient", "exceeds the size of", "is out of space"):
		code = abi.ResourceExhausted
	case containsAny(lower, "already exists"):
		code = abi.AlreadyExists
	case containsAny(lower, "volume group") && containsAny(lower, "not found", "cannot process volume group"):
		// The VG itself is missing (its PVs not up yet at boot, say):
		// nothing can be said of its LVs, least of all that one is gone.
		code = abi.FailedPrecondition
	case containsAny(lower, "not found", "failed to find logical volume", "failed to find"):
		code = abi.NotFound
	case containsAny(lower, "in use", "open logical volume", "is used by another device", "contains a filesystem in use"):
		code = abi.FailedPrecondition
	case containsAny(lower, "read-only", "read only", "metadata operation failed"):
		code = abi.FailedPrecondition
	case containsAny(lower, "invalid", "unrecognised", "not allowed", "reserved name"):
		code = abi.InvalidArgument
	}
	if msg == "" {
		msg = "failed without a message"
	}
	return abi.Errorf(code, "lvm %s: %s", cmd, oneLine(msg))
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// oneLine joins lvm's message lines (each indented) into one.
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

// Available reports whether this host can serve the family: the lvm tool
// is installed and the kernel has device-mapper (asked the way the dm
// family asks, before any lvm command runs: lvm itself would make a
// /dev/mapper/control node on a kernel without it).
func Available() error {
	if _, err := exec.LookPath("lvm"); err != nil {
		return fmt.Errorf("the lvm2 tools are not installed (no lvm in PATH)")
	}
	return dm.Available()
}
