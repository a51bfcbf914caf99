// Package dm drives the Linux device-mapper through its ioctl interface on
// /dev/mapper/control: create, load, suspend, resume and remove devices,
// read their tables and status, send target messages. thin.go builds thin
// provisioning (pools, thin volumes, snapshots) on top.
//
// Every device name passes through Confine: a Mapper handles only names
// that start with one of the prefixes the operator granted, so a module can
// never touch another module's devices, LVM's or the system's. The package
// must never run dmsetup, never use cgo, and never depend on udev: when
// udev is absent it keeps /dev/mapper/<name> itself, as libdevmapper does
// with DM_DISABLE_UDEV=1. The one program it runs is thin_dump or
// thin_delta, to read which blocks thin devices map (metadata.go): the
// kernel does not say, and no library reads the pool's metadata.
//
// Callers serialise operations on one device (the host's per-volume lock);
// the kernel serialises the rest.
package dm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Dir is where device-mapper device nodes are named.
const Dir = "/dev/mapper"

// Mapper issues device-mapper commands for names under its granted
// prefixes. It holds no open files; it is safe for concurrent use.
type Mapper struct {
	prefixes []string
	dir      string
	// removeRetries and removeBackoff bound Remove's retries on EBUSY
	// (udev's blkid or a closing opener briefly holding the device).
	removeRetries int
	removeBackoff time.Duration
}

// New returns a Mapper confined to names starting with one of prefixes.
// Each prefix must itself be a valid name fragment; there must be one.
func New(prefixes ...string) (*Mapper, error) {
	if len(prefixes) == 0 {
		return nil, abi.Errorf(abi.InvalidArgument, "dm: no name prefix granted")
	}
	for _, p := range prefixes {
		if err := ValidName(p); err != nil {
			return nil, fmt.Errorf("dm: granted prefix: %w", err)
		}
	}
	return &Mapper{prefixes: slices.Clone(prefixes), dir: Dir, removeRetries: 6, removeBackoff: 10 * time.Millisecond}, nil
}

// Prefixes returns the granted name prefixes.
func (m *Mapper) Prefixes() []string { return slices.Clone(m.prefixes) }

// Path returns the node of device name: /dev/mapper/<name>.
func (m *Mapper) Path(name string) string { return filepath.Join(m.dir, name) }

// Info describes one device as DM_DEV_STATUS reports it.
type Info struct {
	Exists        bool
	Name          string
	UUID          string
	Major, Minor  uint32
	OpenCount     int
	TargetCount   int
	EventNr       uint32
	Suspended     bool
	ReadOnly      bool
	LiveTable     bool // a table is active
	InactiveTable bool // a loaded table waits for Resume
}

// Device is one entry of List.
type Device struct {
	Name         string
	Major, Minor uint32
}

// Version returns the kernel's DM ioctl interface version.
func (m *Mapper) Version(ctx context.Context) ([3]uint32, error) {
	rep, err := m.do(ctx, "version", "", &request{cmd: unix.DM_VERSION})
	if err != nil {
		return [3]uint32{}, err
	}
	return rep.Version, nil
}

// Create creates device name with table, activates it and returns its node
// path. It answers AlreadyExists when name exists, and removes the half-made
// device when the table is refused (InvalidArgument, with the kernel's
// reason in its log).
func (m *Mapper) Create(ctx context.Context, name string, table []Target) (string, error) {
	if err := m.confine(name); err != nil {
		return "", err
	}
	data, err := marshalTargets(table)
	if err != nil {
		return "", fmt.Errorf("dm create %s: %w", name, err)
	}
	rep, err := m.ioctl(ctx, &request{cmd: unix.DM_DEV_CREATE, name: name, eventNr: udevCookie})
	if errors.Is(err, unix.EBUSY) {
		// The kernel's answer to a name in use.
		return "", abi.Errorf(abi.AlreadyExists, "dm create %s: device exists", name)
	}
	if err != nil {
		return "", wrapErr("create", name, err)
	}
	dev := rep.Dev
	_, err = m.do(ctx, "load", name, &request{cmd: unix.DM_TABLE_LOAD, name: name, targetCount: uint32(len(table)), data: data})
	if err == nil {
		_, err = m.do(ctx, "resume", name, &request{cmd: unix.DM_DEV_SUSPEND, name: name, eventNr: udevCookie})
	}
	if err == nil {
		err = m.makeNode(name, dev)
	}
	if err != nil {
		// Cleanup on a fresh context: the caller's may be what failed.
		if rerr := m.Remove(context.WithoutCancel(ctx), name); rerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", rerr))
		}
		return "", err
	}
	return m.Path(name), nil
}

