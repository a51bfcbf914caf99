package iscsi

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
)

// kernelSession is one iSCSI session as sysfs shows it.
type kernelSession struct {
	ID          int
	Key         sessionKey
	State       string // LOGGED_IN, FAILED, FREE
	TargetState string // SCANNED once the kernel's first LUN scan is done; "" on kernels without it
	TargetID    int    // SCSI target id inside the host
	Host        int    // SCSI host number
	// Address is the portal address exactly as the kernel prints it; udev
	// uses this string in /dev/disk/by-path names.
	Address string
	devDir  string // resolved /sys/devices/.../hostH/sessionN
}

// lunDevice is one SCSI device (one LUN) of a session.
type lunDevice struct {
	LUN   int
	Dir   string // sysfs device dir .../H:C:T:L
	Block string // kernel block device name (sdX), "" while sd has not attached it
}

// Sysfs reads iSCSI sessions and their SCSI devices under a sysfs mount
// (Root, "/sys" on a host). It is the one reader of the initiator's sysfs:
// the initiator finds its sessions and LUNs with it, and Devices tells a
// module's iSCSI disks from others with it.
type Sysfs struct{ Root string }

func (s Sysfs) path(p ...string) string { return filepath.Join(append([]string{s.Root}, p...)...) }

// sessions lists every iSCSI session. Sessions that vanish while being read
// are skipped: sysfs is a live view.
func (s Sysfs) sessions() ([]kernelSession, error) {
	ents, err := os.ReadDir(s.path("class", "iscsi_session"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no iscsi transport loaded: no sessions
	}
	if err != nil {
		return nil, fmt.Errorf("list iSCSI sessions: %w", err)
	}
	var out []kernelSession
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), "session")
		n, err := strconv.Atoi(id)
		if !ok || err != nil {
			continue
		}
		ks, err := s.session(n)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, ks)
	}
	return out, nil
}

// session reads session n.
func (s Sysfs) session(n int) (kernelSession, error) {
	name := "session" + strconv.Itoa(n)
	dir := s.path("class", "iscsi_session", name)
	ks := kernelSession{ID: n}
	var err error
	if ks.Key.IQN, err = readAttr(dir, "targetname"); err != nil {
		return ks, err
	}
	if ks.State, err = readAttr(dir, "state"); err != nil {
		return ks, err
	}
	ks.TargetState, _ = readAttr(dir, "target_state")
	if v, err := readAttr(dir, "target_id"); err == nil {
		ks.TargetID, _ = strconv.Atoi(v)
	}
	if ks.Address, ks.Key.Portal, err = s.portal(n); err != nil {
		return ks, err
	}
	if ks.devDir, err = filepath.EvalSymlinks(filepath.Join(dir, "device")); err != nil {
		return ks, err
	}
	host, ok := strings.CutPrefix(filepath.Base(filepath.Dir(ks.devDir)), "host")
	if ks.Host, err = strconv.Atoi(host); !ok || err != nil {
		return ks, fmt.Errorf("%s: no SCSI host above %s", name, ks.devDir)
	}
	return ks, nil
}

// portal reads the portal session n is connected to: the address as the
// kernel prints it, and parsed (IPv4-mapped addresses unmapped).
func (s Sysfs) portal(n int) (string, netip.AddrPort, error) {
	conn := s.path("class", "iscsi_connection", "connection"+strconv.Itoa(n)+":0")
	address, err := readAttr(conn, "persistent_address")
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	port, err := readAttr(conn, "persistent_port")
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	addr, err := netip.ParseAddr(address)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("session%d: address %q: %w", n, address, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("session%d: port %q: %w", n, port, err)
	}
	return address, netip.AddrPortFrom(addr.Unmap(), uint16(p)), nil
}

// DiskPortal returns the portal of the iSCSI session whose disk the block
// device block (its kernel name, sdX) is; ok is false for a disk of no
// iSCSI session.
func (s Sysfs) DiskPortal(block string) (portal netip.AddrPort, ok bool, err error) {
	link, err := os.Readlink(s.path("class", "block", block))
	if err != nil {
		return netip.AddrPort{}, false, err
	}
	_, rest, found := strings.Cut(link, "/session")
	if !found {
		return netip.AddrPort{}, false, nil
	}
	id, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(id)
	if err != nil {
		return netip.AddrPort{}, false, nil
	}
	if _, portal, err = s.portal(n); err != nil {
		return netip.AddrPort{}, false, err
	}
	return portal, true, nil
}

