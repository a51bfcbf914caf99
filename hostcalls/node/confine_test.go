package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// fakeFamily claims the devices it is told to, under the root "granted",
// and records what it was asked.
type fakeFamily struct {
	byName, byNode string // claimed Path (asked by name) and Real
	err            error
	asked          []hostcalls.Device
}

func (f *fakeFamily) OwnsDevice(_ context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	f.asked = append(f.asked, d)
	if f.err != nil {
		return "", false, f.err
	}
	if len(roots) != 1 || roots[0] != "granted" {
		return "", false, nil
	}
	switch {
	case d.Real == "" && d.Path == f.byName:
		return "fake:name", true, nil
	case d.Real != "" && d.Real == f.byNode:
		return "fake:node", true, nil
	}
	return "", false, nil
}

// blockNode makes a block device node (of a loop minor nobody needs to
// open) in a fresh folder: ConfineDevice stats the node, never opens it.
func blockNode(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a block device node")
	}
	p := filepath.Join(t.TempDir(), "disk")
	if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 4095))); err != nil {
		t.Skipf("cannot make a device node here: %v", err)
	}
	return p
}

// TestConfineDeviceAsksFamilies: whether a device is staged is what a
// device-making family answers, by name or by node, and its identity is
// what the stage record keeps; with no family claiming it the device is
// refused, and a family that cannot tell stops the check.
func TestConfineDeviceAsksFamilies(t *testing.T) {
	ctx := context.Background()
	dev := blockNode(t)
	link := filepath.Join(filepath.Dir(dev), "by-name")
	if err := os.Symlink(dev, link); err != nil {
		t.Fatal(err)
	}
	granted := []string{"granted"}

	fam := &fakeFamily{byName: "/dev/fake/vol1", byNode: dev}
	n := New(nil, []hostcalls.DeviceOwner{fam})
	path, id, err := n.ConfineDevice(ctx, "backend \"x\"", granted, "/dev/fake/vol1")
	if err != nil || path != "/dev/fake/vol1" || id != "fake:name" {
		t.Fatalf("claimed by name: got %q, %q, %v", path, id, err)
	}
	path, id, err = n.ConfineDevice(ctx, "backend \"x\"", granted, link)
	if err != nil || path != dev || id != "fake:node" {
		t.Fatalf("claimed by node: got %q, %q, %v", path, id, err)
	}
	if last := fam.asked[len(fam.asked)-1]; last.Path != link || last.Real != dev {
		t.Errorf("family asked %+v, want the named link and its real node", last)
	}

	// The same device under roots the family does not claim it for, or
	// with no family at all, is refused with INTERNAL (a module's fault).
	for name, n := range map[string]*Node{
		"not claimed": New(nil, []hostcalls.DeviceOwner{fam}),
		"no family":   New(nil, nil),
	} {
		if _, _, err := n.ConfineDevice(ctx, "backend \"x\"", []string{"other"}, link); status.Code(err) != codes.Internal {
			t.Errorf("%s: got %v, want INTERNAL", name, err)
		}
	}

	// The first family that claims it answers; later ones are not asked.
	later := &fakeFamily{byNode: dev}
	n = New(nil, []hostcalls.DeviceOwner{fam, later})
	if _, id, err := n.ConfineDevice(ctx, "backend \"x\"", granted, link); err != nil || id != "fake:node" {
		t.Fatalf("two families: got %q, %v", id, err)
	}
	for _, d := range later.asked {
		if d.Real != "" {
			t.Errorf("a later family was asked about the node after the first claimed it: %+v", d)
		}
	}

	boom := errors.New("cannot read the device")
	n = New(nil, []hostcalls.DeviceOwner{&fakeFamily{err: boom}, &fakeFamily{byNode: dev}})
	if _, _, err := n.ConfineDevice(ctx, "backend \"x\"", granted, link); !errors.Is(err, boom) {
		t.Errorf("a family's error: got %v, want %v", err, boom)
	}
}

// TestStagedDeviceAsksAsStaged: a recorded stage's device is checked with
// the families told it is a staged one (so a holder stacked on it since
// does not make it another's), and is still the volume's only with the
// identity the record keeps.
func TestStagedDeviceAsksAsStaged(t *testing.T) {
	ctx := context.Background()
	dev := blockNode(t)
	granted := []string{"granted"}
	fam := &fakeFamily{byNode: dev}
	n := New(nil, []hostcalls.DeviceOwner{fam})
	if !n.StagedDevice(ctx, "backend \"x\"", granted, dev, "fake:node") {
		t.Errorf("staged device with its recorded identity: not the volume's")
	}
	for _, d := range fam.asked {
		if !d.Staged {
			t.Errorf("family asked %+v, not as a staged device", d)
		}
	}
	if n.StagedDevice(ctx, "backend \"x\"", granted, dev, "fake:other") {
		t.Errorf("staged device with another identity: still the volume's")
	}
	if n.StagedDevice(ctx, "backend \"x\"", []string{"other"}, dev, "fake:node") {
		t.Errorf("staged device the grants no longer explain: still the volume's")
	}
	fam.asked = nil
	if _, _, err := n.ConfineDevice(ctx, "backend \"x\"", granted, dev); err != nil {
		t.Fatal(err)
	}
	for _, d := range fam.asked {
		if d.Staged {
			t.Errorf("node_stage's claim asked %+v as a staged device", d)
		}
	}
}

// TestConfineDeviceLoop: with the daemon's families, a real loop device is
// staged when its backing file lies inside the roots, with the file's
// identity, and refused otherwise.
func TestConfineDeviceLoop(t *testing.T) {
	ctx := context.Background()
	dev, file := looptest.Device(t, 1<<20)
	n := New(nil, catalog.DeviceOwners())
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	path, id, err := n.ConfineDevice(ctx, "backend \"x\"", []string{filepath.Dir(file)}, dev)
	if want := fmt.Sprintf("%d:%d", st.Dev, st.Ino); err != nil || path != dev || id != want {
		t.Fatalf("got %q, %q, %v; want %q, %q", path, id, err, dev, want)
	}
	if _, _, err := n.ConfineDevice(ctx, "backend \"x\"", []string{t.TempDir()}, dev); status.Code(err) != codes.Internal {
		t.Fatalf("backing file outside the roots: got %v, want INTERNAL", err)
	}
}

// TestBindDirectorySwappedAfterCheck: a directory ConfineDirectory
// accepted is swapped for a symlink to "/" before the stage binds it (a
// workload controlling a folder on its way). BindDirectory opens it
// beneath the module's root, so the bind fails and nothing is mounted;
// binding by the checked path mounted the host's root filesystem.
func TestBindDirectorySwappedAfterCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind mounts")
	}
	root, work := t.TempDir(), t.TempDir()
	dir := filepath.Join(root, "vol", "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n := New(nil, nil)
	real, err := n.ConfineDirectory("backend \"x\"", []string{root}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", dir); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(work, "staging")
	t.Cleanup(func() {
		for range 4 {
			if unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) != nil {
				break
			}
		}
	})
	err = n.BindDirectory(context.Background(), "backend \"x\"", []string{root}, real, target, false)
	if status.Code(err) != codes.Internal {
		t.Errorf("bind of a directory swapped for a link to /: %v, want INTERNAL (named outside its roots)", err)
	}
	var st, rootSt unix.Stat_t
	if unix.Stat("/", &rootSt) == nil && unix.Stat(target, &st) == nil && st.Dev == rootSt.Dev && st.Ino == rootSt.Ino {
		t.Fatal("the host's root filesystem is bound at the staging path")
	}
}
