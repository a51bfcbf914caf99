package host

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
)

// A module's node_stage names what the host will mount or bind into a
// workload. The host never takes that on trust: a directory must lie inside
// the module's granted roots, and a device must be one the module's grants
// explain — a loop device backed by a file inside its roots, a device node
// that is itself inside its roots (for example /dev/mapper/<granted prefix>…),
// or an iSCSI disk of a granted portal. Anything else would let a module hand
// a pod the host's own disks.

func (s *Server) confineDirectory(b *backend, dir string) (string, error) {
	clean, err := hostcalls.Confine(b.mod.Grant().Roots, dir, false)
	if err != nil {
		return "", errf(codes.Internal, "backend %q named directory %q outside its roots", b.name, dir)
	}
	real, err := filepath.EvalSymlinks(clean)
	if err != nil {
		return "", fmt.Errorf("directory %s: %w", clean, err)
	}
	if _, err := hostcalls.Confine(b.mod.Grant().Roots, real, false); err != nil {
		return "", errf(codes.Internal, "backend %q directory %q resolves outside its roots", b.name, dir)
	}
	return real, nil
}

// confineDevice checks that dev is a device b's grants explain and
// returns its real path; for a loop device it also returns the identity
// of its backing file ("<st_dev>:<st_ino>"), which the stage record keeps.
func (s *Server) confineDevice(ctx context.Context, b *backend, dev string) (real, file string, err error) {
	roots := b.mod.Grant().Roots
	if !filepath.IsAbs(dev) {
		return "", "", errf(codes.Internal, "backend %q named a relative device %q", b.name, dev)
	}
	// A device node inside a granted root (prefix match, so a root such as
	// /dev/mapper/wasmcsi- grants every device named after it).
	for _, r := range roots {
		if strings.HasPrefix(filepath.Clean(dev), r) && strings.HasPrefix(r, "/dev/") {
			return dev, "", nil
		}
	}
	real, err = filepath.EvalSymlinks(dev)
	if err != nil {
		return "", "", fmt.Errorf("device %s: %w", dev, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(real, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", "", errf(codes.Internal, "backend %q named %q, which is not a block device", b.name, dev)
	}
	if strings.HasPrefix(filepath.Base(real), "loop") {
		d, bound, err := loop.Status(ctx, real)
		if err != nil {
			return "", "", err
		}
		if bound {
			if _, err := hostcalls.Confine(roots, d.BackingFile, false); err == nil {
				return real, fmt.Sprintf("%d:%d", d.Dev, d.Inode), nil
			}
		}
	}
	// iSCSI disks are reached through their by-path link, which names the
	// portal: ip-<portal>-iscsi-<iqn>-lun-<n>.
	if strings.HasPrefix(dev, "/dev/disk/by-path/ip-") {
		rest := strings.TrimPrefix(dev, "/dev/disk/by-path/ip-")
		for _, r := range roots {
			if strings.HasPrefix(rest, r+"-iscsi-") {
				return real, scsiIdentity(real), nil
			}
		}
	}
	if link, err := os.Readlink("/sys/class/block/" + filepath.Base(real)); err == nil && strings.Contains(link, "/session") {
		if s.iscsiDeviceGranted(real, roots) {
			return real, scsiIdentity(real), nil
		}
	}
	return "", "", errf(codes.Internal, "backend %q named device %q, which its grants do not explain", b.name, dev)
}

// iscsiDeviceGranted reports whether an iSCSI disk belongs to a session
// with a granted portal (sysfs: the session's connection address and port).
func (s *Server) iscsiDeviceGranted(dev string, roots []string) bool {
	link, err := os.Readlink("/sys/class/block/" + filepath.Base(dev))
	if err != nil {
		return false
	}
	i := strings.Index(link, "/session")
	if i < 0 {
		return false
	}
	session := link[i+1:]
	if j := strings.Index(session, "/"); j > 0 {
		session = session[:j]
	}
	conns, _ := filepath.Glob("/sys/class/iscsi_connection/connection" + strings.TrimPrefix(session, "session") + ":*")
	for _, c := range conns {
		addr, err1 := os.ReadFile(c + "/persistent_address")
		port, err2 := os.ReadFile(c + "/persistent_port")
		if err1 != nil || err2 != nil {
			continue
		}
		ip, err1 := netip.ParseAddr(strings.TrimSpace(string(addr)))
		n, err2 := strconv.ParseUint(strings.TrimSpace(string(port)), 10, 16)
		if err1 != nil || err2 != nil {
			continue
		}
		portal := netip.AddrPortFrom(ip.Unmap(), uint16(n))
		for _, r := range roots {
			// Roots are written "192.0.2.1:3260" or "[fd00::1]:3260".
			if ap, err := netip.ParseAddrPort(r); err == nil && netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) == portal {
				return true
			}
		}
	}
	return false
}

// stagedDevice reports whether a recorded stage's device is still the
// volume's: granted, and for a loop device backed by the file it was
// staged with (a reboot frees loop devices, and the same /dev/loopN node
// may be unbound or back another file, even another volume's in the same
// pool). A record without a device has none to lose.
func (s *Server) stagedDevice(ctx context.Context, b *backend, rec *state.Stage) bool {
	if rec.Device == "" {
		return true
	}
	_, file, err := s.confineDevice(ctx, b, rec.Device)
	return err == nil && file == rec.DeviceFile
}

// stagePresent reports whether a recorded stage is still in place: its
// device must still be the volume's (stagedDevice), and for mount access
// the staging path must be mounted, from that device when there is one.
func (s *Server) stagePresent(ctx context.Context, rec *state.Stage) (bool, error) {
	b, ok := s.backends.Load().get(rec.Backend)
	if !ok {
		return false, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", rec.Backend, rec.VolumeID)
	}
	if !s.stagedDevice(ctx, b, rec) {
		return false, nil
	}
	if rec.Block {
		return rec.Device != "", nil
	}
	e, err := mount.Info(rec.StagingPath)
	if err != nil {
		return false, nil // not mounted, or the path is gone
	}
	if rec.Device != "" {
		real, err := filepath.EvalSymlinks(rec.Device)
		if err != nil {
			return false, nil
		}
		// The mount's device number identifies it, except on btrfs,
		// whose mounts carry an anonymous device: there the source names it.
		var st unix.Stat_t
		sameDev := unix.Stat(real, &st) == nil && unix.Major(st.Rdev) == uint32(e.Major) && unix.Minor(st.Rdev) == uint32(e.Minor)
		if src, err := filepath.EvalSymlinks(e.Source); !sameDev && (err != nil || src != real) {
			return false, nil
		}
	}
	return true, nil
}

// scsiIdentity is a SCSI disk's world-wide identifier (sysfs
// device/wwid, e.g. the naa. name a LIO backstore carries), recorded at
// stage so that a later check can tell the volume's disk from another one
// that a reboot or rescan put under the same /dev/sdX name. "" where the
// kernel shows none.
func scsiIdentity(dev string) string {
	b, err := os.ReadFile("/sys/class/block/" + filepath.Base(dev) + "/device/wwid")
	if err != nil {
		return ""
	}
	if id := strings.TrimSpace(string(b)); id != "" {
		return "wwid:" + id
	}
	return ""
}
