// Package nfs is the node's NFS client (abi/hc_nfs.go): NFSv4.1 and 4.2
// mounts of granted servers in granted folders, their usage, and unmounts
// that a dead server cannot hold.
//
// The mount runs mount.nfs in a child process: the kernel's NFS mount
// takes text options only after user space resolved the server and chose
// the client's address (what mount.nfs does), and the mount(2) of a
// server that does not answer sleeps uninterruptibly in the caller. The
// child is killed at the call's deadline and, where it cannot die at once,
// reaped apart from the call. statfs and umount(2) run on goroutines of
// their own that the call abandons at its deadline; an unmount that does
// not finish is made lazy (MNT_DETACH).
package nfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Defaults of the calls' bounds.
const (
	DefaultMountTimeout   = 30 * time.Second
	DefaultUnmountTimeout = 10 * time.Second
	DefaultStatTimeout    = 5 * time.Second
)

// DefaultOptions come before the module's: a server that goes away makes
// I/O fail after timeo×retrans (10 s × 3) instead of hanging it forever,
// and mount.nfs gives up at once instead of retrying for two minutes.
var DefaultOptions = []string{"soft", "timeo=100", "retrans=3", "retry=0"}

// Mount describes an NFS mount as the mount table shows it.
type Mount struct {
	Server, Export, Target, Version string
	ReadOnly                        bool
}

// mountPath finds mount.nfs.
func mountPath() (string, error) {
	for _, p := range []string{"/usr/sbin/mount.nfs", "/sbin/mount.nfs"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", abi.Errorf(abi.FailedPrecondition, "mount.nfs not found: install the NFS client (nfs-common, nfs-utils)")
}

// Available reports whether this node can mount NFS.
func Available() error {
	_, err := mountPath()
	return err
}

// refused are options the host sets or that would leave NFSv4.
var refused = map[string]bool{"vers": true, "nfsvers": true, "minorversion": true, "addr": true, "clientaddr": true,
	"port": true, "mountport": true, "mountaddr": true, "mountvers": true, "mountproto": true, "udp": true, "proto": true,
	"bg": true, "fg": true, "retry": true, "remount": true, "bind": true, "rbind": true, "move": true}

// known are the NFS (and generic) mount options a StorageClass may set.
var known = map[string]bool{"soft": true, "hard": true, "softerr": true, "timeo": true, "retrans": true, "rsize": true, "wsize": true,
	"ac": true, "noac": true, "actimeo": true, "acregmin": true, "acregmax": true, "acdirmin": true, "acdirmax": true,
	"cto": true, "nocto": true, "lookupcache": true, "nconnect": true, "max_connect": true, "sec": true, "fsc": true, "nofsc": true,
	"sharecache": true, "nosharecache": true, "resvport": true, "noresvport": true, "local_lock": true, "write": true,
	"trunkdiscovery": true, "notrunkdiscovery": true, "xprtsec": true,
	"ro": true, "rw": true, "noatime": true, "atime": true, "nodiratime": true, "diratime": true, "relatime": true,
	"norelatime": true, "strictatime": true, "nosuid": true, "nodev": true, "noexec": true, "sync": true, "async": true,
	"lazytime": true, "nolazytime": true}

// CheckOptions refuses options the host owns and anything that is not an
// NFS mount option.
func CheckOptions(opts []string) error {
	for _, o := range opts {
		k, _, _ := strings.Cut(o, "=")
		switch {
		case o == "" || strings.ContainsAny(o, ", \t\n\x00"):
			return abi.Errorf(abi.InvalidArgument, "nfs_mount: option %q: one option per entry, no commas or spaces", o)
		case refused[k]:
			return abi.Errorf(abi.InvalidArgument, "nfs_mount: option %q is the host's to set (NFSv4.1/4.2 over TCP, the version in Version)", o)
		case !known[k]:
			return abi.Errorf(abi.InvalidArgument, "nfs_mount: %q is not an NFS mount option this host passes", o)
		}
	}
	return nil
}

// ParseServer checks a server (an IP address or a host name, no port).
func ParseServer(s string) (string, error) {
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		if a.Zone() != "" {
			return "", abi.Errorf(abi.InvalidArgument, "nfs server %q has a zone", s)
		}
		return a.Unmap().String(), nil
	}
	if s == "" || len(s) > 253 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != "" ||
		strings.HasPrefix(s, "-") || strings.HasPrefix(s, ".") {
		return "", abi.Errorf(abi.InvalidArgument, "nfs server %q is not an IP address or a host name", s)
	}
	return strings.ToLower(s), nil
}

