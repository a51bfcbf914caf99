package loop

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// holder is a holders entry as os.ReadDir gives it.
type holder string

func (h holder) Name() string             { return string(h) }
func (holder) IsDir() bool                { return false }
func (holder) Type() fs.FileMode          { return fs.ModeSymlink }
func (holder) Info() (fs.FileInfo, error) { return nil, fs.ErrNotExist }

// TestHeldDeviceStaysStaged: a loop device that another device holds is
// refused when first claimed (a thin pool's data device) but, checked
// again as a recorded stage's device, still answers with its backing
// file's identity: what a workload stacks on its raw block volume
// (dm-crypt, LVM) holds the device too. The kernel's holders are faked:
// only device-mapper or md can hold a loop device.
func TestHeldDeviceStaysStaged(t *testing.T) {
	requireLoop(t)
	root := t.TempDir()
	file := imageIn(t, root, "a.img")
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	ctx := hostcalls.WithMemo(context.Background())
	var dev abi.LoopDevice
	if err := call(t, ctx, env, abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: file}, &dev); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d:%d", st.Dev, st.Ino)

	readHolders = func(name string) ([]os.DirEntry, error) {
		if !strings.HasSuffix(name, "/holders") {
			t.Errorf("read holders of %q", name)
		}
		return []os.DirEntry{holder("dm-7")}, nil
	}
	t.Cleanup(func() { readHolders = os.ReadDir })

	if _, owned, err := Devices.OwnsDevice(ctx, hostcalls.Device{Path: dev.Path, Real: dev.Path}, env.Roots); err != nil || owned {
		t.Errorf("first claim of a held device = %v, %v; want not owned", owned, err)
	}
	id, owned, err := Devices.OwnsDevice(ctx, hostcalls.Device{Path: dev.Path, Real: dev.Path, Staged: true}, env.Roots)
	if err != nil || !owned || id != want {
		t.Errorf("staged device, held = %q, %v, %v; want %q, true", id, owned, err, want)
	}
	if _, owned, err := Devices.OwnsDevice(ctx, hostcalls.Device{Path: dev.Path, Real: dev.Path, Staged: true}, []string{t.TempDir()}); err != nil || owned {
		t.Errorf("staged device, held, under other roots = %v, %v; want not owned", owned, err)
	}
}