// Accepts asks the kernel whether it takes table, without activating
// anything: it loads the table into a new device called name, which never
// gets a node or a live table, and removes that device again. It returns
// the load's error (nil: accepted); AlreadyExists when name is in use.
// Loading runs the targets' constructors, which is how a caller learns,
// say, whether a thin pool holds an id without activating the volume.
func (m *Mapper) Accepts(ctx context.Context, name string, table []Target) (err error) {
	if err := m.confine(name); err != nil {
		return err
	}
	data, err := marshalTargets(table)
	if err != nil {
		return fmt.Errorf("dm probe %s: %w", name, err)
	}
	_, err = m.ioctl(ctx, &request{cmd: unix.DM_DEV_CREATE, name: name, eventNr: udevCookie})
	if errors.Is(err, unix.EBUSY) {
		return abi.Errorf(abi.AlreadyExists, "dm probe %s: device exists", name)
	}
	if err != nil {
		return wrapErr("probe", name, err)
	}
	defer func() {
		if rerr := m.Remove(context.WithoutCancel(ctx), name); rerr != nil {
			err = errors.Join(err, fmt.Errorf("dm probe %s: remove: %w", name, rerr))
		}
	}()
	_, err = m.do(ctx, "load", name, &request{cmd: unix.DM_TABLE_LOAD, name: name, targetCount: uint32(len(table)), data: data})
	return err
}

// Reload loads table into device name's inactive slot; Resume makes it
// live (the kernel suspends the device for the swap when it is not).
func (m *Mapper) Reload(ctx context.Context, name string, table []Target) error {
	if err := m.confine(name); err != nil {
		return err
	}
	data, err := marshalTargets(table)
	if err != nil {
		return fmt.Errorf("dm reload %s: %w", name, err)
	}
	_, err = m.do(ctx, "reload", name, &request{cmd: unix.DM_TABLE_LOAD, name: name, targetCount: uint32(len(table)), data: data})
	return err
}

// Suspend suspends device name: I/O queues until Resume. Pending I/O is
// flushed first; suspended devices stay suspended if the caller dies, so
// always pair it with Resume.
func (m *Mapper) Suspend(ctx context.Context, name string) error {
	if err := m.confine(name); err != nil {
		return err
	}
	_, err := m.do(ctx, "suspend", name, &request{cmd: unix.DM_DEV_SUSPEND, name: name, flags: flagSuspend})
	return err
}

// Resume resumes device name, first swapping in a table that Reload loaded.
func (m *Mapper) Resume(ctx context.Context, name string) error {
	if err := m.confine(name); err != nil {
		return err
	}
	rep, err := m.do(ctx, "resume", name, &request{cmd: unix.DM_DEV_SUSPEND, name: name, eventNr: udevCookie})
	if err != nil {
		return err
	}
	return m.makeNode(name, rep.Dev)
}

// Remove removes device name and its node. A missing device is success.
// While the device is open (a mount, a holder, udev probing) it retries a
// few times and then answers FailedPrecondition.
func (m *Mapper) Remove(ctx context.Context, name string) error {
	if err := m.confine(name); err != nil {
		return err
	}
	backoff := m.removeBackoff
	for attempt := 0; ; attempt++ {
		_, err := m.ioctl(ctx, &request{cmd: unix.DM_DEV_REMOVE, name: name, eventNr: udevCookie})
		switch {
		case err == nil, errors.Is(err, unix.ENXIO):
			return m.removeNode(name)
		case errors.Is(err, unix.EBUSY) && attempt < m.removeRetries:
			select {
			case <-ctx.Done():
				return fmt.Errorf("dm remove %s: %w", name, ctx.Err())
			case <-time.After(backoff):
			}
			backoff *= 2
		default:
			return wrapErr("remove", name, err)
		}
	}
}

