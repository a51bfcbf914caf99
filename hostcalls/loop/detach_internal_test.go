package loop

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// TestDetachBoundLeavesARebind: a device detached and bound again to
// another file, as another process may do as soon as the number is free,
// is not unbound by a later detach of the old binding (a cleanup, a sweep
// after a listing); Detach by path unbound it, which made a daemon's claim
// of a device it had just attached find the device unbound. The device
// still bound as described is unbound, and a free one is left as it is.
func TestDetachBoundLeavesARebind(t *testing.T) {
	requireLoop(t)
	dir := t.TempDir()
	mine, theirs := imageIn(t, dir, "mine.img"), imageIn(t, dir, "theirs.img")
	ctx := context.Background()
	d, err := Attach(ctx, mine, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := DetachBound(ctx, d); err != nil {
		t.Fatalf("detach of the bound device: %v", err)
	}
	if _, ok, err := Find(ctx, mine); err != nil || ok {
		t.Fatalf("after DetachBound the file is still attached (%v, %v)", ok, err)
	}
	if err := DetachBound(ctx, d); err != nil {
		t.Fatalf("second detach, of a free device: %v", err)
	}

	rebind(t, d.Path, theirs)
	if err := DetachBound(ctx, d); err != nil {
		t.Fatalf("detach of a device another file backs now: %v", err)
	}
	now, bound, err := Status(ctx, d.Path)
	if err != nil || !bound || now.BackingFile != theirs {
		t.Fatalf("after a detach of the old binding %s = %+v, %v, %v; want still backed by %s", d.Path, now, bound, err, theirs)
	}

	// Held exclusively (as a mount holds it), the other file's device is
	// still not ours: no FAILED_PRECONDITION for a device in use.
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = DetachBound(ctx, d)
	unix.Close(fd)
	if err != nil {
		t.Fatalf("detach of a held device another file backs: %v", err)
	}
	// Held and still bound as described, it is in use.
	if fd, err = unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	err = DetachBound(ctx, now)
	unix.Close(fd)
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("detach of a held device as described = %v, want FAILED_PRECONDITION", err)
	}
	if err := DetachBound(ctx, now); err != nil {
		t.Fatalf("detach of the other file's device as described: %v", err)
	}
	if _, ok, err := Find(ctx, theirs); err != nil || ok {
		t.Fatalf("after DetachBound of its description the other file is still attached (%v, %v)", ok, err)
	}
}
