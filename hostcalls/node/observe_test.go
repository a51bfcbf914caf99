package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// TestOwnedMountDeviceCheckFails: a mount of a device whose check fails
// (a family that cannot tell) is neither owned nor not owned: OwnedMount
// answers UNAVAILABLE, so that the unstage is retried instead of leaving
// the mount behind for good. A device the grants refuse is not owned.
func TestOwnedMountDeviceCheckFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "staging")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	// A tmpfs whose source reads as a device: the mount table shows it
	// as a whole filesystem of "/dev/fake/vol1".
	if err := unix.Mount("/dev/fake/vol1", p, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })

	boom := errors.New("cannot read sysfs")
	n := New(nil, []hostcalls.DeviceOwner{&fakeFamily{err: boom}})
	_, owned, err := n.OwnedMount(ctx, []string{"granted"}, p, "vol1")
	if status.Code(err) != codes.Unavailable || owned {
		t.Errorf("a failing device check: owned %v, %v; want UNAVAILABLE", owned, err)
	}

	n = New(nil, []hostcalls.DeviceOwner{&fakeFamily{}})
	real, owned, err := n.OwnedMount(ctx, []string{"granted"}, p, "vol1")
	if err != nil || owned || real != p {
		t.Errorf("a device the grants refuse: %q, owned %v, %v; want not owned", real, owned, err)
	}
}

// TestNamedFor: a mount or loop file is a volume's only when named for its
// local ID exactly, or as its image file; another ID that merely starts
// with it (local IDs may hold dots) or a snapshot's file is not.
func TestNamedFor(t *testing.T) {
	for _, c := range []struct {
		path, id string
		want     bool
	}{
		{"/pool/v1", "v1", true},
		{"/pool/v1.img", "v1", true},
		{"/pool/a.b", "a", false},
		{"/pool/a.b", "a.b", true},
		{"/pool/a.b.img", "a.b", true},
		{"/pool/a.b.img", "a", false},
		{"/pool/v1.snap", "v1", false},
		{"/pool/v1", "", false},
		{"/pool/v10", "v1", false},
	} {
		if got := namedFor(c.path, c.id); got != c.want {
			t.Errorf("namedFor(%q, %q) = %v, want %v", c.path, c.id, got, c.want)
		}
	}
}
