package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/hostcalltest"
)

// requireLoop skips t unless this process can attach loop devices (the
// package's own tests cannot use looptest, which imports it).
func requireLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: attaches loop devices")
	}
	if _, err := os.Stat(controlPath); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
}

// imageIn creates a sparse 4 MiB file in dir and detaches, when the test
// ends (also on failure), whatever device then backs it: the tests below
// move files between devices, so a device path alone may by then be
// another's.
func imageIn(t *testing.T, dir, name string) string {
	t.Helper()
	file := filepath.Join(dir, name)
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 4<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for {
			d, ok, err := Find(ctx, file)
			if err != nil || !ok {
				return
			}
			if err := DetachBound(ctx, d); err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
		}
	})
	return file
}

// rebind detaches dev and binds file to that same device at once, as
// another process may do between two steps of one operation. The test is
// skipped when another attacher takes the device in between.
func rebind(t *testing.T, dev, file string) {
	t.Helper()
	if err := Detach(context.Background(), dev); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
	if err := unix.IoctlLoopConfigure(int(d.Fd()), &cfg); errors.Is(err, unix.EBUSY) {
		t.Skipf("another attacher took %s meanwhile: %v", dev, err)
	} else if err != nil {
		t.Fatalf("LOOP_CONFIGURE %s: %v", dev, err)
	}
}

// call runs the binding name under ctx as a module would.
func call(t *testing.T, ctx context.Context, env *hostcalls.Env, name string, req, resp hostcalls.Message) error {
	t.Helper()
	return hostcalltest.CallContext(t, ctx, Bindings(), Family, env, name, req, resp)
}

// countSysfs counts the reads of sysfs backing_file until the test ends.
func countSysfs(t *testing.T) *int {
	n := new(int)
	readSysfs = func(name string) ([]byte, error) {
		if strings.HasSuffix(name, "/loop/backing_file") {
			*n++
		}
		return readAttribute(name)
	}
	t.Cleanup(func() { readSysfs = readAttribute })
	return n
}

// TestOneDescriptionPerOperation: within one operation (one memo), the
// claim after loop_attach and the grant check of loop_detach after
// loop_find reuse the description the first call read, where each used to
// describe the device again; each reads only the backing file's path
// again (a rename may have moved it), and loop_detach's exclusive check
// after its grant check reads nothing more. The answers are those of a
// fresh description.
func TestOneDescriptionPerOperation(t *testing.T) {
	requireLoop(t)
	root := t.TempDir()
	file := imageIn(t, root, "a.img")
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	reads := countSysfs(t)

	stage := hostcalls.WithMemo(context.Background())
	var dev abi.LoopDevice
	if err := call(t, stage, env, abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: file}, &dev); err != nil {
		t.Fatal(err)
	}
	id, owned, err := Devices.OwnsDevice(stage, hostcalls.Device{Path: dev.Path, Real: dev.Path}, env.Roots)
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d:%d", st.Dev, st.Ino); err != nil || !owned || id != want {
		t.Fatalf("claim after attach = %q, %v, %v; want %q, true", id, owned, err, want)
	}
	if *reads != 2 {
		t.Errorf("attach and claim read backing_file %d times, want 2", *reads)
	}

	*reads = 0
	unstage := hostcalls.WithMemo(context.Background())
	var found abi.LoopFindResponse
	if err := call(t, unstage, env, abi.HostCallLoopFind, &abi.LoopFileRequest{File: file}, &found); err != nil || !found.Found {
		t.Fatalf("loop_find = %+v, %v", found, err)
	}
	if err := call(t, unstage, env, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: found.Device.Path}, &abi.Empty{}); err != nil {
		t.Fatal(err)
	}
	if *reads != 2 {
		t.Errorf("find and detach read backing_file %d times, want 2", *reads)
	}
	if _, ok, err := Find(context.Background(), file); err != nil || ok {
		t.Fatalf("after loop_detach the file is still attached (%v, %v)", ok, err)
	}
}

