package dirpool_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/hostcalltest"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/dirpool"
)

// hostCall runs the binding name with req as a module would, and decodes
// the answer into resp.
func hostCall(t *testing.T, env *hostcalls.Env, name string, req, resp hostcalls.Message) error {
	t.Helper()
	return hostcalltest.Call(t, dirpool.Bindings(), dirpool.Family, env, name, req, resp)
}

func TestBindingNames(t *testing.T) {
	want := []string{
		abi.HostCallDirCreate, abi.HostCallDirRemove, abi.HostCallDirCopy, abi.HostCallDirStatfs,
		abi.HostCallDirUsage, abi.HostCallDirSetQuota, abi.HostCallDirQuotaSupported, abi.HostCallDirExists,
		abi.HostCallDirList,
	}
	got := map[string]bool{}
	for _, f := range dirpool.Bindings() {
		got[f.Name] = true
	}
	for _, n := range want {
		if !got[n] {
			t.Errorf("no binding %s", n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d bindings, want %d", len(got), len(want))
	}
}

func TestBindings(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	vol := filepath.Join(root, "vol")
	var empty abi.Empty
	for range 2 { // creating an existing directory is success
		if err := hostCall(t, env, abi.HostCallDirCreate, &abi.DirCreateRequest{Path: vol}, &empty); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(vol, "data"), make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	var ex abi.DirExists
	if err := hostCall(t, env, abi.HostCallDirExists, &abi.DirRequest{Path: vol}, &ex); err != nil || !ex.Exists {
		t.Fatalf("dir_exists = %+v, %v", ex, err)
	}
	var u abi.DirUsage
	if err := hostCall(t, env, abi.HostCallDirUsage, &abi.DirRequest{Path: vol}, &u); err != nil {
		t.Fatal(err)
	}
	if u.UsedInodes != 2 || u.UsedBytes < 64<<10 {
		t.Fatalf("dir_usage = %+v", u)
	}
	snap := filepath.Join(root, "snap")
	if err := hostCall(t, env, abi.HostCallDirCopy, &abi.DirCopyRequest{Source: vol, Target: snap}, &empty); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(snap, "data")); err != nil || len(b) != 64<<10 {
		t.Fatalf("copied data: %d bytes, %v", len(b), err)
	}
	for _, path := range []string{root, vol} {
		var sfs abi.DirStatfs
		if err := hostCall(t, env, abi.HostCallDirStatfs, &abi.DirRequest{Path: path}, &sfs); err != nil {
			t.Fatal(err)
		}
		if sfs.TotalBytes <= 0 || sfs.AvailableBytes > sfs.FreeBytes || sfs.FreeBytes > sfs.TotalBytes {
			t.Fatalf("dir_statfs %s = %+v", path, sfs)
		}
	}
	var qs abi.DirQuotaSupport
	if err := hostCall(t, env, abi.HostCallDirQuotaSupported, &abi.DirRequest{Path: root}, &qs); err != nil {
		t.Fatal(err)
	}
	if !qs.Supported {
		if qs.Reason == "" {
			t.Fatal("dir_quota_supported: unsupported without a reason")
		}
		err := hostCall(t, env, abi.HostCallDirSetQuota, &abi.DirQuotaRequest{Path: vol, QuotaBytes: 1 << 20}, &empty)
		if abi.CodeOf(err) != abi.FailedPrecondition {
			t.Fatalf("dir_set_quota without support = %v, want FAILED_PRECONDITION", err)
		}
	}
	for range 2 { // removing a missing directory is success
		if err := hostCall(t, env, abi.HostCallDirRemove, &abi.DirRequest{Path: snap}, &empty); err != nil {
			t.Fatal(err)
		}
	}
	if err := hostCall(t, env, abi.HostCallDirExists, &abi.DirRequest{Path: snap}, &ex); err != nil || ex.Exists {
		t.Fatalf("dir_exists after dir_remove = %+v, %v", ex, err)
	}
	if err := hostCall(t, env, abi.HostCallDirUsage, &abi.DirRequest{Path: snap}, &u); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("dir_usage after dir_remove = %v, want NOT_FOUND", err)
	}
}

func TestBindingsConfine(t *testing.T) {
	root, other := t.TempDir(), t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root, other}}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o600); err != nil {
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
		{"relative", "vol", abi.InvalidArgument},
		{"symlink", filepath.Join(root, "link"), abi.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := hostCall(t, env, abi.HostCallDirCopy, &abi.DirCopyRequest{Source: tc.path, Target: filepath.Join(root, "x")}, &empty)
			if abi.CodeOf(err) != tc.want {
				t.Fatalf("dir_copy %s = %v, want %v", tc.path, err, tc.want)
			}
			var u abi.DirUsage
			err = hostCall(t, env, abi.HostCallDirUsage, &abi.DirRequest{Path: tc.path}, &u)
			if abi.CodeOf(err) != tc.want {
				t.Fatalf("dir_usage %s = %v, want %v", tc.path, err, tc.want)
			}
			err = hostCall(t, env, abi.HostCallDirRemove, &abi.DirRequest{Path: tc.path}, &empty)
			if tc.name == "symlink" {
				// dir_remove unlinks a symlink in the pool, never its target.
				if err != nil {
					t.Fatalf("dir_remove of a symlink = %v", err)
				}
				if _, err := os.Lstat(tc.path); !os.IsNotExist(err) {
					t.Fatalf("symlink still there after dir_remove: %v", err)
				}
			} else if abi.CodeOf(err) != tc.want {
				t.Fatalf("dir_remove %s = %v, want %v", tc.path, err, tc.want)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "keep" {
		t.Fatalf("file outside the roots changed: %q, %v", b, err)
	}
	src := filepath.Join(root, "src")
	if err := hostCall(t, env, abi.HostCallDirCreate, &abi.DirCreateRequest{Path: src}, &empty); err != nil {
		t.Fatal(err)
	}
	err := hostCall(t, env, abi.HostCallDirCopy, &abi.DirCopyRequest{Source: src, Target: filepath.Join(other, "dst")}, &empty)
	if abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("dir_copy across pools = %v, want INVALID_ARGUMENT", err)
	}
	var qs abi.DirQuotaSupport
	if err := hostCall(t, env, abi.HostCallDirQuotaSupported, &abi.DirRequest{Path: src}, &qs); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("dir_quota_supported of a volume = %v, want INVALID_ARGUMENT", err)
	}
	for _, f := range dirpool.Bindings() {
		if _, err := f.Call(context.Background(), env, []byte{0xff}); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("%s with a garbage request = %v, want INVALID_ARGUMENT", f.Name, err)
		}
	}
}
