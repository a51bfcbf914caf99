package nvme

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/netaddr"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
)

// Devices answers for the NVMe/TCP namespaces this family connects: a
// disk is a module's when one of its controllers reaches an address the
// module was granted. The disk is told by the device number of the node
// named (links followed), which must be that of the kernel's disk of the
// same name; its identity is the namespace's UUID, so a later check tells
// the volume's disk from another that a reconnect put under the same
// /dev/nvmeXnY name. A disk another device holds is the holder's, never
// staged, unless it is a recorded stage's (d.Staged).
var Devices hostcalls.DeviceOwner = owner{sysfs: "/sys"}

type owner struct{ sysfs string }

func (o owner) OwnsDevice(_ context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	if d.Real == "" {
		return "", false, nil
	}
	disk := filepath.Base(d.Real)
	if !isHeadDisk(disk) {
		return "", false, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(d.Real, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", false, nil
	}
	dev, err := sysattr.Read(filepath.Join(o.sysfs, "class", "block", disk, "dev"))
	if err != nil || dev != fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)) {
		return "", false, nil
	}
	if !d.Staged {
		if h, _ := os.ReadDir(filepath.Join(o.sysfs, "class", "block", disk, "holders")); len(h) > 0 {
			return "", false, nil
		}
	}
	u := diskUUID(o.sysfs, disk)
	if u == "" {
		return "", false, nil
	}
	for _, ap := range o.addrs(disk) {
		if netaddr.Granted(roots, ap, DefaultPort) {
			return "nvme-uuid:" + u, true, nil
		}
	}
	return "", false, nil
}

// addrs answers the TCP addresses of the controllers that show disk: its
// device is a controller, or (native multipath) a subsystem whose
// controllers are its "nvme<N>" entries.
func (o owner) addrs(disk string) []netip.AddrPort {
	devDir := filepath.Join(o.sysfs, "class", "block", disk, "device")
	ctrls := []string{devDir}
	if _, err := os.Stat(filepath.Join(devDir, "transport")); err != nil {
		ents, _ := os.ReadDir(devDir)
		ctrls = nil
		for _, e := range ents {
			if n, ok := strings.CutPrefix(e.Name(), "nvme"); ok && isDigits(n) {
				ctrls = append(ctrls, filepath.Join(devDir, e.Name()))
			}
		}
	}
	var out []netip.AddrPort
	for _, c := range ctrls {
		if t, _ := sysattr.Read(filepath.Join(c, "transport")); t != "tcp" {
			continue
		}
		a, _ := sysattr.Read(filepath.Join(c, "address"))
		var addr, port string
		for _, kv := range strings.Split(a, ",") {
			if v, ok := strings.CutPrefix(kv, "traddr="); ok {
				addr = v
			} else if v, ok := strings.CutPrefix(kv, "trsvcid="); ok {
				port = v
			}
		}
		ip, err := netip.ParseAddr(addr)
		p, perr := strconv.ParseUint(port, 10, 16)
		if err == nil && perr == nil {
			out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(p)))
		}
	}
	return out
}
