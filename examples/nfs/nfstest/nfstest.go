//go:build !wasip1

// Package nfstest gives tests of the nfs module a real NFS server on one
// machine: the kernel's nfsd with rpc.mountd (NFSv4 only, so no rpcbind),
// its lease and grace times cut to 10 s, folders exported to the test's
// clients, and network namespaces that give node daemons addresses of
// their own. When the test ends, also on failure, every NFS mount below
// the test's folders is detached, the exports it made are withdrawn, the
// server it started is stopped and the namespaces are removed.
//
// It must never be imported by non-test code. It skips (never passes)
// outside the VM tier (make test-vm, WASMCSI_VM=1) unless the kernel has
// nfsd and the server's tools are installed, and loads kernel modules only
// inside the tier's guest.
package nfstest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

const (
	envVM        = "WASMCSI_VM"
	envModuleDir = "WASMCSI_MODULE_DIR"
	skipReason   = "needs the kernel's NFS server and client: run make test-vm"
	// Package is the module's import path, for moduletest.Build.
	Package = "github.com/wasmcsi/wasmcsi/examples/nfs"
)

// HostCalls are the families the module imports.
var HostCalls = []string{"dir", "nfsd", "nfs", "net"}

// InVM reports whether the test runs inside the VM tier's guest.
func InVM() bool { return os.Getenv(envVM) == "1" }

// ModuleFile returns the nfs module the VM tier copied in for tc; "" and
// why when there is none.
func ModuleFile(tc moduletest.Toolchain) (path, why string) {
	dir := os.Getenv(envModuleDir)
	if dir == "" {
		if InVM() {
			return "", "the VM guest cannot build modules and " + envModuleDir + " is not set"
		}
		return "", ""
	}
	name := "nfs.wasm"
	if tc == moduletest.TinyGo {
		name = "nfs.tinygo.wasm"
	}
	path = filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", "no " + name + " in " + envModuleDir + "=" + dir
	}
	return path, ""
}

// Module returns the built module for tc, building it outside the VM.
func Module(t testing.TB, tc moduletest.Toolchain) string {
	t.Helper()
	if path, why := ModuleFile(tc); path != "" {
		return path
	} else if why != "" {
		t.Skip(why)
	}
	return moduletest.Build(t, Package, tc)
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

// Require skips t unless it may run an NFS server here: root, and the
// VM tier or a kernel with nfsd and the server's tools.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + skipReason)
	}
	if !InVM() {
		t.Skip(skipReason)
	}
	for _, p := range []string{"exportfs", "rpc.nfsd", "rpc.mountd", "mount.nfs"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("VM tier: %s missing: %v", p, err)
		}
	}
	for _, m := range []string{"nfsd", "nfsv4", "veth", "loop", "xfs"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			continue
		}
		run(t, "modprobe", m)
	}
}

// Server starts the kernel's NFS server (NFSv4 only) when it does not run
// yet, and stops it when the test ends. Lease and grace times are 10 s:
// a server (re)started with no clients to wait for then serves opens
// after 10 s instead of 90.
func Server(t testing.TB) {
	t.Helper()
	Require(t)
	mounted, _ := mountinfo.Mounted("/proc/fs/nfsd")
	if !mounted {
		run(t, "mount", "-t", "nfsd", "nfsd", "/proc/fs/nfsd")
	}
	if threads() > 0 {
		return
	}
	if out, err := exec.Command("pidof", "rpc.mountd").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		// A mountd of an earlier test's server still serves: threads only.
		StartThreads(t)
		t.Cleanup(func() { StopThreads(t) })
		return
	}
	for _, f := range []string{"nfsv4leasetime", "nfsv4gracetime"} {
		if err := os.WriteFile("/proc/fs/nfsd/"+f, []byte("10\n"), 0o644); err != nil {
			t.Logf("set %s: %v", f, err)
		}
	}
	mountd := exec.Command("rpc.mountd", "-N", "3", "-F")
	var log bytes.Buffer
	mountd.Stdout, mountd.Stderr = &log, &log
	if err := mountd.Start(); err != nil {
		t.Fatal(err)
	}
	StartThreads(t)
	t.Cleanup(func() {
		StopThreads(t)
		mountd.Process.Kill()
		mountd.Wait()
	})
}

// StartThreads starts nfsd's threads (after StopThreads).
func StartThreads(t testing.TB) { run(t, "rpc.nfsd", "-N", "3", "8") }

// StopThreads stops nfsd: clients' requests go unanswered.
func StopThreads(t testing.TB) { run(t, "rpc.nfsd", "0") }

func threads() int {
	b, err := os.ReadFile("/proc/fs/nfsd/threads")
	if err != nil {
		return 0
	}
	var n int
	fmt.Sscan(string(b), &n)
	return n
}

// Share exports dir (created) to clients itself, outside the module: an
// operator's export for client mode. It is withdrawn when the test ends.
func Share(t testing.TB, name, dir string, clients ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var line strings.Builder
	line.WriteString(dir)
	for i, c := range clients {
		fmt.Fprintf(&line, " %s(rw,sync,no_subtree_check,no_root_squash,fsid=%d)", c, 4000+i+len(name)*17)
	}
	file := "/etc/exports.d/test-" + name + ".exports"
	if err := os.WriteFile(file, []byte(line.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "exportfs", "-r")
	t.Cleanup(func() {
		os.Remove(file)
		exec.Command("exportfs", "-r").Run()
	})
}

// DetachUnder lazily detaches every NFS mount below dir, so that a failed
// test leaves none behind.
func DetachUnder(t testing.TB, dir string) {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Log(err)
		return
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if err := unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH|unix.MNT_FORCE); err != nil {
			unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH)
		}
	}
}

