package loop_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

const mib = 1 << 20

// attach attaches file and detaches the device when the test ends.
func attach(t *testing.T, file string, opts loop.Options) loop.Device {
	t.Helper()
	d, err := loop.Attach(context.Background(), file, opts)
	if err != nil {
		t.Fatalf("attach %s: %v", file, err)
	}
	t.Cleanup(func() {
		if err := loop.DetachBound(context.Background(), d); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return d
}

func identity(t *testing.T, path string) (dev, ino uint64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev, st.Ino
}

func TestAttachFindResizeDetach(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	file := looptest.SparseFile(t, 8*mib)
	d := attach(t, file, loop.Options{})

	dev, ino := identity(t, file)
	want := loop.Device{Path: d.Path, BackingFile: file, Dev: dev, Inode: ino, SizeBytes: 8 * mib}
	if d != want {
		t.Fatalf("attach = %+v, want %+v", d, want)
	}

	// The device really is the file: a write through it lands in the file.
	payload := bytes.Repeat([]byte("wasmcsi!"), 512)
	writeAt(t, d.Path, payload, 3*mib)
	got := make([]byte, len(payload))
	readAt(t, file, got, 3*mib)
	if !bytes.Equal(got, payload) {
		t.Fatal("data written to the device is not in the backing file")
	}

	found, ok, err := loop.Find(ctx, file)
	if err != nil || !ok || found != d {
		t.Fatalf("find = %+v, %v, %v; want %+v", found, ok, err, d)
	}

	if err := os.Truncate(file, 20*mib); err != nil {
		t.Fatal(err)
	}
	size, err := loop.Resize(ctx, d.Path)
	if err != nil || size != 20*mib {
		t.Fatalf("resize = %d, %v; want %d", size, err, 20*mib)
	}
	if found, _, _ := loop.Find(ctx, file); found.SizeBytes != 20*mib {
		t.Fatalf("size after resize = %d", found.SizeBytes)
	}

	if err := loop.Detach(ctx, d.Path); err != nil {
		t.Fatalf("detach: %v", err)
	}
	if found, ok, err := loop.Find(ctx, file); err != nil || ok {
		t.Fatalf("find after detach = %+v, %v, %v; want not found", found, ok, err)
	}
	// Detached once, the number is anyone's: a second detach by path
	// could unbind another process's device.
	if err := loop.DetachBound(ctx, d); err != nil {
		t.Fatalf("second detach: %v", err)
	}
	if _, err := loop.Resize(ctx, d.Path); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("resize of a free device = %v, want NOT_FOUND", err)
	}
}

func TestAttachTwiceReturnsSameDevice(t *testing.T) {
	looptest.Require(t)
	file := looptest.SparseFile(t, 4*mib)
	first := attach(t, file, loop.Options{})
	second := attach(t, file, loop.Options{})
	if first != second {
		t.Fatalf("second attach = %+v, want %+v", second, first)
	}
	// Another path to the same inode is the same file.
	link := filepath.Join(filepath.Dir(file), "hardlink.img")
	if err := os.Link(file, link); err != nil {
		t.Fatal(err)
	}
	third := attach(t, link, loop.Options{})
	if third.Path != first.Path {
		t.Fatalf("attach through a hard link = %s, want %s", third.Path, first.Path)
	}
}

// A file another process attached (so this one has no hint of it), with
// other files' devices bound before it, is found by Attach and returned,
// never bound a second time; asked with the other read-only mode, Attach
// refuses. It is the check that keeps one file off two devices.
func TestAttachFindsDeviceOfAnotherProcess(t *testing.T) {
	looptest.Require(t)
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup to attach from another process: ", err)
	}
	for range 3 {
		attach(t, looptest.SparseFile(t, mib), loop.Options{})
	}
	file := looptest.SparseFile(t, 4*mib)
	out, err := exec.Command("losetup", "-f", "--show", file).Output()
	if err != nil {
		t.Fatalf("losetup -f --show %s: %v", file, err)
	}
	theirs := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		// By the file: attach's cleanup detaches the device first.
		if d, ok, err := loop.Find(context.Background(), file); err == nil && ok {
			if err := loop.DetachBound(context.Background(), d); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	d := attach(t, file, loop.Options{})
	if d.Path != theirs {
		t.Fatalf("attach of a file losetup attached to %s = %s, want that device", theirs, d.Path)
	}
	dev, ino := identity(t, file)
	if d.Dev != dev || d.Inode != ino || d.SizeBytes != 4*mib || d.BackingFile != file {
		t.Fatalf("attach = %+v, want %s of %d bytes, file %d:%d", d, file, 4*mib, dev, ino)
	}
	_, err = loop.Attach(context.Background(), file, loop.Options{ReadOnly: true})
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("read-only attach of a file attached read-write = %v, want FailedPrecondition", err)
	}
}

