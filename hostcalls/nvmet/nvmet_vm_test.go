package nvmet

// These tests drive the kernel's NVMe target through configfs and connect
// to it over TCP on the loopback with the nvme initiator. They need root
// and the nvmet, nvmet_tcp and nvme_tcp modules, which the VM tier
// (.ci/vm/test.sh) provides; elsewhere they skip with the reason.

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/nvme"
)

const (
	vmPrefix = "nqn.2024-01.dev.wasmcsi:vmtest."
	vmHostA  = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-00000000000a"
	vmHostB  = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-00000000000b"
	vmUUID1  = "11111111-2222-4333-8444-555555555501"
	vmUUID2  = "11111111-2222-4333-8444-555555555502"
)

var vmAddr = netip.MustParseAddrPort("127.0.0.1:4420")

// requireNvmet skips unless nvmet and the NVMe/TCP initiator can be
// driven here, and returns a Target on the real tree whose test
// subsystems (and the controllers to them) are removed when t ends.
func requireNvmet(t *testing.T) *Target {
	t.Helper()
	vmtest.Require(t, "configfs", "nvmet", "nvmet_tcp", "nvme_tcp")
	if _, err := os.Stat(filepath.Join(DefaultRoot, "subsystems")); err != nil {
		t.Skipf("needs configfs mounted with nvmet at %s: %v", DefaultRoot, err)
	}
	tg := New("")
	t.Cleanup(func() { cleanupNvmet(t, tg) })
	return tg
}

