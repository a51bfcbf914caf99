// Package nvme is the node's NVMe over TCP initiator, driven without
// nvme-cli: a controller is connected by writing its option string to
// /dev/nvme-fabrics (and reading back its instance), disconnected by
// writing its sysfs delete_controller, rescanned by its rescan_controller.
// A namespace is found by its UUID among the block devices sysfs shows,
// never by its /dev/nvmeXnY name, which depends on the order controllers
// came up.
//
// One controller per (address, subsystem, host NQN) is shared by every
// namespace in use behind it and is disconnected with the last of them.
// The kernel refuses a second controller to the same triple, so no state
// file is needed: the kernel's controllers are the record, and a daemon
// killed at any point finds them again.
package nvme

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/netaddr"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
)

// DefaultPort is the NVMe/TCP port (IANA 4420).
const DefaultPort = 4420

// Options of every controller the initiator connects: a lost connection is
// retried every reconnectDelay seconds for ctrlLossTmo seconds before the
// controller is given up (its namespaces then fail I/O).
const (
	reconnectDelay = 2
	ctrlLossTmo    = 600
)

// Config says where the initiator finds the kernel and its identity.
type Config struct {
	// Sysfs is the sysfs mount; default "/sys".
	Sysfs string
	// Dev is the device folder; default "/dev".
	Dev string
	// HostNQNFile is nvme-cli's host NQN file; default "/etc/nvme/hostnqn".
	HostNQNFile string
	// HostIDFile is nvme-cli's host ID file; default "/etc/nvme/hostid".
	HostIDFile string
	// MachineIDFile gives a host NQN when HostNQNFile is absent; default
	// "/etc/machine-id".
	MachineIDFile string
	// Wait bounds how long a connect waits for the namespace's device;
	// default 15 s.
	Wait time.Duration
	// SourceAddr, when valid, is the local address controllers connect
	// from (host_traddr), for nodes whose storage network is not the
	// default route's.
	SourceAddr netip.Addr
}

// Initiator connects and disconnects NVMe/TCP controllers.
type Initiator struct {
	cfg   Config
	mu    sync.Mutex
	locks map[string]*sync.Mutex // one per (address, subsystem): no global lock
}

// New returns an Initiator; it touches nothing until used.
func New(cfg Config) *Initiator {
	if cfg.Sysfs == "" {
		cfg.Sysfs = "/sys"
	}
	if cfg.Dev == "" {
		cfg.Dev = "/dev"
	}
	if cfg.HostNQNFile == "" {
		cfg.HostNQNFile = "/etc/nvme/hostnqn"
	}
	if cfg.HostIDFile == "" {
		cfg.HostIDFile = "/etc/nvme/hostid"
	}
	if cfg.MachineIDFile == "" {
		cfg.MachineIDFile = "/etc/machine-id"
	}
	if cfg.Wait == 0 {
		cfg.Wait = 15 * time.Second
	}
	return &Initiator{cfg: cfg, locks: map[string]*sync.Mutex{}}
}

// Namespace names a namespace behind a subsystem at an address.
type Namespace struct {
	Addr      netip.AddrPort
	Subsystem string
	UUID      string // lower case, 8-4-4-4-12
}

// ParseAddr parses a target address, the port defaulting to 4420.
func ParseAddr(s string) (netip.AddrPort, error) { return netaddr.Parse("address", s, DefaultPort) }

// ValidNQN checks an NVMe qualified name: "nqn." and at most 223 bytes of
// printable ASCII without spaces, commas or slashes (which the fabrics
// option string and configfs would split on).
func ValidNQN(nqn string) error {
	if !strings.HasPrefix(nqn, "nqn.") || len(nqn) > 223 {
		return abi.Errorf(abi.InvalidArgument, "NQN %q must start with \"nqn.\" and have at most 223 bytes", nqn)
	}
	for i := 0; i < len(nqn); i++ {
		if c := nqn[i]; c <= ' ' || c > '~' || c == ',' || c == '/' || c == '=' {
			return abi.Errorf(abi.InvalidArgument, "NQN %q: character %q is not allowed", nqn, c)
		}
	}
	return nil
}

