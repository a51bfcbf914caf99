package dm

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// TestOwnsDeviceLive: on a real pool built on loop devices of files in a
// granted folder, the thin devices are the dm family's and stageable, by
// name and by node; the pool device and the loop devices it is built on
// are no family's, though their names and files lie under the grants.
func TestOwnsDeviceLive(t *testing.T) {
	p := newPool(t, "own")
	ctx := context.Background()
	thin, err := p.CreateThin(ctx, 1, 16*mib/SectorSize)
	if err != nil {
		t.Fatal(err)
	}
	info, err := p.m.Info(ctx, p.ThinName(1))
	if err != nil || !info.Exists {
		t.Fatalf("thin info %+v, %v", info, err)
	}
	node := fmt.Sprintf("/dev/dm-%d", info.Minor)
	data, bound, err := loop.Status(ctx, p.dat)
	if err != nil || !bound {
		t.Fatalf("data device %s: %v, %v", p.dat, bound, err)
	}
	folder := filepath.Dir(data.BackingFile)
	roots := []string{testPrefix, Dir + "/" + testPrefix, p.meta, p.dat, folder}
	// A loop device of a file in the same folder that nothing holds is
	// the loop family's: the grant is right, only the holder refuses.
	free, _ := looptest.Device(t, mib)
	freeData, _, err := loop.Status(ctx, free)
	if err != nil {
		t.Fatal(err)
	}
	freeRoots := []string{filepath.Dir(freeData.BackingFile)}

	for _, c := range []struct {
		what  string
		fam   hostcalls.DeviceOwner
		d     hostcalls.Device
		roots []string
		want  bool
	}{
		{"thin by name", Devices, hostcalls.Device{Path: thin}, roots, true},
		{"thin by node", Devices, hostcalls.Device{Path: node, Real: node}, roots, true},
		{"the pool device", Devices, hostcalls.Device{Path: p.Path()}, roots, false},
		{"the pool device by node", Devices, hostcalls.Device{Path: p.Path(), Real: p.Path()}, roots, false},
		{"the data device, granted by path", Devices, hostcalls.Device{Path: p.dat}, roots, false},
		{"the metadata device, granted by path", Devices, hostcalls.Device{Path: p.meta, Real: p.meta}, roots, false},
		{"the data device as a loop device", loop.Devices, hostcalls.Device{Path: p.dat, Real: p.dat}, roots, false},
		{"a free loop device of a granted file", loop.Devices, hostcalls.Device{Path: free, Real: free}, freeRoots, true},
	} {
		if _, owned, err := c.fam.OwnsDevice(ctx, c.d, c.roots); err != nil || owned != c.want {
			t.Errorf("%s: owned %v, %v; want %v", c.what, owned, err, c.want)
		}
	}
}

// TestStagedLoopDeviceHeld: a loop device that a workload stacked a
// device-mapper device on (here a linear target, as dm-crypt or LVM on a
// raw block volume) is refused when first claimed, but checked again as a
// recorded stage's device it is still the loop family's, with the identity
// it was staged with.
func TestStagedLoopDeviceHeld(t *testing.T) {
	m := newMapper(t)
	ctx := context.Background()
	dev, _ := looptest.Device(t, mib)
	data, bound, err := loop.Status(ctx, dev)
	if err != nil || !bound {
		t.Fatalf("loop device %s: %v, %v", dev, bound, err)
	}
	roots := []string{filepath.Dir(data.BackingFile)}
	d := hostcalls.Device{Path: dev, Real: dev}
	staged, owned, err := loop.Devices.OwnsDevice(ctx, d, roots)
	if err != nil || !owned || staged == "" {
		t.Fatalf("first claim of the free device = %q, %v, %v", staged, owned, err)
	}

	name := testPrefix + "stacked"
	if _, err := m.Create(ctx, name, []Target{{0, mib / SectorSize, "linear", dev + " 0"}}); err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)

	if _, owned, err := loop.Devices.OwnsDevice(ctx, d, roots); err != nil || owned {
		t.Errorf("first claim of the held device = %v, %v; want not owned", owned, err)
	}
	d.Staged = true
	if id, owned, err := loop.Devices.OwnsDevice(ctx, d, roots); err != nil || !owned || id != staged {
		t.Errorf("staged device, held = %q, %v, %v; want %q, true", id, owned, err, staged)
	}
}
