package dm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// Tests against the real device-mapper; they run in the VM tier (make
// test-vm) or on a kernel that has the modules. Every device they create is
// named under testPrefix and removed when the test ends, also on failure.

const testPrefix = "wasmcsi-vmtest-"

func newMapper(t *testing.T, modules ...string) *Mapper {
	t.Helper()
	vmtest.Require(t, append([]string{"loop", "dm_mod"}, modules...)...)
	m, err := New(testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// removeOnCleanup removes name when t ends. Register it after the loop
// devices the table uses, so that it runs before they are detached.
func removeOnCleanup(t *testing.T, m *Mapper, name string) {
	t.Cleanup(func() {
		if err := m.Remove(context.Background(), name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func majorMinor(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

func writeAt(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return buf
}

func size(t *testing.T, path string) uint64 {
	t.Helper()
	n, err := deviceSize(path)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func wantCode(t *testing.T, what string, err error, code abi.Code) {
	t.Helper()
	if got := abi.CodeOf(err); got != code {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, code)
	}
}

func TestVersion(t *testing.T) {
	m := newMapper(t)
	v, err := m.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != interfaceMajor {
		t.Errorf("interface version %v", v)
	}
	t.Logf("DM ioctl interface %d.%d.%d", v[0], v[1], v[2])
}

func TestLinearCreateRemove(t *testing.T) {
	m := newMapper(t)
	ctx := context.Background()
	loopDev, _ := looptest.Device(t, 8<<20)
	half := uint64(8 << 20 / SectorSize / 2)
	name := testPrefix + "linear"
	// Two targets that swap the halves of the loop device, so the mapping
	// is visible in the data.
	table := []Target{
		{Start: 0, Length: half, Type: "linear", Params: fmt.Sprintf("%s %d", loopDev, half)},
		{Start: half, Length: half, Type: "linear", Params: loopDev + " 0"},
	}
	path, err := m.Create(ctx, name, table)
	if err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)
	if path != "/dev/mapper/"+name {
		t.Errorf("path %s", path)
	}

	info, err := m.Info(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Exists || !info.LiveTable || info.InactiveTable || info.Suspended || info.OpenCount != 0 || info.TargetCount != 2 || info.Name != name {
		t.Errorf("info %+v", info)
	}
	if got, want := majorMinor(t, path), fmt.Sprintf("%d:%d", info.Major, info.Minor); got != want {
		t.Errorf("node %s is %s, device is %s", path, got, want)
	}
	if got := size(t, path); got != 8<<20 {
		t.Errorf("size %d", got)
	}

	loopNum := majorMinor(t, loopDev)
	live, err := m.Table(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	wantTable := []Target{
		{0, half, "linear", fmt.Sprintf("%s %d", loopNum, half)},
		{half, half, "linear", loopNum + " 0"},
	}
	if !slices.Equal(live, wantTable) {
		t.Errorf("table %v, want %v", live, wantTable)
	}
	st, err := m.Status(ctx, name)
	if err != nil || len(st) != 2 || st[0].Type != "linear" || st[1].Start != half {
		t.Errorf("status %+v, %v", st, err)
	}
	list, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(list, Device{Name: name, Major: info.Major, Minor: info.Minor}) {
		t.Errorf("list %v lacks %s", list, name)
	}

	pattern := bytes.Repeat([]byte("wasmcsi!"), 512)
	writeAt(t, path, 0, pattern)
	if got := readAt(t, loopDev, int64(half*SectorSize), len(pattern)); !bytes.Equal(got, pattern) {
		t.Error("data written at sector 0 of the dm device is not at the loop device's second half")
	}

	if err := m.Remove(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("node %s after remove: %v", path, err)
	}
	if info, err := m.Info(ctx, name); err != nil || info.Exists {
		t.Errorf("info after remove: %+v, %v", info, err)
	}
	if err := m.Remove(ctx, name); err != nil {
		t.Errorf("second remove: %v", err)
	}
}

func TestCreateErrors(t *testing.T) {
	m := newMapper(t)
	ctx := context.Background()
	loopDev, _ := looptest.Device(t, 1<<20)
	name := testPrefix + "dup"
	if _, err := m.Create(ctx, name, []Target{{0, 2048, "linear", loopDev + " 0"}}); err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)
	_, err := m.Create(ctx, name, []Target{{0, 8, "zero", ""}})
	wantCode(t, "create of an existing name", err, abi.AlreadyExists)
	if table, _ := m.Table(ctx, name); len(table) != 1 || table[0].Type != "linear" {
		t.Errorf("the existing device changed: %v", table)
	}

	for _, c := range []struct {
		what  string
		table []Target
	}{
		{"bad parameters", []Target{{0, 8, "linear", "x"}}},
		{"unknown target type", []Target{{0, 8, "wasmcsi-none", ""}}},
		{"past the end of the device", []Target{{0, 4096, "linear", loopDev + " 0"}}},
	} {
		bad := testPrefix + "bad"
		_, err := m.Create(ctx, bad, c.table)
		wantCode(t, c.what, err, abi.InvalidArgument)
		if info, _ := m.Info(ctx, bad); info.Exists {
			t.Errorf("%s: the refused device was left behind", c.what)
			m.Remove(ctx, bad)
		}
		if _, err := os.Lstat(m.Path(bad)); !os.IsNotExist(err) {
			t.Errorf("%s: node left behind: %v", c.what, err)
		}
	}
	_, err = m.Message(ctx, name, 0, "hello")
	wantCode(t, "message to a linear target", err, abi.InvalidArgument)
	_, err = m.Status(ctx, testPrefix+"missing")
	wantCode(t, "status of a missing device", err, abi.NotFound)
}

func TestSuspendReloadResume(t *testing.T) {
	m := newMapper(t)
	ctx := context.Background()
	loopDev, _ := looptest.Device(t, 4<<20)
	name := testPrefix + "grow"
	path, err := m.Create(ctx, name, []Target{{0, 4096, "linear", loopDev + " 0"}})
	if err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)

	if err := m.Suspend(ctx, name); err != nil {
		t.Fatal(err)
	}
	if info, _ := m.Info(ctx, name); !info.Suspended {
		t.Errorf("not suspended: %+v", info)
	}
	if err := m.Reload(ctx, name, []Target{{0, 8192, "linear", loopDev + " 0"}}); err != nil {
		t.Fatal(err)
	}
	if info, _ := m.Info(ctx, name); !info.InactiveTable {
		t.Errorf("no inactive table after reload: %+v", info)
	}
	if got := size(t, path); got != 4096*SectorSize {
		t.Errorf("size changed before resume: %d", got)
	}
	if err := m.Resume(ctx, name); err != nil {
		t.Fatal(err)
	}
	info, _ := m.Info(ctx, name)
	if info.Suspended || info.InactiveTable {
		t.Errorf("after resume: %+v", info)
	}
	if got := size(t, path); got != 8192*SectorSize {
		t.Errorf("size after resume %d, want %d", got, 8192*SectorSize)
	}
	// Resume swaps a reloaded table in without an explicit suspend.
	if err := m.Reload(ctx, name, []Target{{0, 2048, "linear", loopDev + " 0"}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume(ctx, name); err != nil {
		t.Fatal(err)
	}
	if got := size(t, path); got != 2048*SectorSize {
		t.Errorf("size after reload without suspend %d", got)
	}
}

// DeviceName names a mapped device from its /dev/mapper node and from
// the kernel's /dev/dm-N node alike.
func TestDeviceNameOfMappedDevice(t *testing.T) {
	m := newMapper(t)
	ctx := context.Background()
	loopDev, _ := looptest.Device(t, 4<<20)
	name := testPrefix + "named"
	path, err := m.Create(ctx, name, []Target{{0, 4096, "linear", loopDev + " 0"}})
	if err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	kernel := fmt.Sprintf("/dev/dm-%d", unix.Minor(st.Rdev))
	for _, p := range []string{path, kernel} {
		if _, err := os.Stat(p); err != nil {
			continue // no devtmpfs node of that name
		}
		if got, ok, err := DeviceName(p); err != nil || !ok || got != name {
			t.Errorf("DeviceName(%s) = %q, %v, %v; want %q", p, got, ok, err, name)
		}
	}
	if _, ok, err := DeviceName(loopDev); err != nil || ok {
		t.Errorf("DeviceName of the loop device under it = %v, %v; want not mapped", ok, err)
	}
}

func TestRemoveBusy(t *testing.T) {
	m := newMapper(t)
	m.removeRetries, m.removeBackoff = 2, time.Millisecond
	ctx := context.Background()
	loopDev, _ := looptest.Device(t, 1<<20)
	name := testPrefix + "busy"
	path, err := m.Create(ctx, name, []Target{{0, 2048, "linear", loopDev + " 0"}})
	if err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	err = m.Remove(ctx, name)
	wantCode(t, "remove of an open device", err, abi.FailedPrecondition)
	if info, _ := m.Info(ctx, name); !info.Exists || info.OpenCount != 1 {
		t.Errorf("info of the open device %+v", info)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("node gone although the device stays: %v", err)
	}
	f.Close()
	if err := m.Remove(ctx, name); err != nil {
		t.Errorf("remove after close: %v", err)
	}
}

func TestConfinementLive(t *testing.T) {
	m := newMapper(t)
	ctx := context.Background()
	loopDev, _ := looptest.Device(t, 1<<20)
	name := testPrefix + "mine"
	if _, err := m.Create(ctx, name, []Target{{0, 2048, "linear", loopDev + " 0"}}); err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)

	other, err := New(testPrefix + "other-")
	if err != nil {
		t.Fatal(err)
	}
	list, err := other.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list {
		if !strings.HasPrefix(d.Name, testPrefix+"other-") {
			t.Errorf("List of another grant shows %s", d.Name)
		}
	}
	wantCode(t, "remove under another grant", other.Remove(ctx, name), abi.PermissionDenied)
	wantCode(t, "suspend under another grant", other.Suspend(ctx, name), abi.PermissionDenied)
	_, err = other.Info(ctx, name)
	wantCode(t, "info under another grant", err, abi.PermissionDenied)
	_, err = other.Message(ctx, name, 0, "x")
	wantCode(t, "message under another grant", err, abi.PermissionDenied)
	if info, _ := m.Info(ctx, name); !info.Exists || info.Suspended {
		t.Errorf("the device was touched: %+v", info)
	}
}

// A stale node left by an earlier device of the same name (a crash between
// remove and unlink, or udev) is replaced by the right one.
func TestStaleNodeReplaced(t *testing.T) {
	m := newMapper(t)
	ctx := context.Background()
	loopDev, _ := looptest.Device(t, 1<<20)
	name := testPrefix + "stale"
	path := m.Path(name)
	if err := os.Symlink("../nonexistent", path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	if _, err := m.Create(ctx, name, []Target{{0, 2048, "linear", loopDev + " 0"}}); err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, m, name)
	info, _ := m.Info(ctx, name)
	if got := majorMinor(t, path); got != fmt.Sprintf("%d:%d", info.Major, info.Minor) {
		t.Errorf("node is %s", got)
	}
}