// TestMemoRefusesARebind: a description in the memo is worth nothing once
// the device was detached and bound to another file, one outside the
// caller's roots: the claim, Status and the grant of loop_detach each see
// the file that backs the device now.
func TestMemoRefusesARebind(t *testing.T) {
	requireLoop(t)
	root, outsideDir := t.TempDir(), t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	for _, tc := range []struct {
		name  string
		check func(t *testing.T, ctx context.Context, dev, outside string)
	}{
		{"claim", func(t *testing.T, ctx context.Context, dev, _ string) {
			if id, owned, err := Devices.OwnsDevice(ctx, hostcalls.Device{Path: dev, Real: dev}, env.Roots); err != nil || owned {
				t.Fatalf("claim of a device re-bound outside the roots = %q, %v, %v; want not owned", id, owned, err)
			}
		}},
		{"status", func(t *testing.T, ctx context.Context, dev, outside string) {
			d, bound, err := Status(ctx, dev)
			if err != nil || !bound || d.BackingFile != outside {
				t.Fatalf("status of a re-bound device = %+v, %v, %v; want backed by %s", d, bound, err, outside)
			}
		}},
		{"loop_detach", func(t *testing.T, ctx context.Context, dev, outside string) {
			err := call(t, ctx, env, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: dev}, &abi.Empty{})
			if abi.CodeOf(err) != abi.PermissionDenied {
				t.Fatalf("loop_detach of a device re-bound outside the roots = %v, want PERMISSION_DENIED", err)
			}
			if d, ok, err := Find(context.Background(), outside); err != nil || !ok || d.Path != dev {
				t.Fatalf("a refused detach detached the device: %+v, %v, %v", d, ok, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inside := imageIn(t, root, tc.name+".img")
			outside := imageIn(t, outsideDir, tc.name+".img")
			ctx := hostcalls.WithMemo(context.Background())
			// The operation's first step: attach, or find the attached
			// file (what node_unstage does before loop_detach).
			var dev abi.LoopDevice
			if err := call(t, ctx, env, abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: inside}, &dev); err != nil {
				t.Fatal(err)
			}
			var found abi.LoopFindResponse
			if err := call(t, ctx, env, abi.HostCallLoopFind, &abi.LoopFileRequest{File: inside}, &found); err != nil || found.Device != dev {
				t.Fatalf("loop_find = %+v, %v", found, err)
			}
			rebind(t, dev.Path, outside)
			tc.check(t, ctx, dev.Path, outside)
		})
	}
}

