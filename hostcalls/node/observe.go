package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
)

// What start-up reconciliation sees of the node: the loop devices and the
// mounts the host's modules may have made. The host compares them with its
// records and decides what is an orphan.

// Loop is a bound loop device as reconciliation sees it.
type Loop struct {
	loop.Device
	// InRoots: its backing file lies inside the roots observed, so a
	// module made it.
	InRoots bool
	// Held: another block device holds it (a dm-thin pool over pool
	// files), whose owner it belongs to.
	Held bool
}

// Mount is a mount in the node's mount table.
type Mount struct {
	Mountpoint string
	// Source is the mounted device and Root the folder of its filesystem
	// that is mounted ("/" for the whole filesystem).
	Source, Root string
	// Major and Minor are the device number of the mounted filesystem:
	// with Root, what tells a bind of a staging path from another mount.
	Major, Minor int
	// Options are the per-mount options ("ro,nosuid,..."), not the
	// filesystem's.
	Options string
	// Ours: it mounts a loop device backed by a file in the roots, or a
	// folder or file inside the roots, so a module made it.
	Ours bool
}

// ReadOnly reports whether the mount is read-only.
func (m Mount) ReadOnly() bool { return slices.Contains(strings.Split(m.Options, ","), "ro") }

// Observation is every bound loop device and every mount.
type Observation struct {
	Loops  []Loop
	Mounts []Mount
}

// Within reports whether the clean path p is one of roots or lies inside
// one.
func Within(roots []string, p string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return p == r || strings.HasPrefix(p, r+string(filepath.Separator)) })
}

// Observe lists the node's loop devices and mounts, and marks what modules
// with these roots made. On an error it returns what it saw so far.
func (n *Node) Observe(ctx context.Context, roots []string) (Observation, error) {
	var o Observation
	devs, err := loop.List(ctx)
	if err != nil {
		return o, err
	}
	ours := map[string]bool{} // loop devices backed by pool files
	for _, d := range devs {
		l := Loop{Device: d, InRoots: Within(roots, d.BackingFile)}
		if l.InRoots {
			ours[d.Path] = true
			l.Held = heldByDevice(d.Path)
		}
		o.Loops = append(o.Loops, l)
	}
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return o, err
	}
	pools := findPools(roots, mounts)
	for _, m := range mounts {
		o.Mounts = append(o.Mounts, Mount{Mountpoint: m.Mountpoint, Source: m.Source, Root: m.Root,
			Major: m.Major, Minor: m.Minor, Options: m.Options, Ours: ours[m.Source] || pools.holds(m)})
	}
	return o, nil
}

// Detach detaches the loop device d as Observe saw it, only while the
// same file backs it: freed meanwhile, it may back another's file.
func (n *Node) Detach(ctx context.Context, d loop.Device) error { return loop.DetachBound(ctx, d) }

// heldByDevice reports whether another block device (device-mapper, md)
// holds dev, as sysfs's holders folder shows.
func heldByDevice(dev string) bool {
	holders, err := os.ReadDir("/sys/class/block/" + filepath.Base(dev) + "/holders")
	return err == nil && len(holders) > 0
}

// poolPlace is where a pool root lies: its filesystem's device number and
// its path inside that filesystem. A bind mount names its source only that
// way (mountinfo's root field is relative to the source's filesystem), so
// a pool on a filesystem of its own, such as a tmpfs, matches no absolute
// root path.
type poolPlace struct {
	major, minor int
	rel          string
}

type poolPlaces []poolPlace

