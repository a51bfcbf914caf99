package fs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// The filesystem types Make, Grow and MinimumSize know.
const (
	Ext4  = "ext4"
	XFS   = "xfs"
	Btrfs = "btrfs"
)

// MakeOptions are the optional settings of a new filesystem.
type MakeOptions struct {
	// Label is the filesystem label: printable UTF-8, at most 16 bytes for
	// ext4, 12 for xfs and 255 for btrfs. Empty means none.
	Label string
	// UUID is the filesystem UUID in canonical 8-4-4-4-12 hex form. Empty
	// lets the tool pick a random one.
	UUID string
}

// kind is what this package knows about one filesystem type.
type kind struct {
	maxLabel int
	// minSize is the smallest device the tool accepts, so that a too small
	// volume fails with a clear code before any program runs.
	minSize int64
	// mkfs returns the program and arguments that make the filesystem.
	mkfs func(device string, o MakeOptions) []string
}

func kindOf(fstype string) (kind, error) {
	switch fstype {
	case Ext4:
		return kind{maxLabel: 16, minSize: 1 << 20, mkfs: func(dev string, o MakeOptions) []string {
			// No discard (a fresh volume is already unmapped; discarding a
			// loop device punches every hole again), lazy inode-table and
			// journal init (the kernel finishes them in the background),
			// and no root-reserved blocks: a volume's capacity is its
			// user's, as in Kubernetes' own formatter.
			args := []string{"mkfs.ext4", "-F", "-q", "-m", "0",
				"-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"}
			if o.Label != "" {
				args = append(args, "-L", o.Label)
			}
			if o.UUID != "" {
				args = append(args, "-U", o.UUID)
			}
			return append(args, dev)
		}}, nil
	case XFS:
		// xfsprogs 5.19 and later refuse filesystems under 300 MiB.
		return kind{maxLabel: 12, minSize: 300 << 20, mkfs: func(dev string, o MakeOptions) []string {
			args := []string{"mkfs.xfs", "-f", "-q", "-K"}
			if o.Label != "" {
				args = append(args, "-L", o.Label)
			}
			if o.UUID != "" {
				args = append(args, "-m", "uuid="+o.UUID)
			}
			return append(args, dev)
		}}, nil
	case Btrfs:
		// btrfs-progs' minimum for one device with the default profiles.
		return kind{maxLabel: 255, minSize: 114294784, mkfs: func(dev string, o MakeOptions) []string {
			args := []string{"mkfs.btrfs", "-f", "-q", "-K"}
			if o.Label != "" {
				args = append(args, "-L", o.Label)
			}
			if o.UUID != "" {
				args = append(args, "-U", o.UUID)
			}
			return append(args, dev)
		}}, nil
	}
	return kind{}, abi.Errorf(abi.InvalidArgument, "unsupported filesystem type %q (supported: ext4, xfs, btrfs)", fstype)
}

// MinimumSize returns the smallest device, in bytes, on which Make can put
// fstype, so that callers can round a requested capacity up.
func MinimumSize(fstype string) (int64, error) {
	k, err := kindOf(fstype)
	if err != nil {
		return 0, err
	}
	return k.minSize, nil
}

// Probe reports what device holds: a filesystem type ("ext4", "xfs",
// "LVM2_member", "linux_raid_member", "swap", ...), a partition-table type
// ("gpt", "dos", ...) when there is no filesystem, or "" when blkid finds no
// signature at all. Only "" means the device may be formatted. Signatures
// that contradict each other are an abi.FailedPrecondition error (blkid's
// "ambivalent" answer), except where the first 4 KiB hold an ext or xfs
// superblock: that filesystem is the answer (see Inspect).
func Probe(ctx context.Context, device string) (string, error) {
	in, err := Inspect(ctx, device)
	if err != nil {
		return "", err
	}
	in.Close()
	return in.Type, nil
}

// Inspection is what Inspect learned of a device.
type Inspection struct {
	// Type is what Probe reports.
	Type string
	// Size is what ReadSize reports, valid when SizeOK is set.
	Size   Size
	SizeOK bool
	f      *os.File
}

// Close lets the device go. Until then the device stays open, and with it
// the kernel's cache of the bytes Inspect read: a mount made before Close
// reads its superblock from memory instead of the device (closing a block
// device's last opener drops that cache).
func (in *Inspection) Close() error {
	if in.f == nil {
		return nil
	}
	err := in.f.Close()
	in.f = nil
	return err
}

