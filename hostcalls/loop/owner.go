package loop

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Devices answers for the loop devices this family attaches: a loop
// device is a module's while it is backed by a file inside the module's
// roots. Its identity is the backing file's ("<st_dev>:<st_ino>"), since a
// reboot frees loop devices and the same /dev/loopN may later back
// another file, even another volume's in the same pool.
var Devices hostcalls.DeviceOwner = owner{}

type owner struct{}

func (owner) OwnsDevice(ctx context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	if d.Real == "" || !strings.HasPrefix(filepath.Base(d.Real), "loop") {
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