func findPools(roots []string, mounts []*mountinfo.Info) poolPlaces {
	var out poolPlaces
	for _, r := range roots {
		real, err := filepath.EvalSymlinks(r)
		if err != nil || !filepath.IsAbs(real) {
			continue
		}
		var on *mountinfo.Info // the topmost mount holding real
		for _, m := range mounts {
			if real == m.Mountpoint || m.Mountpoint == "/" || strings.HasPrefix(real, m.Mountpoint+"/") {
				if on == nil || len(m.Mountpoint) >= len(on.Mountpoint) {
					on = m
				}
			}
		}
		if on != nil {
			out = append(out, poolPlace{on.Major, on.Minor, filepath.Join(on.Root, strings.TrimPrefix(real, on.Mountpoint))})
		}
	}
	return out
}

// holds reports whether m mounts a folder or file inside a pool (a whole
// filesystem, root "/", is never one of the host's binds).
func (ps poolPlaces) holds(m *mountinfo.Info) bool {
	if m.Root == "/" {
		return false
	}
	for _, p := range ps {
		if m.Major == p.major && m.Minor == p.minor && (p.rel == "/" || m.Root == p.rel || strings.HasPrefix(m.Root, p.rel+"/")) {
			return true
		}
	}
	return false
}

// OwnedMount reports whether the topmost mount at path is one a module
// with these roots made for the volume whose local ID is localID: a bind
// of the pool folder or file named for it, or a mount of a loop device,
// which a family under roots claims, backed by such a pool file. A pool
// entry is named for a volume when its name is the local ID, alone or
// with one extension ("<id>", "<id>.img"). Anything else (a tmpfs, the
// host's disks, another volume's pool entry, a device that tells no
// volume) is not the daemon's to unmount for this volume. It also returns
// path with its links resolved, the mount point to act on. A device the
// grants refuse is not owned; a device check that fails otherwise is an
// error (UNAVAILABLE), so that the caller is retried rather than leaking
// the mount.
func (n *Node) OwnedMount(ctx context.Context, roots []string, path, localID string) (string, bool, error) {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	} else if err != nil {
		return "", false, errf(codes.Unavailable, "resolve %s: %v", path, err)
	}
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return "", false, errf(codes.Unavailable, "read the mount table: %v", err)
	}
	var top *mountinfo.Info // mountinfo lists mounts in the order they were made
	for _, m := range mounts {
		if m.Mountpoint == real {
			top = m
		}
	}
	switch {
	case top == nil:
		return real, false, nil
	case findPools(roots, mounts).holds(top):
		return real, namedFor(top.Root, localID), nil
	case top.Root != "/" || !filepath.IsAbs(top.Source):
		return real, false, nil
	}
	dev, _, err := n.ConfineDevice(ctx, "mount", roots, top.Source)
	if Refused(err) {
		return real, false, nil
	} else if err != nil {
		return "", false, errf(codes.Unavailable, "check device %s mounted at %s: %v", top.Source, real, err)
	}
	devs, err := loop.List(ctx)
	if err != nil {
		return "", false, errf(codes.Unavailable, "check device %s mounted at %s: %v", top.Source, real, err)
	}
	for _, d := range devs {
		if d.Path == dev || d.Path == top.Source {
			return real, Within(roots, d.BackingFile) && namedFor(d.BackingFile, localID), nil
		}
	}
	return real, false, nil
}

// namedFor reports whether the last element of p is localID, alone (a
// folder) or as an image file ("<id>.img"). Any other extension is not
// the volume's: a local ID may hold dots, so "a.b" is volume "a.b"'s and
// never volume "a"'s, and "<id>.snap" is a snapshot's.
func namedFor(p, localID string) bool {
	base := filepath.Base(p)
	return localID != "" && (base == localID || base == localID+imageSuffix)
}

// imageSuffix ends the name of a volume's image file in a file pool.
const imageSuffix = ".img"

// BindOf reports whether path is a mount point showing dir itself (the
// same inode on the same filesystem): a bind of dir.
func (n *Node) BindOf(path, dir string) bool {
	if mounted, err := mount.IsMountPoint(path); err != nil || !mounted {
		return false
	}
	var a, b unix.Stat_t
	return unix.Stat(path, &a) == nil && unix.Stat(dir, &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino
}
