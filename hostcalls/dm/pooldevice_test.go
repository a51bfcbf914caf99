package dm

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// A pool over files: the module attaches them with loop_attach, so a loop
// device whose backing file lies in a granted root is a granted device.
func TestPoolDeviceAcceptsLoopOfGrantedFile(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	dev, file := looptest.Device(t, 16<<20)
	if got, err := poolDevice(ctx, []string{filepath.Dir(file)}, dev); err != nil || got != dev {
		t.Fatalf("loop device of a granted file: %q, %v", got, err)
	}
	if _, err := poolDevice(ctx, []string{"/srv/elsewhere"}, dev); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("loop device of a file outside the roots: %v", err)
	}
	if got, err := poolDevice(ctx, []string{"/dev/vdb"}, "/dev/vdb"); err != nil || got != "/dev/vdb" {
		t.Fatalf("a granted device path: %q, %v", got, err)
	}
	if _, err := poolDevice(ctx, []string{"/dev/vdb"}, "/dev/vda"); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("an ungranted device: %v", err)
	}
}

// DeviceName tells a loop device and a plain file from device-mapper
// devices (the VM tier checks a real one: TestDeviceNameOfMappedDevice).
func TestDeviceNameOfOtherDevices(t *testing.T) {
	looptest.Require(t)
	dev, file := looptest.Device(t, 1<<20)
	for _, p := range []string{dev, file} {
		if name, ok, err := DeviceName(p); err != nil || ok || name != "" {
			t.Errorf("DeviceName(%s) = %q, %v, %v; want not a device-mapper device", p, name, ok, err)
		}
	}
	if _, _, err := DeviceName(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("DeviceName of a missing path: no error")
	}
}
