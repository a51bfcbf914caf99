package lvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Devices answers for the LVs this family makes. A device is a module's
// when, by its device number (the node named, links followed), it is a
// device-mapper device LVM made (its uuid starts with "LVM-") and an active
// LV with that number carries the owner tag in a VG, or thin pool, the
// module's roots grant. The identity is the LV's UUID, so an LV made again
// under the same name is told from the one staged.
var Devices hostcalls.DeviceOwner = owner{m: Manager{Run: Tool{}}}

type owner struct{ m Manager }

func (o owner) OwnsDevice(ctx context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	g := parseGrants(roots)
	if len(g.vgs) == 0 && len(g.pools) == 0 {
		return "", false, nil
	}
	path := d.Real
	if path == "" {
		path = d.Path
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", false, nil // the node checks report a missing or odd node
	}
	major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	uuid, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/dm/uuid", major, minor))
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("lvm: dm uuid of %d:%d: %w", major, minor, err)
	}
	if !strings.HasPrefix(string(uuid), "LVM-") {
		return "", false, nil
	}
	vgs := map[string]bool{}
	for vg := range g.vgs {
		vgs[vg] = true
	}
	for vg := range g.pools {
		vgs[vg] = true
	}
	for vg := range vgs {
		lvs, err := o.m.LVs(ctx, vg)
		if err != nil {
			continue // a granted VG that is missing holds nothing of ours
		}
		for i := range lvs {
			lv := &lvs[i]
			if lv.Major == int64(major) && lv.Minor == int64(minor) && lv.active() {
				if !lv.owned() || g.lvAllowed(lv.VG, lv.Pool) != nil {
					return "", false, nil
				}
				return lv.UUID, true, nil
			}
		}
	}
	return "", false, nil
}
