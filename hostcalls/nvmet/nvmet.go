// Package nvmet serves block devices and files as NVMe namespaces over TCP
// through the kernel's NVMe target, driven directly through configfs
// (/sys/kernel/config/nvmet): subsystems, their namespaces (device_path,
// uuid, nguid, enable), TCP ports, and the hosts a subsystem allows.
//
// Every subsystem it makes has attr_allow_any_host=0, written on every
// create, also to a subsystem that exists: a host connects only after
// AllowHost. nvmet checks hosts only when they connect, so DenyHost also
// unlinks the subsystem from its ports and links it again, which ends
// every controller of the subsystem; hosts still allowed reconnect by
// themselves, the denied one cannot.
//
// configfs keeps nothing across a reboot of the target host; every create
// is idempotent, so the module re-creates what it serves by repeating its
// creates (ControllerPublish does, as the LIO target's module does).
//
// It must never touch a subsystem outside the NQN prefixes the operator
// granted, never run nvmetcli or a shell, and never load kernel modules or
// mount configfs: the deployment does that (nvmet, nvmet_tcp).
package nvmet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
	"github.com/wasmcsi/wasmcsi/hostcalls/nvme"
)

// DefaultRoot is where nvmet's configfs tree lives.
const DefaultRoot = "/sys/kernel/config/nvmet"

// MaxNSID is the highest namespace ID a subsystem gets here (nvmet's own
// limit is NVMET_MAX_NAMESPACES, 1024).
const MaxNSID = 1024

// Target manages nvmet objects. Subsystems are serialized one by one;
// ports, which subsystems share, by their own lock.
type Target struct {
	root  string
	mu    sync.Mutex
	subs  map[string]*sync.Mutex
	ports sync.Mutex
}

// New returns a Target on root (DefaultRoot when empty). It does not
// touch the kernel, so a daemon can start before nvmet is loaded;
// operations then fail with FailedPrecondition.
func New(root string) *Target {
	if root == "" {
		root = DefaultRoot
	}
	return &Target{root: filepath.Clean(root), subs: map[string]*sync.Mutex{}}
}

// Namespace is everything CreateNamespace sets up.
type Namespace struct {
	Subsystem  string
	NSID       int
	Path       string // block device or regular file
	UUID       string // lower case
	Ports      []netip.AddrPort
	BufferedIO bool
}

func (t *Target) lock(nqn string) func() {
	t.mu.Lock()
	l := t.subs[nqn]
	if l == nil {
		l = new(sync.Mutex)
		t.subs[nqn] = l
	}
	t.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (t *Target) path(p ...string) string { return filepath.Join(append([]string{t.root}, p...)...) }

func (t *Target) subPath(nqn string, p ...string) string {
	return t.path(append([]string{"subsystems", nqn}, p...)...)
}

// available reports FailedPrecondition when nvmet's configfs tree is absent.
func (t *Target) available() error {
	if _, err := os.Stat(t.path("subsystems")); err != nil {
		return abi.Errorf(abi.FailedPrecondition, "nvmet: %s is not available (load nvmet and nvmet_tcp, mount configfs): %v", t.root, err)
	}
	return nil
}

func checkNSID(n int) error {
	if n < 1 || n > MaxNSID {
		return abi.Errorf(abi.InvalidArgument, "nvmet: namespace ID %d is not 1 to %d", n, MaxNSID)
	}
	return nil
}

// CreateNamespace makes spec's subsystem (no host allowed) when missing,
// its namespace serving spec.Path, and links the subsystem to a TCP port
// per address. The same spec again succeeds; an NSID serving another
// backing store (told by device number for block devices) or a UUID
// another namespace of the subsystem has is AlreadyExists.
func (t *Target) CreateNamespace(ctx context.Context, spec Namespace) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := nvme.ValidNQN(spec.Subsystem); err != nil {
		return err
	}
	if err := checkNSID(spec.NSID); err != nil {
		return err
	}
	if len(spec.Ports) == 0 {
		return abi.Errorf(abi.InvalidArgument, "nvmet: namespace %d of %s: no ports", spec.NSID, spec.Subsystem)
	}
	if !validPath(spec.Path) {
		return abi.Errorf(abi.InvalidArgument, "nvmet: backing path %q has spaces, commas or control characters", spec.Path)
	}
	if err := t.available(); err != nil {
		return err
	}
	defer t.lock(spec.Subsystem)()
	if err := mkdir(t.subPath(spec.Subsystem)); err != nil {
		return fmt.Errorf("nvmet: subsystem %s: %w", spec.Subsystem, err)
	}
	if err := sysattr.Write(t.subPath(spec.Subsystem, "attr_allow_any_host"), "0"); err != nil {
		return fmt.Errorf("nvmet: subsystem %s: attr_allow_any_host: %w", spec.Subsystem, err)
	}
	if err := t.ensureNamespace(spec); err != nil {
		return err
	}
	for _, ap := range spec.Ports {
		if err := t.linkPort(spec.Subsystem, ap); err != nil {
			return err
		}
	}
	return nil
}