// source is mount.nfs's "server:/export".
func source(server, export string) string {
	if strings.Contains(server, ":") {
		return "[" + server + "]:" + export
	}
	return server + ":" + export
}

// Find answers the NFS mount on top of target, if any, from the mount
// table alone: it never touches target, which a dead server would hold.
func Find(target string) (Mount, bool, error) {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil {
		return Mount{}, false, fmt.Errorf("nfs: mount table: %w", err)
	}
	if len(ms) == 0 {
		return Mount{}, false, nil
	}
	m := ms[len(ms)-1]
	if m.FSType != "nfs4" && m.FSType != "nfs" {
		return Mount{}, true, abi.Errorf(abi.FailedPrecondition, "nfs: %s holds a %s mount, not NFS", target, m.FSType)
	}
	out := Mount{Target: target, ReadOnly: slices.Contains(strings.Split(m.Options, ","), "ro")}
	if i := strings.LastIndex(m.Source, ":/"); i > 0 {
		out.Server, out.Export = strings.Trim(m.Source[:i], "[]"), m.Source[i+1:]
	}
	for _, o := range strings.Split(m.VFSOptions, ",") {
		if v, ok := strings.CutPrefix(o, "vers="); ok {
			out.Version = v
		}
	}
	return out, true, nil
}

// MountNFS mounts server:export at target with vers (4.2 or 4.1; "" tries
// 4.2, then 4.1), the defaults and opts. An existing NFS mount of the same
// source is success.
func MountNFS(ctx context.Context, server, export, target, vers string, opts []string, readOnly bool, timeout time.Duration) (Mount, error) {
	if m, ok, err := Find(target); err != nil {
		return Mount{}, err
	} else if ok {
		if m.Server == server && m.Export == export {
			return m, nil
		}
		return Mount{}, abi.Errorf(abi.AlreadyExists, "nfs: %s already holds %s:%s", target, m.Server, m.Export)
	}
	made := false
	if err := os.Mkdir(target, 0o750); err == nil {
		made = true
	} else if !errors.Is(err, os.ErrExist) {
		return Mount{}, abi.Errorf(abi.Internal, "nfs: create %s: %v", target, err)
	}
	versions := []string{vers}
	if vers == "" {
		versions = []string{"4.2", "4.1"}
	}
	if timeout <= 0 {
		timeout = DefaultMountTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	for _, v := range versions {
		all := append(slices.Clone(DefaultOptions), opts...)
		all = append(all, "vers="+v)
		if readOnly {
			all = append(all, "ro")
		}
		err = runMount(ctx, source(server, export), target, all)
		if err == nil {
			m, ok, ferr := Find(target)
			if ferr != nil || !ok {
				return Mount{}, abi.Errorf(abi.Internal, "nfs: mount.nfs succeeded but %s is not mounted: %v", target, ferr)
			}
			return m, nil
		}
		if abi.CodeOf(err) != abi.InvalidArgument { // only a version the server refuses moves on
			break
		}
	}
	if made {
		// A failed mount leaves nothing: the folder goes unless a mount
		// the killed child made after all holds it.
		if _, ok, ferr := Find(target); ferr == nil && !ok {
			os.Remove(target)
		}
	}
	return Mount{}, err
}

// runMount runs mount.nfs, killed at ctx's end; a child that cannot die
// (in the kernel, waiting for the server) is reaped in the background.
func runMount(ctx context.Context, src, target string, opts []string) error {
	bin, err := mountPath()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, src, target, "-o", strings.Join(opts, ","))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return abi.Errorf(abi.Internal, "nfs: start mount.nfs: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			return nil
		}
		return mountError(src, out.String(), err)
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(time.Second):
			// Left to finish on its own; done is buffered.
		}
		return abi.Errorf(abi.Unavailable, "nfs: mount %s: the server did not answer in time (%v)", src, ctx.Err())
	}
}

