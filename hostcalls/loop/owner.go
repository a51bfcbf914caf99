package loop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Devices answers for the loop devices this family attaches: a loop
// device is a module's while it is backed by a file inside the module's
// roots. Its identity is the backing file's ("<st_dev>:<st_ino>"), since a
// reboot frees loop devices and the same /dev/loopN may later back
// another file, even another volume's in the same pool.
//
// The device is told by its device number, not its name: the node must be
// /dev/loopN of loop device N. A loop device that another device holds (a
// thin pool's data or metadata device built on files in the pool) is the
// holder's, never staged: handing it out would hand out every volume of
// the pool. That rule holds when the device is first claimed; a recorded
// stage's device (d.Staged) is accepted though held, since what a workload
// builds on its raw block volume (dm-crypt, LVM, md) holds it too, and the
// backing file's identity, which the host compares with the record, tells
// the volume's device from any other.
var Devices hostcalls.DeviceOwner = owner{}

type owner struct{}

func (owner) OwnsDevice(ctx context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	if d.Real == "" || !strings.HasPrefix(filepath.Base(d.Real), "loop") {
		return "", false, nil
	}
	sys, ok := loopNode(d.Real)
	if !ok || (!d.Staged && held(sys)) {
		return "", false, nil
	}
	// Right after node_stage attached it, ctx's memo holds the device's
	// description: the size is not needed, so status reads only what
	// tells whether the device is still bound as then.
	dev, bound, err := status(ctx, d.Real, false)
	if err != nil || !bound {
		return "", false, err
	}
	if _, err := hostcalls.Confine(roots, dev.BackingFile, false); err != nil {
		return "", false, nil
	}
	return fmt.Sprintf("%d:%d", dev.Dev, dev.Inode), true, nil
}

// loopNode returns the sysfs folder of the block device at path when path
// is its own node, /dev/<name>, and a loop device.
func loopNode(path string) (string, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != loopMajor {
		return "", false
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	target, err := os.Readlink(sys)
	if err != nil || path != "/dev/"+filepath.Base(target) {
		return "", false
	}
	return sys, true
}

// held reports whether another device holds the block device whose sysfs
// folder is sys (or whether that cannot be read).
func held(sys string) bool {
	holders, err := readHolders(sys + "/holders")
	return err != nil || len(holders) > 0
}

// readHolders reads a holders folder; tests replace it.
var readHolders = os.ReadDir
