package mount_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/hostcalltest"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// hostCall runs the binding name with req as a module would, and decodes
// the answer into resp.
func hostCall(t *testing.T, env *hostcalls.Env, name string, req, resp hostcalls.Message) error {
	t.Helper()
	return hostcalltest.Call(t, mount.Bindings(), mount.Family, env, name, req, resp)
}

func TestBindings(t *testing.T) {
	mounttest.RequireRoot(t)
	pool, publish := t.TempDir(), t.TempDir()
	// A granted root reached through a symlink still works.
	linkedPublish := filepath.Join(t.TempDir(), "publish-link")
	if err := os.Symlink(publish, linkedPublish); err != nil {
		t.Fatal(err)
	}
	env := &hostcalls.Env{Module: "test", Roots: []string{pool, linkedPublish}}
	src := filepath.Join(pool, "vol")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(linkedPublish, "pod", "mount")
	t.Cleanup(func() { mounttest.Unmount(t, filepath.Join(publish, "pod", "mount")) })

	var ch abi.MountChange
	for i, want := range []bool{true, false} {
		if err := hostCall(t, env, abi.HostCallMountBind, &abi.MountBindRequest{Source: src, Target: target, ReadOnly: true}, &ch); err != nil {
			t.Fatal(err)
		}
		if ch.Changed != want {
			t.Fatalf("mount_bind #%d: Changed = %v, want %v", i+1, ch.Changed, want)
		}
	}
	var info abi.MountInfo
	if err := hostCall(t, env, abi.HostCallMountInfo, &abi.MountInfoRequest{Target: target}, &info); err != nil {
		t.Fatal(err)
	}
	if !info.Mounted || !info.ReadOnly || info.BlockDevice || info.Root == "" || info.FSType == "" {
		t.Fatalf("mount_info = %+v", info)
	}
	err := hostCall(t, env, abi.HostCallMountBind, &abi.MountBindRequest{Source: src, Target: target}, &ch)
	if abi.CodeOf(err) != abi.AlreadyExists {
		t.Fatalf("mount_bind read-write over read-only = %v, want ALREADY_EXISTS", err)
	}
	for i, want := range []bool{true, false} {
		if err := hostCall(t, env, abi.HostCallMountUnmount, &abi.MountUnmountRequest{Target: target}, &ch); err != nil {
			t.Fatal(err)
		}
		if ch.Changed != want {
			t.Fatalf("mount_unmount #%d: Changed = %v, want %v", i+1, ch.Changed, want)
		}
	}
	if err := hostCall(t, env, abi.HostCallMountInfo, &abi.MountInfoRequest{Target: target}, &info); err != nil || info.Mounted {
		t.Fatalf("mount_info after unmount = %+v, %v", info, err)
	}

	// A busy mount goes only lazily.
	if err := hostCall(t, env, abi.HostCallMountBind, &abi.MountBindRequest{Source: src, Target: target}, &ch); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(target, "open"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = hostCall(t, env, abi.HostCallMountUnmount, &abi.MountUnmountRequest{Target: target}, &ch)
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("mount_unmount of a busy mount = %v, want FAILED_PRECONDITION", err)
	}
	if err := hostCall(t, env, abi.HostCallMountUnmount, &abi.MountUnmountRequest{Target: target, Lazy: true}, &ch); err != nil || !ch.Changed {
		t.Fatalf("lazy mount_unmount = %+v, %v", ch, err)
	}
}

func TestBindingsConfine(t *testing.T) {
	mounttest.RequireRoot(t)
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	vol := filepath.Join(root, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	// A workload writes symlinks into its volume; they must not steer mounts.
	if err := os.Symlink(outside, filepath.Join(vol, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nonexistent-wasmcsi/dir", filepath.Join(vol, "dangling")); err != nil {
		t.Fatal(err)
	}
	var ch abi.MountChange
	for _, tc := range []struct {
		name           string
		source, target string
		want           abi.Code
	}{
		{"source outside", outside, filepath.Join(root, "t1"), abi.PermissionDenied},
		{"target outside", vol, filepath.Join(outside, "t2"), abi.PermissionDenied},
		{"dot-dot", vol, filepath.Join(root, "..", "t3"), abi.PermissionDenied},
		{"source through a symlink out", filepath.Join(vol, "escape"), filepath.Join(root, "t4"), abi.PermissionDenied},
		{"target through a symlink out", vol, filepath.Join(vol, "escape", "t5"), abi.PermissionDenied},
		// The folders on a target's way are opened beneath the root
		// through no symlink: one in the way is refused as such.
		{"target below a dangling symlink", vol, filepath.Join(vol, "dangling", "t6"), abi.PermissionDenied},
		{"relative", "vol", filepath.Join(root, "t7"), abi.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := hostCall(t, env, abi.HostCallMountBind, &abi.MountBindRequest{Source: tc.source, Target: tc.target}, &ch)
			if abi.CodeOf(err) != tc.want {
				t.Fatalf("mount_bind = %v, want %v", err, tc.want)
			}
		})
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Fatalf("something was created outside the roots: %v", entries)
	}
	if _, err := os.Stat("/nonexistent-wasmcsi"); !os.IsNotExist(err) {
		t.Fatalf("a dangling symlink led to a directory outside the roots: %v", err)
	}
	var info abi.MountInfo
	err := hostCall(t, env, abi.HostCallMountInfo, &abi.MountInfoRequest{Target: "/"}, &info)
	if abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("mount_info of / = %v, want PERMISSION_DENIED", err)
	}
	err = hostCall(t, env, abi.HostCallMountUnmount, &abi.MountUnmountRequest{Target: filepath.Join(vol, "escape")}, &ch)
	if abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("mount_unmount through a symlink out = %v, want PERMISSION_DENIED", err)
	}
	for _, f := range mount.Bindings() {
		if _, err := f.Call(context.Background(), env, []byte{0xff}); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("%s with a garbage request = %v, want INVALID_ARGUMENT", f.Name, err)
		}
	}
}

// TestBindingsInfoBlock asks mount_info about a published raw block
// volume: a device node bound on a file.
func TestBindingsInfoBlock(t *testing.T) {
	mounttest.RequireRoot(t)
	dev := mounttest.Loop(t, 8<<20)
	publish := t.TempDir()
	target := filepath.Join(publish, "pod", "block")
	t.Cleanup(func() { mounttest.Unmount(t, target) })
	if _, err := mount.Bind(context.Background(), dev, target, false); err != nil {
		t.Fatal(err)
	}
	env := &hostcalls.Env{Module: "test", Roots: []string{publish}}
	var info abi.MountInfo
	if err := hostCall(t, env, abi.HostCallMountInfo, &abi.MountInfoRequest{Target: target}, &info); err != nil {
		t.Fatal(err)
	}
	if !info.Mounted || !info.BlockDevice {
		t.Fatalf("mount_info = %+v, want a bound block device", info)
	}
	// The file the device was bound on is no mount point once unbound.
	mounttest.Unmount(t, target)
	var after abi.MountInfo
	if err := hostCall(t, env, abi.HostCallMountInfo, &abi.MountInfoRequest{Target: target}, &after); err != nil || after.Mounted || after.BlockDevice {
		t.Fatalf("mount_info after unmount = %+v, %v", after, err)
	}
}