func (t *Target) ensureNamespace(spec Namespace) error {
	nsDir := t.subPath(spec.Subsystem, "namespaces", strconv.Itoa(spec.NSID))
	nsids, err := listDirs(t.subPath(spec.Subsystem, "namespaces"))
	if err != nil {
		return err
	}
	for _, id := range nsids {
		if id == strconv.Itoa(spec.NSID) {
			continue
		}
		if u, _ := sysattr.Read(t.subPath(spec.Subsystem, "namespaces", id, "device_uuid")); strings.EqualFold(u, spec.UUID) {
			return abi.Errorf(abi.AlreadyExists, "nvmet: namespace %s of %s already has UUID %s", id, spec.Subsystem, spec.UUID)
		}
	}
	if _, err := os.Stat(nsDir); err == nil {
		cur, _ := sysattr.Read(filepath.Join(nsDir, "device_path"))
		if cur != "" && !sameBacking(cur, spec.Path) {
			return abi.Errorf(abi.AlreadyExists, "nvmet: namespace %d of %s serves %s", spec.NSID, spec.Subsystem, cur)
		}
		u, _ := sysattr.Read(filepath.Join(nsDir, "device_uuid"))
		if cur != "" && !strings.EqualFold(u, spec.UUID) {
			return abi.Errorf(abi.AlreadyExists, "nvmet: namespace %d of %s has UUID %s", spec.NSID, spec.Subsystem, u)
		}
		if on, _ := sysattr.Read(filepath.Join(nsDir, "enable")); on == "1" {
			return nil
		}
	} else if err := mkdir(nsDir); err != nil {
		return fmt.Errorf("nvmet: namespace %d of %s: %w", spec.NSID, spec.Subsystem, err)
	}
	// A namespace that exists disabled (a create interrupted before its
	// enable) gets every attribute again.
	attrs := [][2]string{{"device_path", spec.Path}, {"device_uuid", spec.UUID}, {"device_nguid", nguidOf(spec.UUID)}}
	if st, err := os.Stat(spec.Path); err == nil && st.Mode().IsRegular() {
		attrs = append(attrs, [2]string{"buffered_io", boolAttr(spec.BufferedIO)})
	}
	for _, a := range attrs {
		if err := sysattr.Write(filepath.Join(nsDir, a[0]), a[1]); err != nil {
			return fmt.Errorf("nvmet: namespace %d of %s: %s: %w", spec.NSID, spec.Subsystem, a[0], err)
		}
	}
	if err := sysattr.Write(filepath.Join(nsDir, "enable"), "1"); err != nil {
		_ = rmdir(nsDir)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOENT) {
			return abi.Errorf(abi.NotFound, "nvmet: %s: %v", spec.Path, err)
		}
		return fmt.Errorf("nvmet: enable namespace %d of %s on %s: %w", spec.NSID, spec.Subsystem, spec.Path, err)
	}
	return nil
}