// Inspect is Probe and ReadSize with one open and one read of the
// device's first bytes: a stage of a formatted volume needs both, and
// each read of a freshly attached device goes to its storage (a loop
// device with direct I/O reads the backing file past the page cache).
// The caller must Close the result.
func Inspect(ctx context.Context, device string) (*Inspection, error) {
	if err := checkDevice(device); err != nil {
		return nil, fmt.Errorf("probe %s: %w", device, err)
	}
	f, err := os.OpenFile(device, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			err = abi.Errorf(abi.PermissionDenied, "%v", err)
		}
		return nil, fmt.Errorf("probe %s: %w", device, err)
	}
	in := &Inspection{f: f}
	// The read also proves the device readable, so that blkid's "nothing
	// found" below really means blank.
	// The first 4 KiB hold the superblocks of ext2/3/4 and xfs; only
	// without one of them is the rest read, for btrfs's at 64 KiB (a read
	// of 68 KiB through a direct-I/O loop device costs about 2.5 times
	// one of 4 KiB).
	buf := make([]byte, superblockBytes)
	n, err := f.ReadAt(buf[:firstBytes], 0)
	if err == nil && knownMagic(buf[:n]) == "" {
		var m int
		m, err = f.ReadAt(buf[n:], int64(n))
		n += m
	}
	if err != nil && !errors.Is(err, io.EOF) {
		in.Close()
		return nil, fmt.Errorf("probe %s: read: %w", device, err)
	}
	// A filesystem this package makes is recognized in process (magic.go).
	if in.Type = knownMagic(buf[:n]); in.Type != "" {
		size, err := ioctlSize(f)
		if err != nil {
			in.Close()
			return nil, fmt.Errorf("size of %s: %w", device, err)
		}
		in.Size, in.SizeOK = sizeOf(buf[:n], size, int64(os.Getpagesize()))
		return in, nil
	}
	if in.Type, err = blkidProbe(ctx, device); err != nil {
		in.Close()
		return nil, err
	}
	return in, nil
}

// blkidProbe is Probe for a device whose first bytes hold no filesystem
// this package knows.
func blkidProbe(ctx context.Context, device string) (string, error) {
	out, err := run(ctx, "blkid", "-p", "-o", "export", device)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		switch exit.ExitCode() {
		case 2: // nothing found
			return "", nil
		case 8: // ambivalent low-level probing result
			return "", fmt.Errorf("probe %s: %w", device, abi.Errorf(abi.FailedPrecondition, "conflicting signatures on the device: %s", tail(out)))
		}
	}
	if err != nil {
		return "", fmt.Errorf("probe %s: %w", device, err)
	}
	var fstype, pttype string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, _ := strings.Cut(sc.Text(), "=")
		switch key {
		case "TYPE":
			fstype = value
		case "PTTYPE":
			pttype = value
		}
	}
	switch {
	case fstype != "":
		return fstype, nil
	case pttype != "":
		return pttype, nil
	}
	// blkid found something it cannot name: never call that blank.
	return "unknown", nil
}

// Make creates a filesystem of type fstype on device. It refuses with
// abi.FailedPrecondition when Probe finds anything on the device, with
// abi.InvalidArgument for an unknown type or bad options, and with
// abi.OutOfRange when the device is smaller than MinimumSize.
func Make(ctx context.Context, device, fstype string, opts MakeOptions) error {
	k, err := kindOf(fstype)
	if err != nil {
		return fmt.Errorf("make %s on %s: %w", fstype, device, err)
	}
	if err := checkOptions(k, opts); err != nil {
		return fmt.Errorf("make %s on %s: %w", fstype, device, err)
	}
	size, err := DeviceSize(ctx, device)
	if err != nil {
		return fmt.Errorf("make %s: %w", fstype, err)
	}
	if size < k.minSize {
		return fmt.Errorf("make %s on %s: %w", fstype, device, abi.Errorf(abi.OutOfRange, "device has %d bytes, %s needs at least %d", size, fstype, k.minSize))
	}
	found, err := Probe(ctx, device)
	if err != nil {
		return fmt.Errorf("make %s: %w", fstype, err)
	}
	if found != "" {
		return fmt.Errorf("make %s on %s: %w", fstype, device, abi.Errorf(abi.FailedPrecondition, "device already holds %s; refusing to format it", found))
	}
	args := k.mkfs(device, opts)
	if _, err := run(ctx, args[0], args[1:]...); err != nil {
		return fmt.Errorf("make %s on %s: %w", fstype, device, err)
	}
	return nil
}