func TestAttachConcurrentFiles(t *testing.T) {
	looptest.Require(t)
	const n = 8
	files := make([]string, n)
	for i := range files {
		files[i] = looptest.SparseFile(t, 2*mib)
	}
	devs := make([]loop.Device, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range files {
		wg.Go(func() { devs[i], errs[i] = loop.Attach(context.Background(), files[i], loop.Options{}) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, d := range devs {
		if errs[i] != nil {
			t.Errorf("attach %d: %v", i, errs[i])
			continue
		}
		t.Cleanup(func() {
			if err := loop.DetachBound(context.Background(), d); err != nil {
				t.Error(err)
			}
		})
		if seen[d.Path] {
			t.Errorf("device %s handed out twice", d.Path)
		}
		seen[d.Path] = true
		if dev, ino := identity(t, files[i]); d.Dev != dev || d.Inode != ino {
			t.Errorf("%s backs %d:%d, want %s (%d:%d)", d.Path, d.Dev, d.Inode, files[i], dev, ino)
		}
	}
}

func TestAttachSameFileConcurrently(t *testing.T) {
	looptest.Require(t)
	const n = 8
	file := looptest.SparseFile(t, 2*mib)
	devs := make([]loop.Device, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { devs[i], errs[i] = loop.Attach(context.Background(), file, loop.Options{}) })
	}
	wg.Wait()
	paths := map[string]loop.Device{}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("attach %d: %v", i, errs[i])
			continue
		}
		paths[devs[i].Path] = devs[i]
	}
	for _, d := range paths {
		t.Cleanup(func() {
			if err := loop.DetachBound(context.Background(), d); err != nil {
				t.Error(err)
			}
		})
	}
	if len(paths) != 1 {
		t.Fatalf("%d concurrent attaches of one file gave devices %v, want one", n, paths)
	}
}

func TestReadOnly(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	file := looptest.SparseFile(t, 4*mib)
	d := attach(t, file, loop.Options{ReadOnly: true})
	if !d.ReadOnly {
		t.Fatalf("device %+v is not read-only", d)
	}
	f, err := os.OpenFile(d.Path, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteAt([]byte("x"), 0)
		f.Close()
	}
	if err == nil {
		t.Fatal("write to a read-only loop device succeeded")
	}
	// The same file asked for read-write is not silently handed the
	// read-only device.
	if _, err := loop.Attach(ctx, file, loop.Options{}); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("read-write attach of a read-only attached file = %v, want FAILED_PRECONDITION", err)
	}
	// A file opened read-only is attached read-only whatever was asked.
	file2 := looptest.SparseFile(t, 4*mib)
	rf, err := os.Open(file2)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	d2, err := loop.AttachFile(ctx, rf, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.DetachBound(ctx, d2) })
	if !d2.ReadOnly {
		t.Fatalf("device over a read-only descriptor = %+v, want read-only", d2)
	}
}

