package loop

import (
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWalkSeesRebinding: a search skips a device it has read before only
// while the device is bound as it was then. The device of file a is
// unbound and bound to file c at once, so it keeps its number, and c was never attached through this package (no hint): Find
// of c must walk to that device and find it, not skip it as a's.
func TestWalkSeesRebinding(t *testing.T) {
	requireLoop(t)
	ctx := context.Background()
	root := t.TempDir()
	a, b, c := imageIn(t, root, "a.img"), imageIn(t, root, "b.img"), imageIn(t, root, "c.img")
	da, err := Attach(ctx, a, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Attach(ctx, b, Options{}); err != nil {
		t.Fatal(err)
	}
	// A search for c reads a's and b's devices, and remembers them.
	if d, found, err := Find(ctx, c); err != nil || found {
		t.Fatalf("Find(c) before any attach = %+v, %v, %v; want not found", d, found, err)
	}

	fd, err := openNode(da.Path, unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	unix.Close(fd) // the unbind finishes on the last close
	if err != nil {
		t.Fatal(err)
	}
	hints.Delete(fileID{da.Dev, da.Inode})
	waitUnbound(ctx, da.Path)
	cf, err := openNode(c, unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(cf)
	if fd, err = openNode(da.Path, unix.O_RDWR); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	err = unix.IoctlLoopConfigure(fd, &unix.LoopConfig{Fd: uint32(cf)})
	if errors.Is(err, unix.EBUSY) {
		t.Skipf("%s was taken by another attacher before it could be bound again", da.Path)
	}
	if err != nil {
		t.Fatalf("LOOP_CONFIGURE %s with c: %v", da.Path, err)
	}

	d, found, err := Find(ctx, c)
	if err != nil || !found || d.Path != da.Path {
		t.Fatalf("Find(c) after %s was bound to it = %+v, %v, %v; want %s", da.Path, d, found, err, da.Path)
	}
	// And a is attached nowhere now.
	if d, found, err := Find(ctx, a); err != nil || found {
		t.Fatalf("Find(a) after its device was bound to c = %+v, %v, %v; want not found", d, found, err)
	}
}