// cleanupNvmet deletes every controller to a test subsystem, then every
// test subsystem with its namespaces, and checks nothing is left.
func cleanupNvmet(t *testing.T, tg *Target) {
	ctrls, _ := os.ReadDir("/sys/class/nvme")
	for _, c := range ctrls {
		if s, _ := sysattr.Read(filepath.Join("/sys/class/nvme", c.Name(), "subsysnqn")); strings.HasPrefix(s, vmPrefix) {
			_ = sysattr.Write(filepath.Join("/sys/class/nvme", c.Name(), "delete_controller"), "1")
		}
	}
	subs, _ := listDirs(tg.path("subsystems"))
	for _, s := range subs {
		if !strings.HasPrefix(s, vmPrefix) {
			continue
		}
		ids, _ := listDirs(tg.subPath(s, "namespaces"))
		for _, id := range ids {
			n := 0
			for _, c := range id {
				n = n*10 + int(c-'0')
			}
			if err := tg.DeleteNamespace(context.Background(), s, n, ""); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if err := tg.deleteSubsystem(s); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

func sparseFile(t *testing.T, dir string, size int64) string {
	t.Helper()
	p := filepath.Join(dir, "ns.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return p
}

// initiator returns an initiator with its own host NQN, as a second node
// would have.
func initiator(t *testing.T, nqn string) *nvme.Initiator {
	f := filepath.Join(t.TempDir(), "hostnqn")
	if err := os.WriteFile(f, []byte(nqn+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return nvme.New(nvme.Config{HostNQNFile: f, HostIDFile: filepath.Join(t.TempDir(), "none"), Wait: 10 * time.Second})
}

func writeAt(dev string, off int64, data []byte) error {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// O_DIRECT wants an aligned buffer: an anonymous mapping is one.
	buf, err := unix.Mmap(-1, 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	copy(buf, data)
	if _, err := unix.Pwrite(fd, buf, off); err != nil {
		return err
	}
	return unix.Fsync(fd)
}

func readFileAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNvmetServesAndFences exports two file-backed namespaces, one per
// subsystem, to two hosts with distinct NQNs: nothing is reachable before
// a host is allowed, each reaches its own, data written through the
// initiator lands in the backing file, a resize is seen after a rescan,
// and denying host A ends its controller so its writes never reach the
// file while B keeps writing to its own volume. Deleting leaves nothing.
func TestNvmetServesAndFences(t *testing.T) {
	tg := requireNvmet(t)
	ctx := context.Background()
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "1"), filepath.Join(dir, "2")
	for _, d := range []string{d1, d2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f1, f2 := sparseFile(t, d1, 64<<20), sparseFile(t, d2, 64<<20)
	sub1, sub2 := vmPrefix+"vol1", vmPrefix+"vol2"
	for _, s := range []Namespace{
		// The guest's /tmp is tmpfs, which has no O_DIRECT: buffered.
		{Subsystem: sub1, NSID: 1, Path: f1, UUID: vmUUID1, Ports: []netip.AddrPort{vmAddr}, BufferedIO: true},
		{Subsystem: sub2, NSID: 1, Path: f2, UUID: vmUUID2, Ports: []netip.AddrPort{vmAddr}, BufferedIO: true},
	} {
		for range 2 { // idempotent
			if err := tg.CreateNamespace(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		if v, _ := sysattr.Read(tg.subPath(s.Subsystem, "attr_allow_any_host")); v != "0" {
			t.Fatalf("%s: attr_allow_any_host = %q", s.Subsystem, v)
		}
	}
	other := Namespace{Subsystem: sub1, NSID: 1, Path: f2, UUID: vmUUID1, Ports: []netip.AddrPort{vmAddr}, BufferedIO: true}
	if err := tg.CreateNamespace(ctx, other); abi.CodeOf(err) != abi.AlreadyExists {
		t.Fatalf("NSID serving another file = %v, want ALREADY_EXISTS", err)
	}

	a, b := initiator(t, vmHostA), initiator(t, vmHostB)
	ns1 := nvme.Namespace{Addr: vmAddr, Subsystem: sub1, UUID: vmUUID1}
	ns2 := nvme.Namespace{Addr: vmAddr, Subsystem: sub2, UUID: vmUUID2}
	if _, _, err := a.Connect(ctx, ns1); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("connect before allow = %v, want PERMISSION_DENIED", err)
	}
	if err := tg.AllowHost(ctx, sub1, vmHostA); err != nil {
		t.Fatal(err)
	}
	if err := tg.AllowHost(ctx, sub2, vmHostB); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Connect(ctx, ns1); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("B connects to A's subsystem = %v, want PERMISSION_DENIED", err)
	}
	devA, ctrlA, err := a.Connect(ctx, ns1)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := a.Connect(ctx, ns1)
	if err != nil || again != devA {
		t.Fatalf("second connect = %s, %v; want %s", again, err, devA)
	}
	devB, _, err := b.Connect(ctx, ns2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A: %s (%s), B: %s", devA, ctrlA, devB)
	pattern := bytes.Repeat([]byte("nvme-A-1"), 512)
	if err := writeAt(devA, 1<<20, pattern); err != nil {
		t.Fatal(err)
	}
	if got := readFileAt(t, f1, 1<<20, len(pattern)); !bytes.Equal(got, pattern) {
		t.Fatal("data written through A's namespace is not in its backing file")
	}

	// Owner: the disk is the nvme family's for the granted address only.
	st := hostcalls.Device{Path: devA, Real: devA}
	if id, ok, err := nvme.Devices.OwnsDevice(ctx, st, []string{"127.0.0.1:4420"}); err != nil || !ok || id != "nvme-uuid:"+vmUUID1 {
		t.Fatalf("OwnsDevice granted = %q, %v, %v", id, ok, err)
	}
	if _, ok, _ := nvme.Devices.OwnsDevice(ctx, st, []string{"127.0.0.2:4420"}); ok {
		t.Fatal("OwnsDevice claims a disk behind an address not granted")
	}

	// Resize: the file grows, the namespace reports it, A sees it.
	if err := os.Truncate(f1, 96<<20); err != nil {
		t.Fatal(err)
	}
	if size, err := tg.ResizeNamespace(ctx, sub1, 1); err != nil || size != 96<<20 {
		t.Fatalf("ResizeNamespace = %d, %v", size, err)
	}
	if size, err := a.Rescan(ctx, ns1, 96<<20); err != nil || size != 96<<20 {
		t.Fatalf("Rescan = %d, %v", size, err)
	}

	// Fence A: its controller ends and cannot come back; B is untouched.
	for range 2 {
		if err := tg.DenyHost(ctx, sub1, vmHostA, []netip.AddrPort{vmAddr}); err != nil {
			t.Fatal(err)
		}
	}
	fenced := bytes.Repeat([]byte("FENCED!!"), 512)
	done := make(chan error, 1)
	go func() { done <- writeAt(devA, 2<<20, fenced) }()
	select {
	case err := <-done:
		t.Logf("A's write after the fence: %v", err)
	case <-time.After(4 * time.Second):
		t.Log("A's write after the fence is blocked (controller reconnecting)")
	}
	if got := readFileAt(t, f1, 2<<20, len(fenced)); bytes.Equal(got, fenced) {
		t.Fatal("a write of the fenced host reached the backing file")
	}
	if s, _ := sysattr.Read(filepath.Join("/sys/class/nvme", ctrlA, "state")); s == "live" {
		t.Fatalf("A's controller is %q after the fence", s)
	}
	patB := bytes.Repeat([]byte("nvme-B-2"), 512)
	if err := writeAt(devB, 1<<20, patB); err != nil {
		t.Fatalf("B's write after A was fenced: %v", err)
	}
	if got := readFileAt(t, f2, 1<<20, len(patB)); !bytes.Equal(got, patB) {
		t.Fatal("B's data is not in its backing file")
	}

	// A's controller gives up (its namespace fails) or is deleted.
	_ = sysattr.Write(filepath.Join("/sys/class/nvme", ctrlA, "delete_controller"), "1")
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("A's blocked write did not end after its controller was deleted")
	}
	if err := b.Disconnect(ctx, ns2); err != nil {
		t.Fatal(err)
	}
	if err := b.Disconnect(ctx, ns2); err != nil {
		t.Fatalf("second disconnect: %v", err)
	}
	for _, s := range []string{sub1, sub2} {
		for range 2 {
			if err := tg.DeleteNamespace(ctx, s, 1, ""); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := os.Stat(tg.subPath(s)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("subsystem %s left after its last namespace: %v", s, err)
		}
	}
	for _, h := range []string{vmHostA, vmHostB} {
		if _, err := os.Stat(tg.path("hosts", h)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("host %s left: %v", h, err)
		}
	}
	if id, _ := tg.portOf(vmAddr, false); id != "" {
		t.Fatalf("port %s left serving nothing", id)
	}
}

// TestNvmetBlockBacking serves a loop device, named through a granted
// folder, and refuses one outside the grant or mounted on this host.
func TestNvmetBlockBacking(t *testing.T) {
	tg := requireNvmet(t)
	vmtest.Require(t, "loop")
	ctx := context.Background()
	dir := t.TempDir()
	img := sparseFile(t, dir, 32<<20)
	dev, err := loop.Attach(ctx, img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = loop.Detach(context.Background(), dev.Path) })
	links := t.TempDir()
	link := filepath.Join(links, "vol")
	if err := os.Symlink(dev.Path, link); err != nil {
		t.Fatal(err)
	}
	roots := []string{vmPrefix, links, "127.0.0.1:4420"}
	if err := grantedBacking(roots, link); err != nil {
		t.Fatalf("granted loop device: %v", err)
	}
	if err := grantedBacking([]string{vmPrefix, "/nowhere"}, link); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("device outside the roots = %v, want PERMISSION_DENIED", err)
	}
	sub := vmPrefix + "blk"
	if err := tg.CreateNamespace(ctx, Namespace{Subsystem: sub, NSID: 1, Path: link, UUID: vmUUID1, Ports: []netip.AddrPort{vmAddr}}); err != nil {
		t.Fatal(err)
	}
	// The same device under its own name is the same backing store.
	if err := tg.CreateNamespace(ctx, Namespace{Subsystem: sub, NSID: 1, Path: dev.Path, UUID: vmUUID1, Ports: []netip.AddrPort{vmAddr}}); err != nil {
		t.Fatalf("same device by another name: %v", err)
	}
	if err := tg.DeleteNamespace(ctx, sub, 1, img); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tg.subPath(sub, "namespaces", "1")); err != nil {
		t.Fatal("a delete naming another backing store removed the namespace")
	}
	if err := tg.DeleteNamespace(ctx, sub, 1, dev.Path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tg.subPath(sub)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("subsystem left: %v", err)
	}
}
