package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the loop host calls.
const Family = "loop"

// Bindings returns the "loop" host calls (see abi/hc_loop.go). The caller's
// roots are folders whose files may back loop devices.
func Bindings() []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallLoopAttach, attachCall),
		hostcalls.Typed(Family, abi.HostCallLoopFind, findCall),
		hostcalls.Typed(Family, abi.HostCallLoopResize, resizeCall),
		hostcalls.Typed(Family, abi.HostCallLoopDetach, detachCall),
	}
}

func attachCall(ctx context.Context, env *hostcalls.Env, req *abi.LoopAttachRequest) (*abi.LoopDevice, error) {
	flags := unix.O_RDWR
	if req.ReadOnly {
		flags = unix.O_RDONLY
	}
	f, err := openConfined(env.Roots, req.File, flags)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", req.File, err)
	}
	defer f.Close()
	d, err := AttachFile(ctx, f, Options{ReadOnly: req.ReadOnly, DirectIO: req.DirectIO})
	if err != nil {
		return nil, err
	}
	if env.Log != nil {
		env.Log.Info("loop device attached", "device", d.Path, "file", d.BackingFile)
	}
	w := wireDevice(d)
	return &w, nil
}

func findCall(ctx context.Context, env *hostcalls.Env, req *abi.LoopFileRequest) (*abi.LoopFindResponse, error) {
	f, err := openConfined(env.Roots, req.File, unix.O_PATH)
	if errors.Is(err, os.ErrNotExist) || abi.CodeOf(err) == abi.NotFound {
		return &abi.LoopFindResponse{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", req.File, err)
	}
	defer f.Close()
	d, ok, err := FindFile(ctx, f)
	if err != nil || !ok {
		return &abi.LoopFindResponse{}, err
	}
	return &abi.LoopFindResponse{Found: true, Device: wireDevice(d)}, nil
}

func resizeCall(ctx context.Context, env *hostcalls.Env, req *abi.LoopDeviceRequest) (*abi.LoopResizeResponse, error) {
	d, bound, err := grantedDevice(ctx, env, req.Device)
	if err != nil {
		return nil, fmt.Errorf("resize %s: %w", req.Device, err)
	}
	if !bound {
		return nil, fmt.Errorf("resize %s: %w", req.Device, abi.Errorf(abi.NotFound, "not attached"))
	}
	size, err := Resize(ctx, d.Path)
	if err != nil {
		return nil, err
	}
	return &abi.LoopResizeResponse{SizeBytes: size}, nil
}

func detachCall(ctx context.Context, env *hostcalls.Env, req *abi.LoopDeviceRequest) (*abi.Empty, error) {
	// The grant is checked through a plain open first (a device not the
	// caller's is never held exclusively), then confirmed through the
	// exclusive descriptor that detaches it (see detach).
	var detached Device
	err := detach(ctx, req.Device, func(d Device) error {
		if err := granted(env, d); err != nil {
			return err
		}
		detached = d
		return nil
	})
	if err != nil {
		return nil, err
	}
	if env.Log != nil && detached.Path != "" {
		env.Log.Info("loop device detached", "device", detached.Path, "file", detached.BackingFile)
	}
	return &abi.Empty{}, nil
}

// grantedDevice returns the bound device dev if its backing file lies in
// the caller's roots (PermissionDenied otherwise), or bound=false when dev
// is not bound at all, which reveals nothing about anyone's files.
func grantedDevice(ctx context.Context, env *hostcalls.Env, dev string) (Device, bool, error) {
	if err := checkDevicePath(dev); err != nil {
		return Device{}, false, err
	}
	d, bound, err := Status(ctx, dev)
	if err != nil || !bound {
		return Device{}, false, err
	}
	if err := granted(env, d); err != nil {
		return Device{}, false, err
	}
	return d, true, nil
}

// granted checks that the bound device d is backed by a file in the
// caller's roots (PermissionDenied otherwise).
func granted(env *hostcalls.Env, d Device) error {
	// The kernel's path is resolved (no symlinks) and follows renames, so
	// a lexical check is exact here.
	if _, err := hostcalls.Confine(env.Roots, d.BackingFile, false); err != nil {
		return abi.Errorf(abi.PermissionDenied, "the device's backing file is outside the granted roots")
	}
	return nil
}

// openConfined opens path, which must lie inside one of roots, relative to
// a descriptor of that root with openat2, so that no symlink or ".." in
// the path can lead out of it.
func openConfined(roots []string, path string, flags int) (*os.File, error) {
	clean, err := hostcalls.Confine(roots, path, false)
	if err != nil {
		return nil, err
	}
	var root string
	for _, r := range roots {
		r = filepath.Clean(r)
		if rel, err := filepath.Rel(r, clean); err == nil && filepath.IsLocal(rel) && len(r) > len(root) {
			root = r
		}
	}
	if root == "" {
		return nil, abi.Errorf(abi.PermissionDenied, "path %q is outside the granted roots", path)
	}
	rel, _ := filepath.Rel(root, clean)
	dir, err := os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, codeErr(err, "open root: "+err.Error())
	}
	defer dir.Close()
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	var fd int
	for range 8 {
		fd, err = unix.Openat2(int(dir.Fd()), rel, &how)
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return nil, abi.Errorf(abi.PermissionDenied, "path %q goes through a symlink", path)
	}
	if err != nil {
		return nil, codeErr(err, "open "+strconv.Quote(path)+": "+err.Error())
	}
	return os.NewFile(uintptr(fd), clean), nil
}

func wireDevice(d Device) abi.LoopDevice {
	return abi.LoopDevice{
		Path:      d.Path,
		File:      d.BackingFile,
		Deleted:   d.BackingDeleted,
		SizeBytes: d.SizeBytes,
		ReadOnly:  d.ReadOnly,
		DirectIO:  d.DirectIO,
	}
}