// Info returns the state of device name; a missing device is Info{} with
// Exists false and no error.
func (m *Mapper) Info(ctx context.Context, name string) (Info, error) {
	if err := m.confine(name); err != nil {
		return Info{}, err
	}
	rep, err := m.ioctl(ctx, &request{cmd: unix.DM_DEV_STATUS, name: name})
	if errors.Is(err, unix.ENXIO) {
		return Info{Name: name}, nil
	}
	if err != nil {
		return Info{}, wrapErr("info", name, err)
	}
	return infoFrom(rep.header), nil
}

// DeviceName returns the device-mapper name of the block device at path
// (symlinks followed), as the kernel shows it in sysfs; ok is false when
// the device is not a device-mapper device. It needs no grant: it only
// tells whose device a path is, and the callers that act on the name go
// through a Mapper and its prefixes.
func DeviceName(path string) (name string, ok bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", false, fmt.Errorf("dm device name of %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", false, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/dm/name", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("dm device name of %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), true, nil
}

func infoFrom(h header) Info {
	return Info{
		Exists:        true,
		Name:          h.Name,
		UUID:          h.UUID,
		Major:         unix.Major(h.Dev),
		Minor:         unix.Minor(h.Dev),
		OpenCount:     int(h.OpenCount),
		TargetCount:   int(h.TargetCount),
		EventNr:       h.EventNr,
		Suspended:     h.Flags&flagSuspend != 0,
		ReadOnly:      h.Flags&flagReadOnly != 0,
		LiveTable:     h.Flags&flagActivePresent != 0,
		InactiveTable: h.Flags&flagInactivePres != 0,
	}
}

// Status returns the status line of each target of device name, as
// `dmsetup status` prints it. For thin pools asking commits the metadata.
func (m *Mapper) Status(ctx context.Context, name string) ([]TargetStatus, error) {
	specs, err := m.tableStatus(ctx, "status", name, 0)
	if err != nil {
		return nil, err
	}
	out := make([]TargetStatus, len(specs))
	for i, s := range specs {
		out[i] = TargetStatus{Start: s.Start, Length: s.Length, Type: s.Type, Status: s.Text}
	}
	return out, nil
}

// Table returns the live table of device name, as the kernel normalised it
// (devices as major:minor).
func (m *Mapper) Table(ctx context.Context, name string) ([]Target, error) {
	specs, err := m.tableStatus(ctx, "table", name, flagStatusTable)
	if err != nil {
		return nil, err
	}
	out := make([]Target, len(specs))
	for i, s := range specs {
		out[i] = Target{Start: s.Start, Length: s.Length, Type: s.Type, Params: s.Text}
	}
	return out, nil
}

func (m *Mapper) tableStatus(ctx context.Context, op, name string, flags uint32) ([]rawSpec, error) {
	if err := m.confine(name); err != nil {
		return nil, err
	}
	rep, err := m.do(ctx, op, name, &request{cmd: unix.DM_TABLE_STATUS, name: name, flags: flags, size: listBuffer})
	if err != nil {
		return nil, err
	}
	specs, err := parseSpecs(rep.data, rep.TargetCount)
	if err != nil {
		return nil, abi.Errorf(abi.Internal, "dm %s %s: %v", op, name, err)
	}
	return specs, nil
}

// Message sends msg to the target of device name that covers sector and
// returns the target's answer, if any (most messages answer nothing).
func (m *Mapper) Message(ctx context.Context, name string, sector uint64, msg string) (string, error) {
	if err := m.confine(name); err != nil {
		return "", err
	}
	if msg == "" || len(msg) > 4096 || !printable(msg) {
		return "", abi.Errorf(abi.InvalidArgument, "dm message %s: message must be 1-4096 printable bytes", name)
	}
	req := &request{cmd: unix.DM_TARGET_MSG, name: name, data: marshalMessage(sector, msg)}
	req.size = headerSize + len(req.data) + 4096
	rep, err := m.do(ctx, "message "+quoteWord(msg), name, req)
	if err != nil {
		return "", err
	}
	if rep.Flags&flagDataOut == 0 || rep.used == 0 {
		return "", nil
	}
	return cString(rep.data[:rep.used]), nil
}

// List returns the devices whose names lie under the granted prefixes.
func (m *Mapper) List(ctx context.Context) ([]Device, error) {
	rep, err := m.do(ctx, "list", "", &request{cmd: unix.DM_LIST_DEVICES, size: listBuffer})
	if err != nil {
		return nil, err
	}
	entries, err := parseNameList(rep.data)
	if err != nil {
		return nil, abi.Errorf(abi.Internal, "dm list: %v", err)
	}
	var out []Device
	for _, e := range entries {
		if m.confine(e.Name) == nil {
			out = append(out, Device{Name: e.Name, Major: unix.Major(e.Dev), Minor: unix.Minor(e.Dev)})
		}
	}
	return out, nil
}

func (m *Mapper) confine(name string) error { return Confine(m.prefixes, name) }

// do issues one command and turns its errno into an *abi.Error with context.
func (m *Mapper) do(ctx context.Context, op, name string, r *request) (reply, error) {
	rep, err := m.ioctl(ctx, r)
	if err != nil {
		return reply{}, wrapErr(op, name, err)
	}
	return rep, nil
}

func (m *Mapper) ioctl(ctx context.Context, r *request) (reply, error) {
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	fd, err := openControl(m.dir)
	if err != nil {
		return reply{}, err
	}
	defer unix.Close(fd)
	return ioctl(fd, r)
}

// Available reports whether this host has device-mapper: it opens the
// control node as every command does (creating it from sysfs when
// missing). It is the dm host calls' hostcalls.Func.Available.
func Available() error {
	fd, err := openControl(Dir)
	if err != nil {
		return wrapErr("control", "", err)
	}
	return unix.Close(fd)
}

// errNoDM marks a kernel without device-mapper.
var errNoDM = errors.New("device-mapper is not available (no /dev/mapper/control; is dm_mod loaded?)")

// openControl opens the control node, creating it from sysfs when devtmpfs
// or udev did not (as libdevmapper does).
func openControl(dir string) (int, error) {
	path := filepath.Join(dir, "control")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		return fd, nil
	}
	if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
		// A node left by a tool (dmsetup, lvm create it) on a kernel
		// without the driver.
		return -1, errNoDM
	}
	if !errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	devText, rerr := os.ReadFile("/sys/class/misc/device-mapper/dev")
	if rerr != nil {
		return -1, errNoDM
	}
	var major, minor uint32
	if _, serr := fmt.Sscanf(string(devText), "%d:%d", &major, &minor); serr != nil {
		return -1, fmt.Errorf("parse /sys/class/misc/device-mapper/dev %q: %w", devText, serr)
	}
	if merr := os.MkdirAll(dir, 0o755); merr != nil {
		return -1, merr
	}
	if merr := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); merr != nil && !errors.Is(merr, unix.EEXIST) {
		return -1, fmt.Errorf("mknod %s: %w", path, merr)
	}
	fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return fd, nil
}

