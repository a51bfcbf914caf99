// Package hostcalls holds the privileged primitives a backend module may use.
// Each subpackage does one job with a plain Go API that the host and tests call
// directly (hostcalls/loop, hostcalls/mount, ...), plus a Bindings function
// that exposes that API to modules as host calls.
//
// This package defines what a binding is. A host call never trusts its
// request: every path is confined to the roots the operator granted the
// calling module, every name is validated, and nothing runs a shell.
package hostcalls

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Func is one host call: an import of the "wasmcsi" host module with the
// signature abi.HostCallSignature.
type Func struct {
	// Name is the import name, "<family>_<verb>", e.g. "dir_create".
	Name string
	// Family is the grant that allows the call, e.g. "dir".
	Family string
	// Call runs the host call. req is the encoded request; the result is the
	// encoded response. An error that is an *abi.Error keeps its code; any
	// other error reaches the module as abi.Internal.
	Call func(ctx context.Context, env *Env, req []byte) ([]byte, error)
	// Available, when set, reports whether this host can serve the call at
	// all (the kernel feature it drives is present); nil means always. A
	// module importing a call that is not available is refused at load
	// before any of its code runs, so its configure sets nothing up (pool
	// files, loop devices) for a feature the host lacks.
	Available func() error
}

// Env is what a host call knows about its caller.
type Env struct {
	// Module is the calling module's name (for logs and ownership tags).
	Module string
	// Roots are the filesystem roots the operator granted the module:
	// pool folders, device paths, allowed portals and name prefixes
	// depending on the family. Never empty paths; always clean and absolute
	// for path roots.
	Roots []string
	// Log receives the host call's own log lines, already tagged with
	// the module's name.
	Log *slog.Logger
}

// Message is what abi's generated codec gives every message type.
type Message = abi.Message

// Typed builds a Func from a typed handler: it decodes the request into a new
// Req, runs fn and encodes the response. A request that does not decode is
// answered with abi.InvalidArgument.
func Typed[Req any, Resp any, PReq interface {
	*Req
	Message
}, PResp interface {
	*Resp
	Message
}](family, name string, fn func(ctx context.Context, env *Env, req PReq) (PResp, error)) Func {
	return Func{
		Name:   name,
		Family: family,
		Call: func(ctx context.Context, env *Env, raw []byte) ([]byte, error) {
			req := PReq(new(Req))
			if err := req.UnmarshalWire(raw); err != nil {
				return nil, abi.Errorf(abi.InvalidArgument, "%s: bad request: %v", name, err)
			}
			resp, err := fn(ctx, env, req)
			if err != nil {
				return nil, err
			}
			if resp == nil {
				return nil, nil
			}
			return resp.AppendWire(nil), nil
		},
	}
}

// Confine returns the absolute, clean form of path if it lies inside one of
// roots (the root itself included when allowRoot), and a PermissionDenied
// error otherwise. It is a lexical check: packages that then open the path
// must also refuse symlinks that leave the root (openat2 RESOLVE_BENEATH or
// an equivalent), which Confine alone cannot see.
func Confine(roots []string, path string, allowRoot bool) (string, error) {
	if path == "" || !filepath.IsAbs(path) {
		return "", abi.Errorf(abi.InvalidArgument, "path %s is not absolute", quote(path))
	}
	clean := filepath.Clean(path)
	for _, r := range roots {
		r = filepath.Clean(r)
		if clean == r {
			if allowRoot {
				return clean, nil
			}
			continue
		}
		if strings.HasPrefix(clean, r+string(filepath.Separator)) || r == "/" {
			return clean, nil
		}
	}
	return "", abi.Errorf(abi.PermissionDenied, "path %s is outside the granted roots", quote(path))
}

func quote(s string) string { return "\"" + s + "\"" }

// PoolPath confines path to the caller's roots and splits it into its pool
// folder, which must itself be a granted root (volumes live directly in a
// pool), and its last element. what names the thing for the error ("file",
// "directory"). The caller still validates the name and opens the pool.
func PoolPath(env *Env, path, what string) (root, name string, err error) {
	clean, err := Confine(env.Roots, path, false)
	if err != nil {
		return "", "", err
	}
	root, name = filepath.Dir(clean), filepath.Base(clean)
	if !IsRoot(env, root) {
		return "", "", abi.Errorf(abi.InvalidArgument, "%s %s is not directly in a granted pool folder", what, quote(path))
	}
	return root, name, nil
}

// IsRoot reports whether the clean path dir is one of the caller's roots.
func IsRoot(env *Env, dir string) bool {
	for _, r := range env.Roots {
		if filepath.Clean(r) == dir {
			return true
		}
	}
	return false
}

// PoolPair is PoolPath for a copy within one pool: both paths must lie
// directly in the same granted pool folder. It answers that folder and the
// two names; the caller validates the names.
func PoolPair(env *Env, source, target, what string) (root, src, dst string, err error) {
	srcRoot, src, err := PoolPath(env, source, what)
	if err != nil {
		return "", "", "", err
	}
	dstRoot, dst, err := PoolPath(env, target, what)
	if err != nil {
		return "", "", "", err
	}
	if srcRoot != dstRoot {
		return "", "", "", abi.Errorf(abi.InvalidArgument, "source and target must be in the same pool folder")
	}
	return srcRoot, src, dst, nil
}

// Device is a block device a module named for the host to stage.
type Device struct {
	// Path is the device as the module named it: absolute, maybe a link
	// (/dev/mapper/…, /dev/disk/by-path/…).
	Path string
	// Real is Path with its links resolved, a block device node; "" when
	// the question is asked of the name alone, before the host looks at
	// the node. Either way a family tells its devices by the device
	// number the node has, never by the name.
	Real string
	// Staged says the device is a recorded stage's, checked again (health,
	// reconciliation, a repeated stage): the host compares the identity
	// the family gives with the one the record keeps. A family then
	// accepts a device that another device holds, a workload's
	// dm-crypt, LVM or md on a raw block volume or multipathd on a disk,
	// which it refuses when the device is first claimed at node_stage.
	Staged bool
}

// DeviceOwner is implemented by a family whose host calls make block
// devices (loop, dm, iscsi). The host stages a device a module names only
// when a family answers that its grants explain it, so a module cannot hand
// a workload the host's own disks; each family knows its own devices, and
// a new one needs no change to the host.
type DeviceOwner interface {
	// OwnsDevice reports whether d is one of the family's devices that
	// roots (the module's granted roots) cover, and an identity that tells
	// this device from another a reboot or rescan later puts under the same
	// name ("" when the family has none). An error means the family could
	// not tell.
	OwnsDevice(ctx context.Context, d Device, roots []string) (identity string, owned bool, err error)
}
