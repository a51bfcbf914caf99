package iscsi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Devices answers for the iSCSI disks this family logs in to: a disk is a
// module's when its session's portal is one the module was granted (roots
// are written "192.0.2.1:3260" or "[fd00::1]:3260"). Its identity is the
// disk's WWID, so a later check tells the volume's disk from another that a
// reboot or rescan put under the same /dev/sdX name.
//
// The disk is told by the device number of the node named (links
// followed), which must be that of the kernel's disk of the same name;
// the kernel's sysfs places it in its session. A /dev/disk/by-path name
// counts only where sysfs cannot be read. A disk another device holds (a
// thin pool built on it) is the holder's, never staged. That rule holds
// when the disk is first claimed; a recorded stage's disk (d.Staged) is
// accepted though held, since multipathd claiming it, or what a workload
// builds on its raw block volume (dm-crypt, LVM, md), holds it too, and
// the WWID, which the host compares with the record, tells the volume's
// disk from any other.
var Devices hostcalls.DeviceOwner = owner{Sysfs{Root: "/sys"}}

type owner struct{ sys Sysfs }

func (o owner) OwnsDevice(_ context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	if d.Real == "" {
		return "", false, nil
	}
	block := filepath.Base(d.Real)
	if !o.sys.isNode(d.Real, block) || (!d.Staged && o.sys.held(block)) {
		return "", false, nil
	}
	portal, ok, err := o.sys.DiskPortal(block)
	if err == nil {
		if !ok {
			return "", false, nil // not an iSCSI disk
		}
		for _, r := range roots {
			if ap, err := netip.ParseAddrPort(r); err == nil && netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) == portal {
				return o.identity(block), true, nil
			}
		}
		return "", false, nil
	}
	// A disk sysfs cannot place, reached through its by-path link, which
	// names the portal: ip-<portal>-iscsi-<iqn>-lun-<n>.
	if rest, ok := strings.CutPrefix(d.Path, "/dev/disk/by-path/ip-"); ok {
		for _, r := range roots {
			if strings.HasPrefix(rest, r+"-iscsi-") {
				return o.identity(block), true, nil
			}
		}
	}
	return "", false, nil
}

// identity is what tells the volume's disk from another under the same
// name later: its WWID, or, for a target that reports none, the target
// and LUN it is ("lun:<portal>,<target IQN>,<LUN>"), which a reboot or
// rescan cannot give another volume's disk. "" only where sysfs shows
// neither.
func (o owner) identity(block string) string {
	if id := o.sys.WWID(block); id != "" {
		return "wwid:" + id
	}
	if portal, iqn, lun, ok := o.sys.DiskTarget(block); ok {
		return fmt.Sprintf("lun:%s,%s,%d", portal, iqn, lun)
	}
	return ""
}

// isNode reports whether the block node at path is the kernel's block
// device block: the same device number as sysfs gives it.
func (s Sysfs) isNode(path, block string) bool {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return false
	}
	dev, err := readAttr(s.path("class", "block", block), "dev")
	return err == nil && dev == fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// held reports whether another device (device-mapper, md) holds the block
// device block, or whether that cannot be read.
func (s Sysfs) held(block string) bool {
	holders, err := os.ReadDir(s.path("class", "block", block, "holders"))
	if errors.Is(err, fs.ErrNotExist) {
		return false // a kernel without holders for this device
	}
	return err != nil || len(holders) > 0
}