// sameBacking reports whether two backing paths are the same store: the
// same block device number, or the same file.
func sameBacking(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	if sa.Mode&unix.S_IFMT == unix.S_IFBLK && sb.Mode&unix.S_IFMT == unix.S_IFBLK {
		return sa.Rdev == sb.Rdev
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// nguidOf derives a namespace's NGUID from its UUID: the same 16 bytes,
// so either identifies it.
func nguidOf(uuid string) string { return uuid }

func boolAttr(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// linkPort links the subsystem to the TCP port at ap, making the port
// when none listens there.
func (t *Target) linkPort(nqn string, ap netip.AddrPort) error {
	t.ports.Lock()
	defer t.ports.Unlock()
	id, err := t.portOf(ap, true)
	if err != nil {
		return err
	}
	err = ensureLink(t.subPath(nqn), t.path("ports", id, "subsystems", nqn))
	if err != nil {
		t.dropPortIfUnused(id)
	}
	switch {
	case errors.Is(err, unix.EADDRINUSE):
		return abi.Errorf(abi.FailedPrecondition, "nvmet: %s is in use by another program", ap)
	case errors.Is(err, unix.EADDRNOTAVAIL):
		return abi.Errorf(abi.FailedPrecondition, "nvmet: %s: no such local address", ap)
	case err != nil:
		return fmt.Errorf("nvmet: link %s to port %s (%s): %w", nqn, id, ap, err)
	}
	return nil
}

// portOf answers the ID of the TCP port at ap; with create, a port is
// made under the lowest free ID when there is none. "" when there is none
// and create is false.
func (t *Target) portOf(ap netip.AddrPort, create bool) (string, error) {
	ids, err := listDirs(t.path("ports"))
	if err != nil {
		return "", err
	}
	used := map[int]bool{}
	for _, id := range ids {
		n, _ := strconv.Atoi(id)
		used[n] = true
		if tr, _ := sysattr.Read(t.path("ports", id, "addr_trtype")); tr != "tcp" {
			continue
		}
		a, _ := sysattr.Read(t.path("ports", id, "addr_traddr"))
		p, _ := sysattr.Read(t.path("ports", id, "addr_trsvcid"))
		if ip, err := netip.ParseAddr(a); err == nil && ip.Unmap() == ap.Addr() && p == strconv.Itoa(int(ap.Port())) {
			return id, nil
		}
	}
	if !create {
		return "", nil
	}
	n := 1
	for used[n] {
		n++
	}
	id := strconv.Itoa(n)
	dir := t.path("ports", id)
	if err := mkdir(dir); err != nil {
		return "", fmt.Errorf("nvmet: port %s: %w", id, err)
	}
	fam := "ipv4"
	if ap.Addr().Is6() {
		fam = "ipv6"
	}
	for _, a := range [][2]string{{"addr_trtype", "tcp"}, {"addr_adrfam", fam}, {"addr_traddr", ap.Addr().String()}, {"addr_trsvcid", strconv.Itoa(int(ap.Port()))}} {
		if err := sysattr.Write(filepath.Join(dir, a[0]), a[1]); err != nil {
			rmdir(dir)
			return "", fmt.Errorf("nvmet: port %s: %s: %w", id, a[0], err)
		}
	}
	return id, nil
}

// dropPortIfUnused removes a port that serves no subsystem; one that
// cannot go (it holds referrals or ANA groups of the operator's) stays.
func (t *Target) dropPortIfUnused(id string) {
	if left, _ := os.ReadDir(t.path("ports", id, "subsystems")); len(left) == 0 {
		_ = rmdir(t.path("ports", id))
	}
}

// subsystemPorts lists the IDs of the ports the subsystem is linked to.
func (t *Target) subsystemPorts(nqn string) ([]string, error) {
	ids, err := listDirs(t.path("ports"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		if _, err := os.Lstat(t.path("ports", id, "subsystems", nqn)); err == nil {
			out = append(out, id)
		}
	}
	return out, nil
}

// DeleteNamespace disables and removes namespace nsid of the subsystem;
// with path set, only when it serves path. When the subsystem has no
// namespace left, it goes too: its port links (which ends its
// controllers), its allowed hosts (and host entries no other subsystem
// allows), then itself; a port left serving nothing is removed. Nothing
// there is success.
func (t *Target) DeleteNamespace(ctx context.Context, nqn string, nsid int, path string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := nvme.ValidNQN(nqn); err != nil {
		return err
	}
	if err := checkNSID(nsid); err != nil {
		return err
	}
	if err := t.available(); err != nil {
		return err
	}
	defer t.lock(nqn)()
	nsDir := t.subPath(nqn, "namespaces", strconv.Itoa(nsid))
	if _, err := os.Stat(nsDir); err == nil {
		cur, _ := sysattr.Read(filepath.Join(nsDir, "device_path"))
		if path != "" && cur != "" && !sameBacking(cur, path) {
			return nil // the NSID serves another volume now
		}
		if on, _ := sysattr.Read(filepath.Join(nsDir, "enable")); on == "1" {
			if err := sysattr.Write(filepath.Join(nsDir, "enable"), "0"); err != nil {
				return fmt.Errorf("nvmet: disable namespace %d of %s: %w", nsid, nqn, err)
			}
		}
		if err := rmdir(nsDir); err != nil {
			return fmt.Errorf("nvmet: namespace %d of %s: %w", nsid, nqn, err)
		}
	}
	left, err := listDirs(t.subPath(nqn, "namespaces"))
	if err != nil || len(left) > 0 {
		return err
	}
	return t.deleteSubsystem(nqn)
}

func (t *Target) deleteSubsystem(nqn string) error {
	if _, err := os.Stat(t.subPath(nqn)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	t.ports.Lock()
	ports, err := t.subsystemPorts(nqn)
	if err == nil {
		for _, id := range ports {
			if err = removeLink(t.path("ports", id, "subsystems", nqn)); err != nil {
				break
			}
			t.dropPortIfUnused(id)
		}
	}
	t.ports.Unlock()
	if err != nil {
		return fmt.Errorf("nvmet: unlink %s from its ports: %w", nqn, err)
	}
	hosts, err := links(t.subPath(nqn, "allowed_hosts"))
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if err := removeLink(t.subPath(nqn, "allowed_hosts", h)); err != nil {
			return fmt.Errorf("nvmet: %s: unlink host %s: %w", nqn, h, err)
		}
		t.dropHostIfUnused(h)
	}
	if err := rmdir(t.subPath(nqn)); err != nil {
		return fmt.Errorf("nvmet: subsystem %s: %w", nqn, err)
	}
	return nil
}

// AllowHost lets host connect to the subsystem. NotFound when the
// subsystem does not exist.
func (t *Target) AllowHost(ctx context.Context, nqn, host string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := nvme.ValidNQN(nqn); err != nil {
		return err
	}
	if err := nvme.ValidNQN(host); err != nil {
		return err
	}
	if err := t.available(); err != nil {
		return err
	}
	defer t.lock(nqn)()
	if _, err := os.Stat(t.subPath(nqn)); err != nil {
		return abi.Errorf(abi.NotFound, "nvmet: subsystem %s does not exist", nqn)
	}
	if err := mkdir(t.path("hosts", host)); err != nil {
		return fmt.Errorf("nvmet: host %s: %w", host, err)
	}
	if err := ensureLink(t.path("hosts", host), t.subPath(nqn, "allowed_hosts", host)); err != nil {
		return fmt.Errorf("nvmet: allow %s on %s: %w", host, nqn, err)
	}
	return nil
}

// DenyHost takes host's access to the subsystem away and ends the
// subsystem's controllers: each of ports (or, when none is given, each
// port the subsystem is linked to) is unlinked and linked again, so the
// denied host's controller goes and cannot come back, while hosts still
// allowed reconnect. A repeated call links ports back that a crash left
// unlinked. What was never allowed, or a missing subsystem, is success.
func (t *Target) DenyHost(ctx context.Context, nqn, host string, ports []netip.AddrPort) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := nvme.ValidNQN(nqn); err != nil {
		return err
	}
	if err := nvme.ValidNQN(host); err != nil {
		return err
	}
	if err := t.available(); err != nil {
		return err
	}
	defer t.lock(nqn)()
	if _, err := os.Stat(t.subPath(nqn)); errors.Is(err, fs.ErrNotExist) {
		t.dropHostIfUnused(host)
		return nil
	}
	if err := removeLink(t.subPath(nqn, "allowed_hosts", host)); err != nil {
		return fmt.Errorf("nvmet: deny %s on %s: %w", host, nqn, err)
	}
	t.dropHostIfUnused(host)
	t.ports.Lock()
	defer t.ports.Unlock()
	var ids []string
	if len(ports) == 0 {
		var err error
		if ids, err = t.subsystemPorts(nqn); err != nil {
			return err
		}
	}
	for _, ap := range ports {
		id, err := t.portOf(ap, true)
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		link := t.path("ports", id, "subsystems", nqn)
		if err := removeLink(link); err != nil {
			return fmt.Errorf("nvmet: unlink %s from port %s: %w", nqn, id, err)
		}
		if err := ensureLink(t.subPath(nqn), link); err != nil {
			return fmt.Errorf("nvmet: link %s to port %s again: %w", nqn, id, err)
		}
	}
	return nil
}

// dropHostIfUnused removes a host entry no subsystem allows any more.
func (t *Target) dropHostIfUnused(host string) {
	subs, _ := listDirs(t.path("subsystems"))
	for _, s := range subs {
		if _, err := os.Lstat(t.subPath(s, "allowed_hosts", host)); err == nil {
			return
		}
	}
	_ = rmdir(t.path("hosts", host))
}

// ResizeNamespace makes the namespace report its backing store's size and
// answers it. NotFound when the namespace does not exist.
func (t *Target) ResizeNamespace(ctx context.Context, nqn string, nsid int) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := nvme.ValidNQN(nqn); err != nil {
		return 0, err
	}
	if err := checkNSID(nsid); err != nil {
		return 0, err
	}
	if err := t.available(); err != nil {
		return 0, err
	}
	defer t.lock(nqn)()
	nsDir := t.subPath(nqn, "namespaces", strconv.Itoa(nsid))
	path, err := sysattr.Read(filepath.Join(nsDir, "device_path"))
	if err != nil {
		return 0, abi.Errorf(abi.NotFound, "nvmet: %s has no namespace %d", nqn, nsid)
	}
	if err := sysattr.Write(filepath.Join(nsDir, "revalidate_size"), "1"); err != nil {
		return 0, fmt.Errorf("nvmet: revalidate namespace %d of %s: %w", nsid, nqn, err)
	}
	return sizeOf(path)
}

// sizeOf answers the size of a block device or file.
func sizeOf(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("nvmet: %w", err)
	}
	defer f.Close()
	n, err := f.Seek(0, 2)
	if err != nil {
		return 0, fmt.Errorf("nvmet: size of %s: %w", path, err)
	}
	return n, nil
}

// validPath refuses what configfs attributes would mangle.
func validPath(p string) bool {
	if p == "" || !filepath.IsAbs(p) {
		return false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == ',' || c == 0x7f {
			return false
		}
	}
	return true
}

// listDirs lists the sub-folders of dir (none if dir is absent).
func listDirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// links lists the symlinks in dir (none if dir is absent).
func links(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func mkdir(dir string) error {
	if err := unix.Mkdir(dir, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	return nil
}

// rmdir removes a configfs folder; a missing one is fine.
func rmdir(dir string) error {
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

func ensureLink(dest, link string) error {
	if _, err := os.Readlink(link); err == nil {
		return nil
	}
	if err := unix.Symlink(dest, link); err != nil && !errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "symlink", Path: link, Err: err}
	}
	return nil
}

func removeLink(link string) error {
	if err := unix.Unlink(link); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "unlink", Path: link, Err: err}
	}
	return nil
}
