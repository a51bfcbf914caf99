package filepool_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/hostcalltest"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// hostCall runs the binding name with req as a module would, and decodes
// the answer into resp.
func hostCall(t *testing.T, env *hostcalls.Env, name string, req, resp hostcalls.Message) error {
	t.Helper()
	return hostcalltest.Call(t, filepool.Bindings(), filepool.Family, env, name, req, resp)
}

func TestBindings(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	vol := filepath.Join(root, "vol")
	var empty abi.Empty
	if err := hostCall(t, env, abi.HostCallFileCreate, &abi.FileCreateRequest{Path: vol, SizeBytes: 8 * mib}, &empty); err != nil {
		t.Fatal(err)
	}
	if err := hostCall(t, env, abi.HostCallFileResize, &abi.FileResizeRequest{Path: vol, SizeBytes: 16 * mib, Prealloc: true}, &empty); err != nil {
		t.Fatal(err)
	}
	var st abi.FileStat
	if err := hostCall(t, env, abi.HostCallFileStat, &abi.FileRequest{Path: vol}, &st); err != nil {
		t.Fatal(err)
	}
	if st.SizeBytes != 16*mib || st.AllocatedBytes < 8*mib {
		t.Fatalf("file_stat = %+v", st)
	}
	snap := filepath.Join(root, "snap")
	if err := hostCall(t, env, abi.HostCallFileClone, &abi.FileCloneRequest{Source: vol, Target: snap}, &empty); err != nil {
		t.Fatal(err)
	}
	var sfs abi.FileStatfs
	if err := hostCall(t, env, abi.HostCallFileStatfs, &abi.FileRequest{Path: root}, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.TotalBytes <= 0 || sfs.AvailableBytes > sfs.TotalBytes {
		t.Fatalf("file_statfs = %+v", sfs)
	}
	for range 2 { // removing a missing file is success
		if err := hostCall(t, env, abi.HostCallFileRemove, &abi.FileRequest{Path: snap}, &empty); err != nil {
			t.Fatal(err)
		}
	}
	if err := hostCall(t, env, abi.HostCallFileStat, &abi.FileRequest{Path: snap}, &st); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("file_stat after file_remove = %v, want NOT_FOUND", err)
	}
}

func TestBindingsConfine(t *testing.T) {
	root, other := t.TempDir(), t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root, other}}
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	var empty abi.Empty
	for _, tc := range []struct {
		name string
		path string
		want abi.Code
	}{
		{"outside the roots", outside, abi.PermissionDenied},
		{"dot-dot", filepath.Join(root, "..", "x"), abi.PermissionDenied},
		{"the root itself", root, abi.PermissionDenied},
		{"below a sub-folder", filepath.Join(root, "sub", "vol"), abi.InvalidArgument},
		{"hidden name", filepath.Join(root, ".vol"), abi.InvalidArgument},
		{"relative", "vol", abi.InvalidArgument},
		{"symlink", filepath.Join(root, "link"), abi.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := hostCall(t, env, abi.HostCallFileResize, &abi.FileResizeRequest{Path: tc.path, SizeBytes: mib}, &empty)
			if abi.CodeOf(err) != tc.want {
				t.Fatalf("file_resize %s = %v, want %v", tc.path, err, tc.want)
			}
		})
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep" {
		t.Fatalf("file outside the roots changed: %q, %v", b, err)
	}
	src := filepath.Join(root, "src")
	if err := hostCall(t, env, abi.HostCallFileCreate, &abi.FileCreateRequest{Path: src, SizeBytes: mib}, &empty); err != nil {
		t.Fatal(err)
	}
	err := hostCall(t, env, abi.HostCallFileClone, &abi.FileCloneRequest{Source: src, Target: filepath.Join(other, "dst")}, &empty)
	if abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("file_clone across pools = %v, want INVALID_ARGUMENT", err)
	}
	var sfs abi.FileStatfs
	if err := hostCall(t, env, abi.HostCallFileStatfs, &abi.FileRequest{Path: filepath.Join(root, "sub")}, &sfs); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("file_statfs of a sub-folder = %v, want INVALID_ARGUMENT", err)
	}
	for _, f := range filepool.Bindings() {
		if _, err := f.Call(context.Background(), env, []byte{0xff}); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("%s with a garbage request = %v, want INVALID_ARGUMENT", f.Name, err)
		}
	}
}

func TestBindingRemoveRefusesAttachedFile(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	vol := filepath.Join(root, "vol")
	var empty abi.Empty
	if err := hostCall(t, env, abi.HostCallFileCreate, &abi.FileCreateRequest{Path: vol, SizeBytes: 4 * mib}, &empty); err != nil {
		t.Fatal(err)
	}
	d, err := loop.Attach(ctx, vol, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.DetachBound(ctx, d) })
	if err := hostCall(t, env, abi.HostCallFileRemove, &abi.FileRequest{Path: vol}, &empty); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("file_remove of an attached file = %v, want FAILED_PRECONDITION", err)
	}
	if err := loop.Detach(ctx, d.Path); err != nil {
		t.Fatal(err)
	}
	if err := hostCall(t, env, abi.HostCallFileRemove, &abi.FileRequest{Path: vol}, &empty); err != nil {
		t.Fatalf("file_remove after detach: %v", err)
	}
}