// DiskTarget returns the portal, target IQN and LUN of the iSCSI disk
// block (its kernel name, sdX); ok is false where sysfs does not show all
// three.
func (s Sysfs) DiskTarget(block string) (portal netip.AddrPort, iqn string, lun int, ok bool) {
	link, err := os.Readlink(s.path("class", "block", block))
	if err != nil {
		return netip.AddrPort{}, "", 0, false
	}
	_, rest, found := strings.Cut(link, "/session")
	if !found {
		return netip.AddrPort{}, "", 0, false
	}
	id, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(id)
	if err != nil {
		return netip.AddrPort{}, "", 0, false
	}
	// .../sessionN/targetH:C:T/H:C:T:L/block/sdX
	hctl := filepath.Base(filepath.Dir(filepath.Dir(link)))
	if lun, ok = parseHCTL(hctl); !ok {
		return netip.AddrPort{}, "", 0, false
	}
	if _, portal, err = s.portal(n); err != nil {
		return netip.AddrPort{}, "", 0, false
	}
	iqn, err = readAttr(s.path("class", "iscsi_session", "session"+id), "targetname")
	if err != nil || iqn == "" {
		return netip.AddrPort{}, "", 0, false
	}
	return portal, iqn, lun, true
}

// WWID returns a SCSI disk's world-wide identifier (device/wwid, e.g. the
// naa. name a LIO backstore carries), "" where the kernel shows none.
func (s Sysfs) WWID(block string) string {
	id, err := readAttr(s.path("class", "block", block, "device"), "wwid")
	if err != nil {
		return ""
	}
	return id
}

// find returns the session for k, if any. A session in recovery (FAILED)
// still counts: the kernel re-establishes it, and a second login would only
// be refused.
func (s Sysfs) find(k sessionKey) (kernelSession, bool, error) {
	all, err := s.sessions()
	if err != nil {
		return kernelSession{}, false, err
	}
	for _, ks := range all {
		if ks.Key == k {
			return ks, true, nil
		}
	}
	return kernelSession{}, false, nil
}

// luns lists the SCSI devices of a session.
func (s Sysfs) luns(ks kernelSession) ([]lunDevice, error) {
	targets, err := filepath.Glob(filepath.Join(ks.devDir, "target*:*:*"))
	if err != nil {
		return nil, err
	}
	var out []lunDevice
	for _, t := range targets {
		ents, err := os.ReadDir(t)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("session%d: %w", ks.ID, err)
		}
		for _, e := range ents {
			lun, ok := parseHCTL(e.Name())
			if !ok {
				continue
			}
			d := lunDevice{LUN: lun, Dir: filepath.Join(t, e.Name())}
			if bs, err := os.ReadDir(filepath.Join(d.Dir, "block")); err == nil && len(bs) > 0 {
				d.Block = bs[0].Name()
			}
			out = append(out, d)
		}
	}
	return out, nil
}

// lun returns the SCSI device of one LUN of a session.
func (s Sysfs) lun(ks kernelSession, lun int) (lunDevice, bool, error) {
	all, err := s.luns(ks)
	if err != nil {
		return lunDevice{}, false, err
	}
	for _, d := range all {
		if d.LUN == lun {
			return d, true, nil
		}
	}
	return lunDevice{}, false, nil
}

// scan asks the kernel to probe one LUN of a session. The write returns
// when the probe is done, so a LUN the target does not present is known to
// be absent afterwards.
func (s Sysfs) scan(ks kernelSession, lun int) error {
	f := s.path("class", "scsi_host", "host"+strconv.Itoa(ks.Host), "scan")
	v := fmt.Sprintf("0 %d %d", ks.TargetID, lun)
	if err := sysattr.Write(f, v); err != nil {
		return fmt.Errorf("scan LUN %d of session%d: %w", lun, ks.ID, err)
	}
	return nil
}

// size returns the size in bytes of a block device by its kernel name.
func (s Sysfs) size(block string) (int64, error) {
	v, err := readAttr(s.path("class", "block", block), "size")
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", block, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %q: %w", block, v, err)
	}
	return n * 512, nil // sysfs counts 512-byte sectors whatever the block size
}

// parseHCTL parses "H:C:T:L" and returns L.
func parseHCTL(name string) (int, bool) {
	parts := strings.Split(name, ":")
	if len(parts) != 4 {
		return 0, false
	}
	for _, p := range parts {
		if !isDigits(p) {
			return 0, false
		}
	}
	l, err := strconv.Atoi(parts[3])
	return l, err == nil
}

func readAttr(dir, name string) (string, error) { return sysattr.Read(filepath.Join(dir, name)) }
