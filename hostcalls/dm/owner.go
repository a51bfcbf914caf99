package dm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Devices answers for the thin devices this family makes. A device is a
// module's when it is, by its device number (the node named, links
// followed), a device-mapper device whose kernel name lies under one of
// the module's granted name prefixes, whose /dev/mapper node a granted /dev
// root covers, and whose table is one thin target of a thin pool that is
// itself under a granted prefix. A name alone settles nothing: a node
// inside a granted folder may lead anywhere, the pool device passes its
// I/O to the pool's data device, and the devices a pool is built on are
// granted to build it, never to be staged.
var Devices hostcalls.DeviceOwner = owner{sys: kernel{}}

type owner struct{ sys system }

// system is what the owner asks the kernel; tests fake it.
type system interface {
	// blockDev returns the device number of the block device at path,
	// links followed; ok is false when path is no block device.
	blockDev(path string) (dev uint64, ok bool, err error)
	// dmName returns the device-mapper name of dev; ok is false when dev is
	// not a device-mapper device.
	dmName(dev uint64) (name string, ok bool, err error)
	// table returns the live table of the device named name, which m's
	// prefixes cover.
	table(ctx context.Context, m *Mapper, name string) ([]Target, error)
}

func (o owner) OwnsDevice(ctx context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	var prefixes, nodeRoots []string
	for _, r := range roots {
		switch {
		case strings.HasPrefix(r, Dir+"/") || filepath.Clean(r) == Dir:
			nodeRoots = append(nodeRoots, r)
		case !strings.HasPrefix(r, "/"):
			prefixes = append(prefixes, r)
		}
	}
	if len(prefixes) == 0 || len(nodeRoots) == 0 {
		return "", false, nil
	}
	path := d.Real
	if path == "" {
		path = d.Path
	}
	dev, ok, err := o.sys.blockDev(path)
	if err != nil || !ok {
		return "", false, nil // the node checks report a missing or odd node
	}
	name, ok, err := o.sys.dmName(dev)
	if err != nil || !ok {
		return "", false, err
	}
	if Confine(prefixes, name) != nil || !nodeGranted(nodeRoots, name) {
		return "", false, nil
	}
	m, err := New(prefixes...)
	if err != nil {
		return "", false, nil
	}
	table, err := o.sys.table(ctx, m, name)
	if err != nil {
		return "", false, fmt.Errorf("dm device %s: %w", name, err)
	}
	if len(table) != 1 || table[0].Type != "thin" {
		return "", false, nil // the pool itself, or a device this family does not make
	}
	f := strings.Fields(table[0].Params)
	if len(f) < 2 {
		return "", false, nil
	}
	poolDev, err := parseDevNumber(f[0])
	if err != nil {
		return "", false, nil
	}
	pool, ok, err := o.sys.dmName(poolDev)
	if err != nil || !ok {
		return "", false, err
	}
	if Confine(prefixes, pool) != nil {
		return "", false, nil
	}
	pt, err := o.sys.table(ctx, m, pool)
	if err != nil {
		return "", false, fmt.Errorf("dm pool %s: %w", pool, err)
	}
	if len(pt) != 1 || pt[0].Type != "thin-pool" {
		return "", false, nil
	}
	return "", true, nil
}

// nodeGranted reports whether a /dev root covers name's node
// /dev/mapper/<name>: a folder root covers the nodes below it, any other
// root under /dev/mapper/ is a name prefix ("/dev/mapper/wasmcsi-").
func nodeGranted(roots []string, name string) bool {
	node := filepath.Join(Dir, name)
	for _, r := range roots {
		if _, err := hostcalls.Confine([]string{r}, node, false); err == nil {
			return true
		}
		if !strings.HasSuffix(r, "/") && strings.HasPrefix(node, r) && filepath.Dir(r) == Dir {
			return true
		}
	}
	return false
}

// parseDevNumber parses "major:minor" as the kernel writes it in tables.
func parseDevNumber(s string) (uint64, error) {
	var major, minor uint32
	if n, err := fmt.Sscanf(s, "%d:%d", &major, &minor); err != nil || n != 2 || fmt.Sprintf("%d:%d", major, minor) != s {
		return 0, fmt.Errorf("device number %q", s)
	}
	return unix.Mkdev(major, minor), nil
}

// kernel is system on the live kernel.
type kernel struct{}

func (kernel) blockDev(path string) (uint64, bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, false, err
	}
	return st.Rdev, st.Mode&unix.S_IFMT == unix.S_IFBLK, nil
}

func (kernel) dmName(dev uint64) (string, bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/dm/name", unix.Major(dev), unix.Minor(dev)))
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("dm name of %d:%d: %w", unix.Major(dev), unix.Minor(dev), err)
	}
	return strings.TrimSpace(string(b)), true, nil
}

func (kernel) table(ctx context.Context, m *Mapper, name string) ([]Target, error) {
	return m.Table(ctx, name)
}