// TestMemoRefusesARebindOfTheSameFile: the same file detached and bound
// again to the same device, renamed meanwhile, is described afresh: its
// identity alone would pass, the disk sequence number does not.
func TestMemoRefusesARebindOfTheSameFile(t *testing.T) {
	requireLoop(t)
	root := t.TempDir()
	file := imageIn(t, root, "a.img")
	ctx := hostcalls.WithMemo(context.Background())
	d, err := Attach(ctx, file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f, err := os.Open(d.Path); err == nil {
		seq := diskSeq(int(f.Fd()))
		f.Close()
		if seq == 0 {
			t.Skip("this kernel has no disk sequence numbers (BLKGETDISKSEQ, Linux 5.15)")
		}
	}
	renamed := filepath.Join(root, "b.img")
	if err := os.Rename(file, renamed); err != nil {
		t.Fatal(err)
	}
	imageCleanup(t, renamed)
	rebind(t, d.Path, renamed)
	got, bound, err := Status(ctx, d.Path)
	if err != nil || !bound || got.BackingFile != renamed {
		t.Fatalf("status after a rebind = %+v, %v, %v; want backed by %s", got, bound, err, renamed)
	}
}

// imageCleanup detaches, when the test ends, the device that then backs
// file.
func imageCleanup(t *testing.T, file string) {
	t.Cleanup(func() {
		ctx := context.Background()
		if d, ok, err := Find(ctx, file); err == nil && ok {
			if err := DetachBound(ctx, d); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
}

// TestDetachBusyKeepsItsCodes: loop_detach checks the grant before it opens
// the device exclusively, and a device in use fails that open; the
// answer is the grant's first (PERMISSION_DENIED for a device
// backed outside the roots, busy or not) and FAILED_PRECONDITION for a
// busy device of the caller's, and neither is detached.
func TestDetachBusyKeepsItsCodes(t *testing.T) {
	requireLoop(t)
	root, outsideDir := t.TempDir(), t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	for _, tc := range []struct {
		dir  string
		want abi.Code
	}{{root, abi.FailedPrecondition}, {outsideDir, abi.PermissionDenied}} {
		file := imageIn(t, tc.dir, "busy.img")
		for _, memo := range []bool{false, true} {
			ctx := context.Background()
			if memo {
				ctx = hostcalls.WithMemo(ctx)
			}
			d, err := Attach(ctx, file, Options{})
			if err != nil {
				t.Fatal(err)
			}
			// An exclusive opener, as a mount is.
			held, err := os.OpenFile(d.Path, os.O_RDONLY|unix.O_EXCL, 0)
			if err != nil {
				t.Fatal(err)
			}
			err = call(t, ctx, env, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: d.Path}, &abi.Empty{})
			held.Close()
			if abi.CodeOf(err) != tc.want {
				t.Errorf("loop_detach of a held device backed by %s (memo %v) = %v, want %v", file, memo, err, tc.want)
			}
			if got, ok, err := Find(context.Background(), file); err != nil || !ok || got.Path != d.Path {
				t.Fatalf("a refused detach detached %s: %+v, %v, %v", d.Path, got, ok, err)
			}
		}
	}
}

// TestReadAttribute: one read gets a sysfs attribute whole, as os.ReadFile
// does with its reads to the end, and a missing one is os.ErrNotExist.
func TestReadAttribute(t *testing.T) {
	requireLoop(t)
	file := imageIn(t, t.TempDir(), "a.img")
	d, err := Attach(context.Background(), file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	path := sysBlock + "/" + strings.TrimPrefix(d.Path, "/dev/") + "/loop/backing_file"
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readAttribute(path); err != nil || string(got) != string(want) || string(got) != file+"\n" {
		t.Fatalf("readAttribute = %q, %v; want %q", got, err, want)
	}
	if _, err := readAttribute(sysBlock + "/loop-none/loop/backing_file"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("readAttribute of a missing attribute = %v, want not-exist", err)
	}
}

// TestMemoSeesARename: the memo's description keeps the backing file's
// identity, but the file may have been renamed since, out of the caller's
// roots: the claim and loop_detach's grant check go by the path the kernel
// shows now.
func TestMemoSeesARename(t *testing.T) {
	requireLoop(t)
	root, outsideDir := t.TempDir(), t.TempDir()
	file := imageIn(t, root, "moved.img")
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	ctx := hostcalls.WithMemo(context.Background())
	var dev abi.LoopDevice
	if err := call(t, ctx, env, abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: file}, &dev); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(outsideDir, "moved.img")
	if err := os.Rename(file, moved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Rename(moved, file) })
	if _, owned, err := Devices.OwnsDevice(ctx, hostcalls.Device{Path: dev.Path, Real: dev.Path}, env.Roots); err != nil || owned {
		t.Errorf("claim of a device whose file was moved out of the roots = %v, %v; want not owned", owned, err)
	}
	err := call(t, ctx, env, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: dev.Path}, &abi.Empty{})
	if abi.CodeOf(err) != abi.PermissionDenied {
		t.Errorf("loop_detach of a device whose file was moved out of the roots = %v, want PERMISSION_DENIED", err)
	}
}

// TestRefusedDetachClaimsNothing: a caller the device is not granted to
// must not hold it exclusively even for the time of its refused
// loop_detach: the owner's mkfs or mount would fail with EBUSY meanwhile.
// The grant is checked before the exclusive open.
func TestRefusedDetachClaimsNothing(t *testing.T) {
	requireLoop(t)
	ctx := context.Background()
	d, err := Attach(ctx, imageIn(t, t.TempDir(), "theirs.img"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	claimed := false
	err = detach(hostcalls.WithMemo(ctx), d.Path, func(Device) error {
		// What the owner would do at this moment.
		fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EBUSY) {
			claimed = true
		} else if err == nil {
			unix.Close(fd)
		}
		return abi.Errorf(abi.PermissionDenied, "not yours")
	})
	if abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("detach = %v, want PERMISSION_DENIED", err)
	}
	if claimed {
		t.Error("the device was held exclusively while the grant was checked")
	}
}