func TestDirectIO(t *testing.T) {
	looptest.Require(t)
	file := looptest.SparseFile(t, 4*mib)
	d := attach(t, file, loop.Options{DirectIO: true})
	// The kernel grants direct I/O when the backing filesystem supports
	// O_DIRECT; where it does not, Attach must still succeed without it.
	f, err := os.OpenFile(file, os.O_RDONLY|unix.O_DIRECT, 0)
	canDirect := err == nil
	if f != nil {
		f.Close()
	}
	if d.DirectIO != canDirect {
		t.Fatalf("DirectIO = %v, backing filesystem supports O_DIRECT: %v", d.DirectIO, canDirect)
	}
	// What the kernel applied, as sysfs shows it: the flag stuck, and the
	// device's logical block size is at least the backing file's direct
	// I/O alignment (the kernel refuses direct I/O below it), so every
	// request reaches the file as direct I/O.
	sys := "/sys/block/" + strings.TrimPrefix(d.Path, "/dev/")
	if dio := readSys(t, sys+"/loop/dio"); dio != map[bool]string{true: "1", false: "0"}[d.DirectIO] {
		t.Fatalf("%s/loop/dio = %s, Device.DirectIO = %v", sys, dio, d.DirectIO)
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, file, 0, unix.STATX_DIOALIGN, &stx); err == nil && canDirect && stx.Mask&unix.STATX_DIOALIGN != 0 {
		lbs, err := strconv.Atoi(readSys(t, sys+"/queue/logical_block_size"))
		if err != nil || lbs < int(stx.Dio_offset_align) {
			t.Fatalf("logical block size %d (%v) is below the backing file's direct I/O alignment %d", lbs, err, stx.Dio_offset_align)
		}
	}
	if plain := attach(t, looptest.SparseFile(t, 4*mib), loop.Options{}); plain.DirectIO {
		t.Fatal("direct I/O on a device that did not ask for it")
	}
}