// Grow grows the filesystem of type fstype on device to fill the device.
// Mounted at mountPath, any of them grows by its resize ioctl on the mount
// point (grow.go; the kernel wants CAP_SYS_RESOURCE for ext4). xfs and
// btrfs grow only while mounted. ext4 also grows offline when mountPath is
// "", with resize2fs after the forced preen check resize2fs demands (e2fsck
// -f -p, which refuses a mounted filesystem): the kernel has no ioctl for
// an unmounted filesystem. The device must already have its new size (see
// loop.Resize).
func Grow(ctx context.Context, device, mountPath, fstype string) error {
	if _, err := kindOf(fstype); err != nil {
		return fmt.Errorf("grow %s: %w", device, err)
	}
	if mountPath == "" && fstype == Ext4 {
		if err := checkDevice(device); err != nil {
			return fmt.Errorf("grow %s: %w", device, err)
		}
		if err := preen(ctx, device); err != nil {
			return fmt.Errorf("grow %s %s offline: %w", fstype, device, err)
		}
		if _, err := run(ctx, "resize2fs", device); err != nil {
			return fmt.Errorf("grow %s %s: %w", fstype, device, err)
		}
		return nil
	}
	if err := checkMountPath(mountPath); err != nil {
		return fmt.Errorf("grow %s: %w", device, err)
	}
	if err := checkDevice(device); err != nil {
		return fmt.Errorf("grow %s: %w", device, err)
	}
	if err := growOnline(ctx, device, mountPath, fstype); err != nil {
		return fmt.Errorf("grow %s %s at %s: %w", fstype, device, mountPath, err)
	}
	return nil
}

// preen runs the forced, automatic-repair-only check of an unmounted ext4
// filesystem. Exit status 1 means it fixed something safe; anything above
// needs a human.
func preen(ctx context.Context, device string) error {
	_, err := run(ctx, "e2fsck", "-f", "-p", device)
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 {
		return nil
	}
	return err
}

func checkOptions(k kind, o MakeOptions) error {
	if len(o.Label) > k.maxLabel {
		return abi.Errorf(abi.InvalidArgument, "label longer than %d bytes", k.maxLabel)
	}
	if !utf8.ValidString(o.Label) || strings.IndexFunc(o.Label, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return abi.Errorf(abi.InvalidArgument, "label %q is not printable UTF-8", o.Label)
	}
	if o.UUID != "" && !isUUID(o.UUID) {
		return abi.Errorf(abi.InvalidArgument, "uuid %q is not in 8-4-4-4-12 hex form", o.UUID)
	}
	return nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range []byte(s) {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// checkDevice accepts an absolute, clean path to an existing block device.
func checkDevice(device string) error {
	if !filepath.IsAbs(device) || filepath.Clean(device) != device {
		return abi.Errorf(abi.InvalidArgument, "device path %q is not absolute and clean", device)
	}
	var st unix.Stat_t
	if err := unix.Stat(device, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return abi.Errorf(abi.NotFound, "no such device")
		}
		return fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return abi.Errorf(abi.InvalidArgument, "not a block device")
	}
	return nil
}

// checkMountPath accepts an absolute, clean path to an existing folder.
func checkMountPath(path string) error {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return abi.Errorf(abi.InvalidArgument, "mount path %q is not absolute and clean", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return abi.Errorf(abi.NotFound, "mount path %q does not exist", path)
		}
		return err
	}
	if !fi.IsDir() {
		return abi.Errorf(abi.InvalidArgument, "mount path %q is not a folder", path)
	}
	return nil
}

// lookTool finds a program in PATH and then in the usual system folders:
// daemons often start with a PATH that lacks the sbin folders these tools
// live in.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", abi.Errorf(abi.FailedPrecondition, "%s is not installed", name)
}

// run runs a tool with a C locale and returns its combined output. A
// failure's error carries the command and the end of its output.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	path, err := lookTool(name)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		return out, &toolError{cmd: name + " " + strings.Join(args, " "), err: err, out: tail(out)}
	}
	return out, nil
}

// toolError is a failed program run; it unwraps to the *exec.ExitError (or
// the context's error) so callers can read the exit code.
type toolError struct {
	cmd, out string
	err      error
}

func (e *toolError) Error() string {
	if e.out == "" {
		return e.cmd + ": " + e.err.Error()
	}
	return e.cmd + ": " + e.err.Error() + ": " + e.out
}

func (e *toolError) Unwrap() error { return e.err }

// tail keeps the last KiB of a tool's output on one line.
func tail(out []byte) string {
	const max = 1024
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(strings.Fields(string(out)), " ")
}
