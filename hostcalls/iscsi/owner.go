package iscsi

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Devices answers for the iSCSI disks this family logs in to: a disk is a
// module's when its session's portal is one the module was granted (roots
// are written "192.0.2.1:3260" or "[fd00::1]:3260"). Its identity is the
// disk's WWID, so a later check tells the volume's disk from another that a
// reboot or rescan put under the same /dev/sdX name.
var Devices hostcalls.DeviceOwner = owner{Sysfs{Root: "/sys"}}

type owner struct{ sys Sysfs }

func (o owner) OwnsDevice(_ context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	if d.Real == "" {
		return "", false, nil
	}
	block := filepath.Base(d.Real)
	// A disk reached through its by-path link, which names the portal:
	// ip-<portal>-iscsi-<iqn>-lun-<n>.
	if rest, ok := strings.CutPrefix(d.Path, "/dev/disk/by-path/ip-"); ok {
		for _, r := range roots {
			if strings.HasPrefix(rest, r+"-iscsi-") {
				return o.identity(block), true, nil
			}
		}
	}
	portal, ok, err := o.sys.DiskPortal(block)
	if err != nil || !ok {
		return "", false, nil // not an iSCSI disk, or one sysfs cannot place: not explained
	}
	for _, r := range roots {
		if ap, err := netip.ParseAddrPort(r); err == nil && netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) == portal {
			return o.identity(block), true, nil
		}
	}
	return "", false, nil
}

func (o owner) identity(block string) string {
	if id := o.sys.WWID(block); id != "" {
		return "wwid:" + id
	}
	return ""
}
