package dm

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Devices answers for the device-mapper devices this family makes, by
// name alone: a device node inside a granted /dev root is the module's
// (prefix match, so the root /dev/mapper/wasmcsi- grants every device
// named after it, the names the module's dm grant lets it create).
var Devices hostcalls.DeviceOwner = owner{}

type owner struct{}

func (owner) OwnsDevice(_ context.Context, d hostcalls.Device, roots []string) (string, bool, error) {
	if d.Real != "" {
		return "", false, nil
	}
	for _, r := range roots {
		if strings.HasPrefix(filepath.Clean(d.Path), r) && strings.HasPrefix(r, "/dev/") {
			return "", true, nil
		}
	}
	return "", false, nil
}