// ServerAddr is the server's address in the namespaces' network: on lo
// of the initial namespace, routed to from every node namespace.
const ServerAddr = "10.99.0.1"

// Node is a network namespace with an address of its own that reaches
// ServerAddr: a node as the server sees it.
type Node struct {
	Name string // the namespace, /run/netns/<Name>
	Addr string // its address
}

// NewNode makes the namespace name with a veth pair to the initial
// namespace: 10.99.<i>.2 inside, 10.99.<i>.1 outside, and a default route
// through it. Removed when the test ends.
func NewNode(t testing.TB, name string, i int) *Node {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("netns %s step 1: %v", name, err)
	}
	defer orig.Close()
	netns.DeleteNamed(name)
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatalf("netns %s step 2: %v", name, err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("netns %s step 3: %v", name, err)
	}
	defer ns.Close()
	outside, inside := name+"o", name+"i"
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(outside); err == nil {
			netlink.LinkDel(l)
		}
		netns.DeleteNamed(name)
	})
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: outside}, PeerName: inside}); err != nil {
		t.Fatalf("netns %s step 4: %v", name, err)
	}
	out, err := netlink.LinkByName(outside)
	if err != nil {
		t.Fatalf("netns %s step 5: %v", name, err)
	}
	in, err := netlink.LinkByName(inside)
	if err != nil {
		t.Fatalf("netns %s step 6: %v", name, err)
	}
	if err := netlink.LinkSetNsFd(in, int(ns)); err != nil {
		t.Fatalf("netns %s step 7: %v", name, err)
	}
	addr := func(s string) *netlink.Addr {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			t.Fatalf("netns %s step 8: %v", name, err)
		}
		return a
	}
	if err := netlink.AddrAdd(out, addr(fmt.Sprintf("10.99.%d.1/24", i))); err != nil {
		t.Fatalf("netns %s step 9: %v", name, err)
	}
	if err := netlink.LinkSetUp(out); err != nil {
		t.Fatalf("netns %s step 10: %v", name, err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatalf("netns %s step 11: %v", name, err)
	}
	if err := netlink.AddrAdd(lo, addr(ServerAddr+"/32")); err != nil && !os.IsExist(err) && err != unix.EEXIST {
		t.Fatalf("netns %s step 12: %v", name, err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netns %s step 13: %v", name, err)
	}
	defer h.Close()
	nin, err := h.LinkByName(inside)
	if err != nil {
		t.Fatalf("netns %s step 14: %v", name, err)
	}
	if err := h.AddrAdd(nin, addr(fmt.Sprintf("10.99.%d.2/24", i))); err != nil {
		t.Fatalf("netns %s step 15: %v", name, err)
	}
	if err := h.LinkSetUp(nin); err != nil {
		t.Fatalf("netns %s step 16: %v", name, err)
	}
	if nlo, err := h.LinkByName("lo"); err == nil {
		h.LinkSetUp(nlo)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: nin.Attrs().Index, Gw: net.ParseIP(fmt.Sprintf("10.99.%d.1", i))}); err != nil {
		t.Fatalf("netns %s step 17: %v", name, err)
	}
	return &Node{Name: name, Addr: fmt.Sprintf("10.99.%d.2", i)}
}

// Command wraps a command so it runs in the node's network namespace and
// in a UTS namespace of its own with the node's host name: NFSv4.1
// clients name themselves by host name, so two nodes need two.
func (n *Node) Command(argv ...string) []string {
	return append([]string{"nsenter", "--net=/run/netns/" + n.Name, "unshare", "--uts", "sh", "-c",
		"hostname " + n.Name + " && exec \"$0\" \"$@\""}, argv...)
}

// Timed runs fn and logs its time.
func Timed(t testing.TB, what string, fn func()) time.Duration {
	t.Helper()
	start := time.Now()
	fn()
	d := time.Since(start)
	t.Logf("timing %-40s %9.2f ms", what, float64(d.Microseconds())/1000)
	return d
}

// QuotaPool mounts a fresh xfs with project quotas (size bytes, sparse)
// and answers a pool folder on it. Before it is unmounted when the test
// ends, the exports the daemon recorded are withdrawn and the server's
// export cache flushed, which otherwise keeps the filesystem busy.
func QuotaPool(t testing.TB, size int64) string {
	t.Helper()
	dev := mounttest.Loop(t, size)
	mounttest.Mkfs(t, "xfs", dev)
	mnt, err := mounttest.Mount(t, dev, "xfs", "prjquota")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		Withdraw(t)
		// Clients a failed test left behind hold open state on the
		// pool's files: stopping nfsd drops it (Server starts it again).
		exec.Command("rpc.nfsd", "0").Run()
	})
	pool := filepath.Join(mnt, "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	return pool
}

// Withdraw removes every export file the daemon owns and makes the server
// forget them.
func Withdraw(t testing.TB) {
	files, _ := filepath.Glob("/etc/exports.d/wasmcsi-*.exports")
	for _, f := range files {
		os.Remove(f)
	}
	exec.Command("exportfs", "-r").Run()
	exec.Command("exportfs", "-f").Run()
}