// ParseUUID checks a UUID and answers it in lower case.
func ParseUUID(s string) (string, error) {
	s = strings.ToLower(s)
	if len(s) != 36 {
		return "", abi.Errorf(abi.InvalidArgument, "UUID %q is not 8-4-4-4-12 hex digits", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return "", abi.Errorf(abi.InvalidArgument, "UUID %q is not 8-4-4-4-12 hex digits", s)
			}
			continue
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", abi.Errorf(abi.InvalidArgument, "UUID %q is not 8-4-4-4-12 hex digits", s)
		}
	}
	if s == "00000000-0000-0000-0000-000000000000" {
		return "", abi.Errorf(abi.InvalidArgument, "the nil UUID names no namespace")
	}
	return s, nil
}

// HostNQN answers the node's host NQN: the host NQN file's, else one
// made of the DMI product UUID (as nvme-cli's gen-hostnqn does), else one
// derived from the machine ID.
func (in *Initiator) HostNQN() (string, error) {
	nqn, _, err := in.identity()
	return nqn, err
}

// identity answers the host NQN and host ID the initiator connects with.
func (in *Initiator) identity() (nqn, id string, err error) {
	if b, err := os.ReadFile(in.cfg.HostNQNFile); err == nil {
		nqn = strings.TrimSpace(string(b))
		if err := ValidNQN(nqn); err != nil {
			return "", "", err
		}
		if b, err := os.ReadFile(in.cfg.HostIDFile); err == nil {
			if id, err = ParseUUID(strings.TrimSpace(string(b))); err == nil {
				return nqn, id, nil
			}
		}
		return nqn, uuidOf("hostid:" + nqn), nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", abi.Errorf(abi.FailedPrecondition, "host NQN: %v", err)
	}
	// As nvme-cli's gen-hostnqn: the machine's DMI product UUID, which
	// firmware keeps across reinstalls (readable through /sys, which node
	// containers mount anyway).
	if b, err := os.ReadFile(filepath.Join(in.cfg.Sysfs, "class", "dmi", "id", "product_uuid")); err == nil {
		if u, err := ParseUUID(strings.TrimSpace(string(b))); err == nil && u != "ffffffff-ffff-ffff-ffff-ffffffffffff" {
			return "nqn.2014-08.org.nvmexpress:uuid:" + u, u, nil
		}
	}
	b, err := os.ReadFile(in.cfg.MachineIDFile)
	mid := strings.TrimSpace(string(b))
	if err != nil || mid == "" {
		return "", "", abi.Errorf(abi.FailedPrecondition, "no host NQN: %s is absent and %s gives no machine ID", in.cfg.HostNQNFile, in.cfg.MachineIDFile)
	}
	id = uuidOf("machine-id:" + mid)
	return "nqn.2014-08.org.nvmexpress:uuid:" + id, id, nil
}

