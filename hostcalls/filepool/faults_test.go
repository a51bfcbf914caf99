package filepool_test

import (
	"context"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
)

// A pool whose filesystem turned read-only (the kernel does so when a
// write error aborts an ext4 journal) refuses writes with
// FAILED_PRECONDITION, as the folder pool does: nothing about the caller's
// permissions is wrong, and PERMISSION_DENIED would say so.
func TestReadOnlyPoolIsFailedPrecondition(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind-mounts the pool read-only")
	}
	p := newPool(t)
	create(t, p, "vol", mib)
	root := p.Root()
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	// Opened again: the first pool's folder descriptor is of the mount
	// below, still writable.
	p, err := filepool.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	for what, err := range map[string]error{
		"create": p.Create(ctx, "new", mib, false),
		"resize": p.Resize(ctx, "vol", 2*mib, false),
	} {
		if got := abi.CodeOf(err); got != abi.FailedPrecondition {
			t.Errorf("%s on a read-only pool: code %v (%v), want FAILED_PRECONDITION", what, got, err)
		}
	}
}

// A clone that runs out of room in the pool's filesystem answers
// RESOURCE_EXHAUSTED (the disk-fault tier found INTERNAL).
func TestCloneOutOfSpaceIsResourceExhausted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a small tmpfs as the pool")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=3m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	p, err := filepool.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	f, err := os.Create(root + "/src")
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(make([]byte, 2<<20))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	err = p.Clone(context.Background(), "src", "dst")
	if got := abi.CodeOf(err); got != abi.ResourceExhausted {
		t.Fatalf("clone into a full pool: code %v (%v), want RESOURCE_EXHAUSTED", got, err)
	}
}
