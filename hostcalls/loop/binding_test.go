package loop_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/hostcalltest"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// hostCall runs the binding name with req as a module would, and decodes
// the answer into resp.
func hostCall(t *testing.T, env *hostcalls.Env, name string, req, resp hostcalls.Message) error {
	t.Helper()
	return hostcalltest.Call(t, loop.Bindings(), loop.Family, env, name, req, resp)
}

func TestBindings(t *testing.T) {
	looptest.Require(t)
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	file := filepath.Join(root, "vols", "a.img")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, make([]byte, 4*mib), 0o600); err != nil {
		t.Fatal(err)
	}

	var dev abi.LoopDevice
	if err := hostCall(t, env, abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: file}, &dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d, ok, err := loop.Find(context.Background(), file); err == nil && ok {
			loop.DetachBound(context.Background(), d)
		}
	})
	if dev.File != file || dev.SizeBytes != 4*mib || dev.ReadOnly {
		t.Fatalf("loop_attach = %+v", dev)
	}

	var found abi.LoopFindResponse
	if err := hostCall(t, env, abi.HostCallLoopFind, &abi.LoopFileRequest{File: file}, &found); err != nil {
		t.Fatal(err)
	}
	if !found.Found || found.Device != dev {
		t.Fatalf("loop_find = %+v, want %+v", found, dev)
	}

	if err := os.Truncate(file, 8*mib); err != nil {
		t.Fatal(err)
	}
	var resized abi.LoopResizeResponse
	if err := hostCall(t, env, abi.HostCallLoopResize, &abi.LoopDeviceRequest{Device: dev.Path}, &resized); err != nil {
		t.Fatal(err)
	}
	if resized.SizeBytes != 8*mib {
		t.Fatalf("loop_resize = %d", resized.SizeBytes)
	}

	var empty abi.Empty
	for range 2 { // the second detach finds a free device: success
		if err := hostCall(t, env, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: dev.Path}, &empty); err != nil {
			t.Fatal(err)
		}
	}
	found = abi.LoopFindResponse{}
	if err := hostCall(t, env, abi.HostCallLoopFind, &abi.LoopFileRequest{File: file}, &found); err != nil || found.Found {
		t.Fatalf("loop_find after detach = %+v, %v", found, err)
	}
	if err := hostCall(t, env, abi.HostCallLoopResize, &abi.LoopDeviceRequest{Device: dev.Path}, &resized); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("loop_resize of a free device = %v, want NOT_FOUND", err)
	}
}

func TestBindingsConfine(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	outside := looptest.SparseFile(t, 4*mib)
	if err := os.Symlink(outside, filepath.Join(root, "link.img")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(root, "linkdir")); err != nil {
		t.Fatal(err)
	}
	var dev abi.LoopDevice
	for _, tc := range []struct {
		name string
		file string
		want abi.Code
	}{
		{"outside the roots", outside, abi.PermissionDenied},
		{"dot-dot out of the root", filepath.Join(root, "..", filepath.Base(filepath.Dir(outside)), "backing.img"), abi.PermissionDenied},
		{"symlink to a file outside", filepath.Join(root, "link.img"), abi.PermissionDenied},
		{"through a symlinked folder", filepath.Join(root, "linkdir", "backing.img"), abi.PermissionDenied},
		{"the root itself", root, abi.PermissionDenied},
		{"relative path", "a.img", abi.InvalidArgument},
		{"missing file", filepath.Join(root, "missing.img"), abi.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := hostCall(t, env, abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: tc.file}, &dev)
			if abi.CodeOf(err) != tc.want {
				loop.Detach(ctx, dev.Path)
				t.Fatalf("loop_attach %s = %v, want %v", tc.file, err, tc.want)
			}
		})
	}
	if _, ok, _ := loop.Find(ctx, outside); ok {
		t.Fatal("a refused attach attached the outside file")
	}

	// A device of someone else's file can be neither resized nor detached.
	other, err := loop.Attach(ctx, outside, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.DetachBound(ctx, other) })
	var empty abi.Empty
	if err := hostCall(t, env, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: other.Path}, &empty); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("loop_detach of a foreign device = %v, want PERMISSION_DENIED", err)
	}
	var resized abi.LoopResizeResponse
	if err := hostCall(t, env, abi.HostCallLoopResize, &abi.LoopDeviceRequest{Device: other.Path}, &resized); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("loop_resize of a foreign device = %v, want PERMISSION_DENIED", err)
	}
	var found abi.LoopFindResponse
	if err := hostCall(t, env, abi.HostCallLoopFind, &abi.LoopFileRequest{File: filepath.Join(root, "link.img")}, &found); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("loop_find through a symlink = %+v, %v; want PERMISSION_DENIED", found, err)
	}
	if _, ok, _ := loop.Find(ctx, outside); !ok {
		t.Fatal("a refused detach detached the device")
	}
	if err := hostCall(t, env, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: "/dev/sda"}, &empty); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("loop_detach /dev/sda = %v, want INVALID_ARGUMENT", err)
	}
	for _, f := range loop.Bindings() {
		if _, err := f.Call(ctx, env, []byte{0xff}); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("%s with a garbage request = %v, want INVALID_ARGUMENT", f.Name, err)
		}
	}
}