// uuidOf derives a stable UUID (version 8, RFC 9562) from s.
func uuidOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	sum[6] = sum[6]&0x0f | 0x80
	sum[8] = sum[8]&0x3f | 0x80
	h := fmt.Sprintf("%x", sum[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func (in *Initiator) lock(n Namespace) func() {
	key := n.Addr.String() + " " + n.Subsystem
	in.mu.Lock()
	l := in.locks[key]
	if l == nil {
		l = new(sync.Mutex)
		in.locks[key] = l
	}
	in.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Connect connects to n's subsystem when no controller of this host to it
// is there, waits for n's block device and answers it and the controller.
func (in *Initiator) Connect(ctx context.Context, n Namespace) (dev, ctrl string, err error) {
	hostNQN, hostID, err := in.identity()
	if err != nil {
		return "", "", err
	}
	defer in.lock(n)()
	ctrl, state, err := in.controller(n, hostNQN)
	if err != nil {
		return "", "", err
	}
	if ctrl != "" && state == "deleting" {
		in.waitGone(ctx, ctrl)
		ctrl = ""
	}
	if ctrl == "" {
		if ctrl, err = in.connect(n, hostNQN, hostID); err != nil {
			return "", "", err
		}
	}
	deadline := time.Now().Add(in.cfg.Wait)
	for {
		disk, err := in.findDisk(n)
		if err != nil {
			return "", "", err
		}
		if disk != "" {
			dev := filepath.Join(in.cfg.Dev, disk)
			if _, err := os.Stat(dev); err == nil {
				return dev, ctrl, nil
			}
		}
		if time.Now().After(deadline) {
			state, _ := sysattr.Read(in.ctrlPath(ctrl, "state"))
			if state != "live" {
				return "", "", abi.Errorf(abi.Unavailable, "nvme: controller %s to %s at %s is %q, not live", ctrl, n.Subsystem, n.Addr, state)
			}
			return "", "", abi.Errorf(abi.NotFound, "nvme: %s at %s shows no namespace %s to this host", n.Subsystem, n.Addr, n.UUID)
		}
		select {
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// connect writes the option string to /dev/nvme-fabrics and reads back
// the new controller's instance.
func (in *Initiator) connect(n Namespace, hostNQN, hostID string) (string, error) {
	opts := "transport=tcp,traddr=" + n.Addr.Addr().String() + ",trsvcid=" + strconv.Itoa(int(n.Addr.Port())) +
		",nqn=" + n.Subsystem + ",hostnqn=" + hostNQN + ",hostid=" + hostID +
		",reconnect_delay=" + strconv.Itoa(reconnectDelay) + ",ctrl_loss_tmo=" + strconv.Itoa(ctrlLossTmo)
	if in.cfg.SourceAddr.IsValid() {
		opts += ",host_traddr=" + in.cfg.SourceAddr.String()
	}
	f, err := os.OpenFile(filepath.Join(in.cfg.Dev, "nvme-fabrics"), os.O_RDWR, 0)
	if err != nil {
		return "", abi.Errorf(abi.FailedPrecondition, "nvme: %v (load nvme_tcp)", err)
	}
	defer f.Close()
	if _, err := f.Write([]byte(opts)); err != nil {
		var errno unix.Errno
		errors.As(err, &errno)
		switch errno {
		case unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.ETIMEDOUT, unix.ECONNRESET:
			return "", abi.Errorf(abi.Unavailable, "nvme: connect to %s at %s: %v", n.Subsystem, n.Addr, err)
		case unix.EALREADY:
			return "", abi.Errorf(abi.Aborted, "nvme: a controller to %s at %s is being made: %v", n.Subsystem, n.Addr, err)
		case unix.EIO, unix.EPERM, unix.EACCES, unix.EINVAL:
			// The target answered the connect command with an error:
			// this host is not allowed, or the subsystem is not there.
			return "", abi.Errorf(abi.PermissionDenied, "nvme: %s at %s refused host %s: %v", n.Subsystem, n.Addr, hostNQN, err)
		}
		return "", fmt.Errorf("nvme: connect to %s at %s: %w", n.Subsystem, n.Addr, err)
	}
	buf := make([]byte, 256)
	m, err := f.ReadAt(buf, 0)
	if m == 0 && err != nil {
		return "", fmt.Errorf("nvme: read connected instance: %w", err)
	}
	for _, kv := range strings.Split(strings.TrimSpace(string(buf[:m])), ",") {
		if v, ok := strings.CutPrefix(kv, "instance="); ok {
			if _, err := strconv.Atoi(v); err == nil {
				return "nvme" + v, nil
			}
		}
	}
	return "", fmt.Errorf("nvme: /dev/nvme-fabrics answered %q, no instance", string(buf[:m]))
}

// Disconnect releases n: its device must be neither mounted nor held; the
// controller is deleted when n is the last namespace it shows. A
// namespace without a controller is success.
func (in *Initiator) Disconnect(ctx context.Context, n Namespace) error {
	// A node without a host NQN has only controllers someone else made:
	// the release is of any controller to the namespace's subsystem.
	hostNQN, _, _ := in.identity()
	defer in.lock(n)()
	ctrl, _, err := in.controller(n, hostNQN)
	if err != nil || ctrl == "" {
		return err
	}
	disk, err := in.findDisk(n)
	if err != nil {
		return err
	}
	if disk != "" {
		if err := in.inUse(disk); err != nil {
			return err
		}
	}
	others, err := in.otherNamespaces(ctrl, n)
	if err != nil {
		return err
	}
	if others > 0 {
		return nil // another namespace in use keeps the controller
	}
	if err := sysattr.Write(in.ctrlPath(ctrl, "delete_controller"), "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("nvme: delete controller %s: %w", ctrl, err)
	}
	in.waitGone(ctx, ctrl)
	return nil
}

// Rescan rescans n's controller and answers n's size, waiting a few
// seconds for it to reach min.
func (in *Initiator) Rescan(ctx context.Context, n Namespace, min int64) (int64, error) {
	hostNQN, _, _ := in.identity()
	ctrl, _, err := in.controller(n, hostNQN)
	if err != nil {
		return 0, err
	}
	if ctrl == "" {
		return 0, abi.Errorf(abi.NotFound, "nvme: no controller to %s at %s", n.Subsystem, n.Addr)
	}
	if state, _ := sysattr.Read(in.ctrlPath(ctrl, "state")); state != "live" {
		return 0, abi.Errorf(abi.Unavailable, "nvme: controller %s to %s at %s is %q: the path is down", ctrl, n.Subsystem, n.Addr, state)
	}
	disk, err := in.findDisk(n)
	if err != nil {
		return 0, err
	}
	if disk == "" {
		return 0, abi.Errorf(abi.NotFound, "nvme: controller %s shows no namespace %s", ctrl, n.UUID)
	}
	if err := sysattr.Write(in.ctrlPath(ctrl, "rescan_controller"), "1"); err != nil {
		return 0, fmt.Errorf("nvme: rescan %s: %w", ctrl, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		size, err := in.diskSize(disk)
		if err != nil || size >= min || time.Now().After(deadline) {
			return size, err
		}
		select {
		case <-ctx.Done():
			return size, nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ctrlPath is a controller's sysfs attribute.
func (in *Initiator) ctrlPath(ctrl string, attr ...string) string {
	return filepath.Join(append([]string{in.cfg.Sysfs, "class", "nvme", ctrl}, attr...)...)
}

// controller finds this host's TCP controller to n's subsystem at n's
// address (any host's when hostNQN is "") and its state; "" when there is
// none.
func (in *Initiator) controller(n Namespace, hostNQN string) (string, string, error) {
	ctrls, err := os.ReadDir(filepath.Join(in.cfg.Sysfs, "class", "nvme"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	for _, e := range ctrls {
		c := e.Name()
		if t, _ := sysattr.Read(in.ctrlPath(c, "transport")); t != "tcp" {
			continue
		}
		if s, _ := sysattr.Read(in.ctrlPath(c, "subsysnqn")); s != n.Subsystem {
			continue
		}
		if h, _ := sysattr.Read(in.ctrlPath(c, "hostnqn")); hostNQN != "" && h != hostNQN {
			continue
		}
		if a, _ := sysattr.Read(in.ctrlPath(c, "address")); !sameAddr(a, n.Addr) {
			continue
		}
		state, _ := sysattr.Read(in.ctrlPath(c, "state"))
		return c, state, nil
	}
	return "", "", nil
}

// sameAddr reports whether a controller's address attribute
// ("traddr=...,trsvcid=...[,src_addr=...]") names ap.
func sameAddr(attr string, ap netip.AddrPort) bool {
	var addr, port string
	for _, kv := range strings.Split(attr, ",") {
		if v, ok := strings.CutPrefix(kv, "traddr="); ok {
			addr = v
		} else if v, ok := strings.CutPrefix(kv, "trsvcid="); ok {
			port = v
		}
	}
	a, err := netip.ParseAddr(addr)
	return err == nil && a.Unmap() == ap.Addr() && port == strconv.Itoa(int(ap.Port()))
}

// findDisk answers the name of the block device ("nvme1n1") whose UUID
// is n's and whose subsystem is n's; "" when there is none.
func (in *Initiator) findDisk(n Namespace) (string, error) {
	ents, err := os.ReadDir(filepath.Join(in.cfg.Sysfs, "block"))
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		name := e.Name()
		if !isHeadDisk(name) {
			continue
		}
		if diskUUID(in.cfg.Sysfs, name) != n.UUID {
			continue
		}
		if s, _ := sysattr.Read(filepath.Join(in.cfg.Sysfs, "block", name, "device", "subsysnqn")); s != n.Subsystem {
			continue
		}
		return name, nil
	}
	return "", nil
}

// diskUUID answers a namespace disk's UUID, from its uuid attribute or
// its wwid ("uuid.<uuid>").
func diskUUID(sysfs, disk string) string {
	if u, err := sysattr.Read(filepath.Join(sysfs, "block", disk, "uuid")); err == nil && u != "" {
		return strings.ToLower(u)
	}
	if w, err := sysattr.Read(filepath.Join(sysfs, "block", disk, "wwid")); err == nil {
		if u, ok := strings.CutPrefix(w, "uuid."); ok {
			return strings.ToLower(u)
		}
	}
	return ""
}

// isHeadDisk reports whether name is a namespace's disk, "nvme<X>n<Y>",
// and not a hidden path of one ("nvme<X>c<C>n<Y>") or a partition.
func isHeadDisk(name string) bool {
	rest, ok := strings.CutPrefix(name, "nvme")
	if !ok {
		return false
	}
	x, y, ok := strings.Cut(rest, "n")
	return ok && isDigits(x) && isDigits(y)
}

// otherNamespaces counts the namespaces other than n that a controller
// shows, by its sysfs entries ("nvme1n1", or "nvme1c2n1" with native
// multipath).
func (in *Initiator) otherNamespaces(ctrl string, n Namespace) (int, error) {
	ents, err := os.ReadDir(in.ctrlPath(ctrl))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	count := 0
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "nvme") || strings.Contains(name, "-") || name == ctrl {
			continue
		}
		u, err := sysattr.Read(filepath.Join(in.ctrlPath(ctrl), name, "uuid"))
		if err != nil {
			w, werr := sysattr.Read(filepath.Join(in.ctrlPath(ctrl), name, "wwid"))
			if werr != nil {
				continue // not a namespace
			}
			u, _ = strings.CutPrefix(w, "uuid.")
		}
		if strings.ToLower(u) != n.UUID {
			count++
		}
	}
	return count, nil
}

// inUse is FAILED_PRECONDITION when disk is mounted or held.
func (in *Initiator) inUse(disk string) error {
	holders, _ := os.ReadDir(filepath.Join(in.cfg.Sysfs, "block", disk, "holders"))
	if len(holders) > 0 {
		return abi.Errorf(abi.FailedPrecondition, "nvme: %s is held by %s", disk, holders[0].Name())
	}
	dev, err := sysattr.Read(filepath.Join(in.cfg.Sysfs, "block", disk, "dev"))
	if err != nil {
		return nil
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[2] == dev {
			return abi.Errorf(abi.FailedPrecondition, "nvme: %s is mounted at %s", disk, f[4])
		}
	}
	return nil
}

func (in *Initiator) diskSize(disk string) (int64, error) {
	s, err := sysattr.Read(filepath.Join(in.cfg.Sysfs, "block", disk, "size"))
	if err != nil {
		return 0, fmt.Errorf("nvme: size of %s: %w", disk, err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("nvme: size of %s: %w", disk, err)
	}
	return n * 512, nil
}

// waitGone waits up to 10 s for a deleted controller to leave sysfs.
func (in *Initiator) waitGone(ctx context.Context, ctrl string) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := os.Stat(in.ctrlPath(ctrl)); errors.Is(err, fs.ErrNotExist) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