// mountError maps mount.nfs's complaint to a code.
func mountError(src, out string, err error) error {
	msg := strings.TrimSpace(out)
	l := strings.ToLower(msg)
	code := abi.Internal
	switch {
	case strings.Contains(l, "access denied") || strings.Contains(l, "permission denied"):
		code = abi.PermissionDenied
	case strings.Contains(l, "no such file") || strings.Contains(l, "not found"):
		code = abi.NotFound
	case strings.Contains(l, "protocol not supported") || strings.Contains(l, "requested nfs version") || strings.Contains(l, "invalid argument"):
		code = abi.InvalidArgument
	case strings.Contains(l, "timed out") || strings.Contains(l, "refused") || strings.Contains(l, "no route") ||
		strings.Contains(l, "unreachable") || strings.Contains(l, "resolve"):
		code = abi.Unavailable
	}
	return abi.Errorf(code, "nfs: mount %s: %v: %s", src, err, msg)
}

// Unmount unmounts the NFS mount at target and removes the folder; a
// mount whose server does not answer within timeout is detached lazily.
func Unmount(ctx context.Context, target string, timeout time.Duration) (lazy bool, err error) {
	_, ok, err := Find(target)
	if err != nil {
		return false, err
	}
	if ok {
		if timeout <= 0 {
			timeout = DefaultUnmountTimeout
		}
		err := bounded(ctx, timeout, func() error { return unix.Unmount(target, 0) })
		switch {
		case err == nil:
		case errors.Is(err, unix.EBUSY):
			return false, abi.Errorf(abi.FailedPrecondition, "nfs: %s is in use", target)
		case errors.Is(err, unix.EINVAL):
			// Gone meanwhile.
		default:
			// The server did not answer: abort its requests, then detach.
			_ = bounded(ctx, time.Second, func() error { return unix.Unmount(target, unix.MNT_FORCE) })
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return false, abi.Errorf(abi.Internal, "nfs: detach %s: %v", target, err)
			}
			lazy = true
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return lazy, abi.Errorf(abi.Internal, "nfs: remove %s: %v", target, err)
	}
	return lazy, nil
}

// errTimeout is a bounded call that did not finish.
var errTimeout = errors.New("did not finish in time")

// bounded runs fn on a goroutine of its own and stops waiting at timeout
// or ctx's end: a syscall a dead server holds keeps that goroutine, never
// the caller's.
func bounded(ctx context.Context, timeout time.Duration, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return errTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Usage is a bounded statfs of an NFS mount.
type Usage struct {
	Total, Available, Used int64
}

// Stat answers the mount at target and its usage; reachable is false (with
// why) when the server did not answer within timeout.
func Stat(ctx context.Context, target string, timeout time.Duration) (Mount, Usage, string, error) {
	m, ok, err := Find(target)
	if err != nil {
		return Mount{}, Usage{}, "", err
	}
	if !ok {
		return Mount{}, Usage{}, "", abi.Errorf(abi.NotFound, "nfs: %s is not mounted", target)
	}
	if timeout <= 0 {
		timeout = DefaultStatTimeout
	}
	var st unix.Statfs_t
	if err := bounded(ctx, timeout, func() error { return unix.Statfs(target, &st) }); err != nil {
		if errors.Is(err, errTimeout) {
			return m, Usage{}, "the server did not answer within " + timeout.String(), nil
		}
		return m, Usage{}, err.Error(), nil
	}
	bs := int64(st.Bsize)
	u := Usage{Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs}
	return m, u, "", nil
}
