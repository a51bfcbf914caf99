package dm

import (
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// fakeSystem is a kernel with a thin pool wasmcsi-thin (253:0) on /dev/sdb
// (8:16) and /dev/sdc (8:32), its thin device wasmcsi-thin-5 (253:1), a
// linear device under the prefix, LVM's thin pool and a thin device of it
// named under the prefix.
type fakeSystem struct {
	nodes  map[string]uint64 // node path (links followed) -> device number
	names  map[uint64]string // device number -> dm name
	tables map[string][]Target
}

func newFakeSystem() *fakeSystem {
	dev := func(major, minor uint32) uint64 { return unix.Mkdev(major, minor) }
	return &fakeSystem{
		nodes: map[string]uint64{
			"/dev/sdb": dev(8, 16), "/dev/sdba": dev(65, 160), "/dev/sdc": dev(8, 32),
			"/dev/nvme0n1": dev(259, 0), "/dev/nvme0n10": dev(259, 9),
			"/dev/mapper/wasmcsi-thin":   dev(253, 0),
			"/dev/mapper/wasmcsi-thin-5": dev(253, 1),
			"/dev/dm-1":                  dev(253, 1),
			// A node under the granted name that leads to another disk.
			"/dev/mapper/wasmcsi-planted": dev(8, 0),
			"/dev/mapper/wasmcsi-linear":  dev(253, 2),
			"/dev/mapper/vg0-pool":        dev(253, 3),
			"/dev/mapper/wasmcsi-foreign": dev(253, 4),
		},
		names: map[uint64]string{
			dev(253, 0): "wasmcsi-thin", dev(253, 1): "wasmcsi-thin-5", dev(253, 2): "wasmcsi-linear",
			dev(253, 3): "vg0-pool", dev(253, 4): "wasmcsi-foreign",
		},
		tables: map[string][]Target{
			"wasmcsi-thin":    {{Length: 1 << 20, Type: "thin-pool", Params: "8:32 8:16 128 0 0"}},
			"wasmcsi-thin-5":  {{Length: 1 << 10, Type: "thin", Params: "253:0 5"}},
			"wasmcsi-linear":  {{Length: 1 << 10, Type: "linear", Params: "8:16 0"}},
			"vg0-pool":        {{Length: 1 << 20, Type: "thin-pool", Params: "8:48 8:64 128 0 0"}},
			"wasmcsi-foreign": {{Length: 1 << 10, Type: "thin", Params: "253:3 7"}},
		},
	}
}

func (f *fakeSystem) blockDev(path string) (uint64, bool, error) {
	dev, ok := f.nodes[path]
	if !ok {
		return 0, false, unix.ENOENT
	}
	return dev, true, nil
}

func (f *fakeSystem) dmName(dev uint64) (string, bool, error) {
	name, ok := f.names[dev]
	return name, ok, nil
}

func (f *fakeSystem) table(_ context.Context, m *Mapper, name string) ([]Target, error) {
	if err := m.confine(name); err != nil {
		return nil, err
	}
	t, ok := f.tables[name]
	if !ok {
		return nil, errors.New("no such device")
	}
	return t, nil
}

// TestOwnsDevice: a device is the family's only when it is, by device
// number, a thin device of a pool under the granted prefixes and its node
// is granted; a path that merely starts with a granted root, a node that
// leads elsewhere, the pool and the devices the pool is built on are not.
func TestOwnsDevice(t *testing.T) {
	o := owner{sys: newFakeSystem()}
	grant := []string{"/var/lib/wasmcsi/pools/dmthin", "wasmcsi-", "/dev/mapper/wasmcsi-", "/dev/sdb", "/dev/sdc", "/dev/nvme0n1"}
	for _, c := range []struct {
		what  string
		d     hostcalls.Device
		roots []string
		want  bool
	}{
		{"a thin device by name", hostcalls.Device{Path: "/dev/mapper/wasmcsi-thin-5"}, grant, true},
		{"a thin device by node", hostcalls.Device{Path: "/dev/disk/by-id/dm-name-wasmcsi-thin-5", Real: "/dev/dm-1"}, grant, true},
		{"a thin device under a folder root", hostcalls.Device{Path: "/dev/mapper/wasmcsi-thin-5"}, []string{"wasmcsi-", "/dev/mapper"}, true},
		{"another disk sharing a granted disk's prefix", hostcalls.Device{Path: "/dev/sdba"}, grant, false},
		{"another namespace sharing a granted one's prefix", hostcalls.Device{Path: "/dev/nvme0n10"}, grant, false},
		{"the pool's own data device", hostcalls.Device{Path: "/dev/sdb"}, grant, false},
		{"the pool's own data device by node", hostcalls.Device{Path: "/dev/sdb", Real: "/dev/sdb"}, grant, false},
		{"the pool's own metadata device", hostcalls.Device{Path: "/dev/sdc"}, grant, false},
		{"the pool device, whose I/O goes to the data device", hostcalls.Device{Path: "/dev/mapper/wasmcsi-thin"}, grant, false},
		{"a granted node leading to another disk", hostcalls.Device{Path: "/dev/mapper/wasmcsi-planted"}, grant, false},
		{"a device the family does not make", hostcalls.Device{Path: "/dev/mapper/wasmcsi-linear"}, grant, false},
		{"a thin device of a pool outside the prefixes", hostcalls.Device{Path: "/dev/mapper/wasmcsi-foreign"}, grant, false},
		{"a device outside the prefixes", hostcalls.Device{Path: "/dev/mapper/vg0-pool"}, grant, false},
		{"no node root granted", hostcalls.Device{Path: "/dev/mapper/wasmcsi-thin-5"}, []string{"wasmcsi-"}, false},
		{"the node root of another prefix", hostcalls.Device{Path: "/dev/mapper/wasmcsi-thin-5"}, []string{"wasmcsi-", "/dev/mapper/wasmcsi-other-"}, false},
		{"no name prefix granted", hostcalls.Device{Path: "/dev/mapper/wasmcsi-thin-5"}, []string{"/dev/mapper/wasmcsi-"}, false},
		{"a missing node", hostcalls.Device{Path: "/dev/mapper/wasmcsi-thin-6"}, grant, false},
	} {
		_, owned, err := o.OwnsDevice(context.Background(), c.d, c.roots)
		if err != nil || owned != c.want {
			t.Errorf("%s: owned %v, %v; want %v", c.what, owned, err, c.want)
		}
	}
}

// TestOwnsDeviceRealLoop: on the live kernel a loop device under a granted
// /dev root is no device of this family.
func TestOwnsDeviceRealLoop(t *testing.T) {
	looptest.Require(t)
	dev, _ := looptest.Device(t, 1<<20)
	for _, d := range []hostcalls.Device{{Path: dev}, {Path: dev, Real: dev}} {
		if _, owned, err := Devices.OwnsDevice(context.Background(), d, []string{"wasmcsi-", "/dev/loop", "/dev/"}); err != nil || owned {
			t.Errorf("%+v: owned %v, %v; want not owned", d, owned, err)
		}
	}
}

func TestParseDevNumber(t *testing.T) {
	if dev, err := parseDevNumber("253:17"); err != nil || dev != unix.Mkdev(253, 17) {
		t.Errorf("253:17: %d, %v", dev, err)
	}
	for _, s := range []string{"", "253", "253:", ":1", "253:1x", "a:b", "253:01"} {
		if _, err := parseDevNumber(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}