func readSys(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestFindFollowsRenameAndDelete(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	file := looptest.SparseFile(t, 4*mib)
	d := attach(t, file, loop.Options{})

	renamed := filepath.Join(filepath.Dir(file), "renamed.img")
	if err := os.Rename(file, renamed); err != nil {
		t.Fatal(err)
	}
	found, ok, err := loop.Find(ctx, renamed)
	if err != nil || !ok || found.Path != d.Path {
		t.Fatalf("find renamed = %+v, %v, %v; want %s", found, ok, err, d.Path)
	}
	// A new file at the old path is another file.
	if err := os.WriteFile(file, []byte("other"), 0o600); err != nil {
		t.Fatal(err)
	}
	if found, ok, err := loop.Find(ctx, file); err != nil || ok {
		t.Fatalf("find of a new file at the old path = %+v, %v, %v; want not found", found, ok, err)
	}

	if err := os.Remove(renamed); err != nil {
		t.Fatal(err)
	}
	found, ok, err = loop.Find(ctx, renamed)
	if err != nil || !ok || found.Path != d.Path || !found.BackingDeleted || found.BackingFile != renamed {
		t.Fatalf("find deleted = %+v, %v, %v; want %s backed by deleted %s", found, ok, err, d.Path, renamed)
	}
	list, err := loop.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed bool
	for _, l := range list {
		if l.Path == d.Path {
			listed = l.BackingDeleted && l.BackingFile == renamed
		}
	}
	if !listed {
		t.Fatalf("list %+v lacks %s backed by deleted %s", list, d.Path, renamed)
	}
}

func TestFileNamedLikeDeleted(t *testing.T) {
	looptest.Require(t)
	file := filepath.Join(t.TempDir(), "vol (deleted)")
	if err := os.WriteFile(file, make([]byte, mib), 0o600); err != nil {
		t.Fatal(err)
	}
	d := attach(t, file, loop.Options{})
	if d.BackingDeleted || d.BackingFile != file {
		t.Fatalf("attach = %+v, want live backing file %q", d, file)
	}
}

func TestDetachRefusesDeviceInUse(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	d := attach(t, looptest.SparseFile(t, 4*mib), loop.Options{})
	// An exclusive open is what a mount or device-mapper holds.
	holder, err := os.OpenFile(d.Path, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = loop.Detach(ctx, d.Path)
	holder.Close()
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("detach of a held device = %v, want FAILED_PRECONDITION", err)
	}
	if _, ok, _ := loop.Find(ctx, d.BackingFile); !ok {
		t.Fatal("refused detach unbound the device")
	}
}

// TestDetachWaitsForABriefClaim: an exclusive claim that ends a moment
// after Detach began (a filesystem letting go of its device just after
// its unmount returned, a probe) does not fail the detach.
func TestDetachWaitsForABriefClaim(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	file := looptest.SparseFile(t, 4*mib)
	d := attach(t, file, loop.Options{})
	holder, err := os.OpenFile(d.Path, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	released := time.AfterFunc(200*time.Millisecond, func() { holder.Close() })
	defer released.Stop()
	if err := loop.Detach(ctx, d.Path); err != nil {
		t.Fatalf("detach while a claim ends within 200 ms: %v", err)
	}
	if found, ok, _ := loop.Find(ctx, file); ok && !found.AutoClear {
		t.Fatalf("after detach: %+v still bound", found)
	}
}

func TestDetachWhileOpenedElsewhere(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	file := looptest.SparseFile(t, 4*mib)
	d := attach(t, file, loop.Options{})
	reader, err := os.Open(d.Path)
	if err != nil {
		t.Fatal(err)
	}
	// A plain reader does not stop the detach; the kernel finishes it on
	// the reader's close. Detach's wait for that ends with its context.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := loop.Detach(short, d.Path); err != nil {
		t.Fatalf("detach: %v", err)
	}
	if found, ok, _ := loop.Find(ctx, file); ok && !found.AutoClear {
		t.Fatalf("after detach with a reader: %+v, want pending detach", found)
	}
	// Attach does not hand out a device that is about to vanish.
	if d2 := attach(t, file, loop.Options{}); d2.Path == d.Path {
		t.Fatalf("attach reused %s pending detach", d.Path)
	}
	// The last close finishes the detach of d; d2 stays.
	reader.Close()
	list, err := loop.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range list {
		if l.Path == d.Path && l.Dev == d.Dev && l.Inode == d.Inode {
			t.Fatalf("%s still bound after its last opener closed: %+v", d.Path, l)
		}
	}
}

func TestArgumentErrors(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		run  func() error
		want abi.Code
	}{
		{"attach missing file", func() error {
			_, err := loop.Attach(ctx, filepath.Join(dir, "missing"), loop.Options{})
			return err
		}, abi.NotFound},
		{"attach a folder", func() error {
			_, err := loop.Attach(ctx, dir, loop.Options{ReadOnly: true})
			return err
		}, abi.InvalidArgument},
		{"detach non-loop path", func() error { return loop.Detach(ctx, "/dev/null") }, abi.InvalidArgument},
		{"detach partition name", func() error { return loop.Detach(ctx, "/dev/loop0p1") }, abi.InvalidArgument},
		{"detach relative path", func() error { return loop.Detach(ctx, "loop0") }, abi.InvalidArgument},
		{"detach traversal", func() error { return loop.Detach(ctx, "/dev/loop/../sda") }, abi.InvalidArgument},
		{"resize non-loop path", func() error { _, err := loop.Resize(ctx, "/dev/sda"); return err }, abi.InvalidArgument},
		{"detach absent device", func() error { return loop.Detach(ctx, "/dev/loop9999999") }, abi.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := abi.CodeOf(tc.run()); got != tc.want {
				t.Fatalf("code = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAttachCanceled(t *testing.T) {
	looptest.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := loop.Attach(ctx, looptest.SparseFile(t, mib), loop.Options{})
	if !errors.Is(err, context.Canceled) {
		loop.DetachBound(context.Background(), d)
		t.Fatalf("attach with a canceled context = %+v, %v", d, err)
	}
}

func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestStatus(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	dev, file := looptest.Device(t, 8<<20)
	d, bound, err := loop.Status(ctx, dev)
	if err != nil || !bound || d.BackingFile != file || d.SizeBytes != 8<<20 {
		t.Fatalf("Status(%s) = %+v, %v, %v", dev, d, bound, err)
	}
	if err := loop.Detach(ctx, dev); err != nil {
		t.Fatal(err)
	}
	// Free, the number may already back another process's file.
	if now, bound, err := loop.Status(ctx, dev); err != nil || (bound && now.Dev == d.Dev && now.Inode == d.Inode) {
		t.Fatalf("detached device: %+v, bound %v, %v", now, bound, err)
	}
}

// Find remembers the device it saw a file on; when that device is
// detached and reused for another file meanwhile, Find of the first file
// must not believe the stale memory.
func TestFindAfterDeviceReused(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	first := looptest.SparseFile(t, 4*mib)
	d, err := loop.Attach(ctx, first, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if found, ok, err := loop.Find(ctx, first); err != nil || !ok || found.Path != d.Path {
		t.Fatalf("find = %+v, %v, %v; want %s", found, ok, err, d.Path)
	}
	if err := loop.Detach(ctx, d.Path); err != nil {
		t.Fatal(err)
	}
	// LOOP_CTL_GET_FREE hands out the lowest free device: usually the one
	// just freed.
	second := looptest.SparseFile(t, 4*mib)
	d2 := attach(t, second, loop.Options{})
	if found, ok, err := loop.Find(ctx, first); err != nil || ok {
		t.Fatalf("find of a detached file = %+v, %v, %v; want not found (device %s now backs another file)", found, ok, err, d2.Path)
	}
	f, err := os.Open(first)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if found, ok, err := loop.FindFile(ctx, f); err != nil || ok {
		t.Fatalf("FindFile of a detached file = %+v, %v, %v; want not found", found, ok, err)
	}
	// Attaching the first file again gets a device of its own, not the
	// second file's.
	d3 := attach(t, first, loop.Options{})
	if d3.Path == d2.Path {
		t.Fatalf("the first file was attached to %s, the second file's device", d3.Path)
	}
	if found, ok, err := loop.Find(ctx, second); err != nil || !ok || found.Path != d2.Path {
		t.Fatalf("find of the second file = %+v, %v, %v; want %s", found, ok, err, d2.Path)
	}
}

// TestAttachDeviceReadOnly: a read-only loop device over a block device
// refuses writes while the device under it still takes them, shows what
// is written there, is found again by the device it backs, and detaches.
func TestAttachDeviceReadOnly(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	under, file := looptest.Device(t, 8*mib)
	ro, err := loop.AttachDevice(ctx, under, loop.Options{ReadOnly: true, DirectIO: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.Detach(ctx, ro.Path); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if !ro.ReadOnly || ro.BackingFile != under || ro.SizeBytes != 8*mib || ro.Path == under {
		t.Fatalf("AttachDevice = %+v, want a read-only device of 8 MiB over %s", ro, under)
	}
	for _, mode := range []int{os.O_WRONLY, os.O_RDWR} {
		f, err := os.OpenFile(ro.Path, mode, 0)
		if err == nil {
			_, err = f.WriteAt([]byte("x"), 0)
			f.Close()
		}
		if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.EACCES) {
			t.Fatalf("write through the read-only device (mode %#o) = %v, want EPERM or EROFS", mode, err)
		}
	}
	payload := bytes.Repeat([]byte("under-ro"), 512)
	writeAt(t, under, payload, 2*mib)
	got := make([]byte, len(payload))
	readAt(t, ro.Path, got, 2*mib)
	if !bytes.Equal(got, payload) {
		t.Fatal("the read-only device does not show what was written to the device under it")
	}
	if again, err := loop.AttachDevice(ctx, under, loop.Options{ReadOnly: true}); err != nil || again.Path != ro.Path {
		t.Fatalf("second AttachDevice = %+v, %v; want %s again", again, err, ro.Path)
	}
	if found, ok, err := loop.Find(ctx, under); err != nil || !ok || found.Path != ro.Path {
		t.Fatalf("Find(%s) = %+v, %v, %v; want %s", under, found, ok, err, ro.Path)
	}
	if _, err := loop.AttachDevice(ctx, file, loop.Options{ReadOnly: true}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("AttachDevice of a regular file = %v, want INVALID_ARGUMENT", err)
	}
	if err := loop.Detach(ctx, ro.Path); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := loop.Find(ctx, under); err != nil || ok {
		t.Fatalf("Find after detach = %v, %v; want nothing", ok, err)
	}
}