// wrapErr gives an errno from a DM command its caller-visible code.
func wrapErr(op, name string, err error) error {
	what := "dm " + op
	if name != "" {
		what += " " + name
	}
	var code abi.Code
	var errno unix.Errno
	switch {
	case errors.Is(err, errNoDM):
		code = abi.FailedPrecondition
	case errors.Is(err, context.Canceled):
		code = abi.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = abi.DeadlineExceeded
	case errors.As(err, &errno):
		code = errnoCode(errno)
	default:
		code = abi.Internal
	}
	return abi.Errorf(code, "%s: %v", what, err)
}

// errnoCode maps the errnos DM commands and targets return.
func errnoCode(e unix.Errno) abi.Code {
	switch e {
	case unix.ENXIO, unix.ENODEV, unix.ENOENT, unix.ENODATA:
		return abi.NotFound // no such device, target or thin id
	case unix.EEXIST:
		return abi.AlreadyExists
	case unix.EBUSY:
		return abi.FailedPrecondition // open, mounted, or has active children
	case unix.EINVAL, unix.ENOTTY, unix.E2BIG, unix.ENAMETOOLONG:
		return abi.InvalidArgument // bad table or message; the kernel log says why
	case unix.ENOSPC, unix.ENOMEM:
		return abi.ResourceExhausted
	case unix.EPERM, unix.EACCES, unix.EROFS:
		return abi.PermissionDenied
	case unix.EAGAIN, unix.EINTR:
		return abi.Unavailable
	}
	return abi.Internal
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func quoteWord(s string) string { return "\"" + s + "\"" }
