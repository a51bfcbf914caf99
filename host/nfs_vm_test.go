package host_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/examples/nfs/nfstest"
	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The nfs backend across machines, in the VM tier: the kernel's nfsd in
// the guest, one controller daemon beside it, and two node daemons, each
// in a network namespace and UTS namespace of its own, so that the server
// sees two clients with distinct addresses and names (nfstest).

// nfsCluster is one controller daemon and two node daemons.
type nfsCluster struct {
	ctrl       *daemontest.Daemon
	nodes      [2]*daemontest.Daemon
	ids        [2]string // node IDs as NodeGetInfo answers them
	addrs      [2]string
	pool       string
	share      string // an operator's export, for client mode
	ctrlMounts string
	work       string // staging and target paths
}

// newNFSCluster starts the server, the daemons and the namespaces.
func newNFSCluster(t *testing.T) *nfsCluster {
	t.Helper()
	nfstest.Server(t)
	daemontest.Require(t)
	c := &nfsCluster{pool: nfstest.QuotaPool(t, 2<<30)}
	wasm := nfstest.Module(t, moduletest.Go)
	na, nb := nfstest.NewNode(t, "nfsa", 1), nfstest.NewNode(t, "nfsb", 2)
	c.addrs = [2]string{na.Addr, nb.Addr}
	c.share = filepath.Join(t.TempDir(), "share")
	nfstest.Share(t, "share", c.share, nfstest.ServerAddr, "10.99.0.0/16")

	c.ctrlMounts = filepath.Join(t.TempDir(), "mounts")
	mkdirs(t, c.ctrlMounts)
	c.ctrl = daemontest.New(t, daemontest.Options{Role: "controller", NodeID: "storage", Modules: []daemontest.Module{{
		Name: "nfs", Wasm: wasm, HostCalls: nfstest.HostCalls,
		Roots:  []string{c.pool, c.ctrlMounts, "10.99.0.0/16", nfstest.ServerAddr + ":" + c.share},
		Config: map[string]string{"server": nfstest.ServerAddr, "pool": c.pool, "mounts": c.ctrlMounts, "quota": "required"}}}})
	t.Cleanup(func() { nfstest.DetachUnder(t, c.ctrlMounts) })
	// The first start compiles the module (minutes under TCG); later
	// ones find it in the shared compilation cache.
	if err := c.ctrl.Spawn(); err != nil {
		t.Fatal(err)
	}
	if err := c.ctrl.WaitReady(5 * time.Minute); err != nil {
		// Where it stands: the Go runtime prints every goroutine.
		unix.Kill(c.ctrl.Pid(), unix.SIGQUIT)
		time.Sleep(2 * time.Second)
		log := c.ctrl.Log()
		t.Fatalf("%v\n%s", err, strings.Join(log[max(0, len(log)-80):], "\n"))
	}
	for i, n := range []*nfstest.Node{na, nb} {
		mounts := filepath.Join(t.TempDir(), "mounts")
		mkdirs(t, mounts)
		d := daemontest.New(t, daemontest.Options{Role: "node", NodeID: n.Name, Wrap: n.Command(), Modules: []daemontest.Module{{
			Name: "nfs", Wasm: wasm, HostCalls: nfstest.HostCalls,
			Roots:  []string{mounts, nfstest.ServerAddr + ":/"},
			Config: map[string]string{"server": nfstest.ServerAddr, "mounts": mounts}}}})
		t.Cleanup(func() { nfstest.DetachUnder(t, mounts) })
		if err := d.Spawn(); err != nil {
			t.Fatal(err)
		}
		if err := d.WaitReady(5 * time.Minute); err != nil {
			t.Fatal(err)
		}
		c.nodes[i] = d
		info, err := d.Node().NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(info.GetNodeId(), "nfs_client="+n.Addr) {
			t.Fatalf("node %s reports ID %q, want its address %s in it", n.Name, info.GetNodeId(), n.Addr)
		}
		if len(info.GetAccessibleTopology().GetSegments()) != 0 {
			t.Errorf("node %s reports topology %v: NFS volumes are reachable from every node", n.Name, info.GetAccessibleTopology())
		}
		c.ids[i] = info.GetNodeId()
	}
	c.work = t.TempDir()
	t.Cleanup(func() { nfstest.DetachUnder(t, c.work) })
	return c
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func nfsCap(mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var rwx = nfsCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)

// timed runs a CSI call, logs its time and fails the test on an error.
func nfsTimed[T any](t *testing.T, what string, call func() (T, error)) T {
	t.Helper()
	var out T
	var err error
	nfstest.Timed(t, what, func() { out, err = call() })
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return out
}

func (c *nfsCluster) create(t *testing.T, name string, size int64, params map[string]string, src *csi.VolumeContentSource) *csi.Volume {
	t.Helper()
	return nfsTimed(t, "CreateVolume "+name, func() (*csi.CreateVolumeResponse, error) {
		return c.ctrl.Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name,
			VolumeCapabilities: []*csi.VolumeCapability{rwx}, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			Parameters: params, VolumeContentSource: src})
	}).GetVolume()
}

// publish publishes v to node i (controller, stage, publish) and answers
// the target path.
func (c *nfsCluster) publish(t *testing.T, v *csi.Volume, i int) string {
	t.Helper()
	ctx := context.Background()
	pub := nfsTimed(t, fmt.Sprintf("ControllerPublishVolume node %d", i), func() (*csi.ControllerPublishVolumeResponse, error) {
		return c.ctrl.Controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.VolumeId, NodeId: c.ids[i],
			VolumeCapability: rwx, VolumeContext: v.VolumeContext})
	}).GetPublishContext()
	dir := filepath.Join(c.work, fmt.Sprintf("%s-%d", v.VolumeId[strings.IndexByte(v.VolumeId, ':')+1:], i))
	staging, target := dir+"/staging", dir+"/target"
	nfsTimed(t, fmt.Sprintf("NodeStageVolume node %d (NFS mount)", i), func() (*csi.NodeStageVolumeResponse, error) {
		return c.nodes[i].Node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: staging,
			VolumeCapability: rwx, PublishContext: pub, VolumeContext: v.VolumeContext})
	})
	nfsTimed(t, fmt.Sprintf("NodePublishVolume node %d", i), func() (*csi.NodePublishVolumeResponse, error) {
		return c.nodes[i].Node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: rwx, PublishContext: pub, VolumeContext: v.VolumeContext})
	})
	return target
}

// unpublish undoes publish on node i.
func (c *nfsCluster) unpublish(t *testing.T, v *csi.Volume, i int) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(c.work, fmt.Sprintf("%s-%d", v.VolumeId[strings.IndexByte(v.VolumeId, ':')+1:], i))
	nfsTimed(t, fmt.Sprintf("NodeUnpublishVolume node %d", i), func() (*csi.NodeUnpublishVolumeResponse, error) {
		return c.nodes[i].Node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.VolumeId, TargetPath: dir + "/target"})
	})
	nfsTimed(t, fmt.Sprintf("NodeUnstageVolume node %d", i), func() (*csi.NodeUnstageVolumeResponse, error) {
		return c.nodes[i].Node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: dir + "/staging"})
	})
	nfsTimed(t, fmt.Sprintf("ControllerUnpublishVolume node %d", i), func() (*csi.ControllerUnpublishVolumeResponse, error) {
		return c.ctrl.Controller().ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.VolumeId, NodeId: c.ids[i]})
	})
}

func (c *nfsCluster) delete(t *testing.T, v *csi.Volume) {
	t.Helper()
	nfsTimed(t, "DeleteVolume", func() (*csi.DeleteVolumeResponse, error) {
		return c.ctrl.Controller().DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.VolumeId})
	})
}

// writeSync writes data to path and fsyncs it: an NFS client reports a
// write the server refused at the latest there.
func writeSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// exportClients reads the clients the daemon's export record lists for a
// folder.
func exportClients(t *testing.T, folder string) string {
	b, err := os.ReadFile("/etc/exports.d/wasmcsi-nfs.exports")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, folder+" ") {
			return line
		}
	}
	return ""
}

// TestVMNFSSharedVolumeFencing: two nodes write one volume at once and
// see each other's writes; ControllerUnpublish of node B fences it (its
// I/O fails, node A goes on), publishing again restores it; capacity is
// enforced (EDQUOT) and expansion lifts it without a remount.
func TestVMNFSSharedVolumeFencing(t *testing.T) {
	c := newNFSCluster(t)
	v := c.create(t, "shared", 64<<20, map[string]string{"mode": "server"}, nil)
	if v.VolumeContext["capacity"] != "enforced" || v.VolumeContext["server"] != nfstest.ServerAddr {
		t.Fatalf("volume context %v", v.VolumeContext)
	}
	if len(v.AccessibleTopology) != 0 {
		t.Errorf("accessible topology %v: the volume is reachable from every node", v.AccessibleTopology)
	}
	folder := v.VolumeContext["export"]
	if got := exportClients(t, folder); got != "" {
		t.Fatalf("a volume published nowhere is exported: %s", got)
	}
	a, b := c.publish(t, v, 0), c.publish(t, v, 1)
	line := exportClients(t, folder)
	if !strings.Contains(line, c.addrs[0]+"(") || !strings.Contains(line, c.addrs[1]+"(") || strings.Contains(line, "*") {
		t.Fatalf("export of %s: %q, want exactly the two nodes", folder, line)
	}

	// Concurrent writers, each seeing the other's files.
	const files = 20
	errs := make(chan error, 2)
	for i, dir := range []string{a, b} {
		go func() {
			for n := range files {
				if err := writeSync(filepath.Join(dir, fmt.Sprintf("node%d-%02d", i, n)), bytes.Repeat([]byte{byte('a' + i)}, 64<<10)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent write: %v", err)
		}
	}
	for i, dir := range []string{a, b} {
		other := 1 - i
		for n := range files {
			data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("node%d-%02d", other, n)))
			if err != nil || len(data) != 64<<10 || data[0] != byte('a'+other) {
				t.Fatalf("node %d reads node %d's file %d: %d bytes, %v", i, other, n, len(data), err)
			}
		}
	}

	// Fencing: B is taken off the export; its I/O fails, A's goes on.
	start := time.Now()
	nfsTimed(t, "ControllerUnpublishVolume node 1 (fence)", func() (*csi.ControllerUnpublishVolumeResponse, error) {
		return c.ctrl.Controller().ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: v.VolumeId, NodeId: c.ids[1]})
	})
	var fenced error
	for n := 0; time.Since(start) < 60*time.Second; n++ {
		if fenced = writeSync(filepath.Join(b, fmt.Sprintf("after-fence-%d", n)), []byte("x")); fenced != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if fenced == nil {
		t.Fatal("node B still writes 60 s after ControllerUnpublishVolume")
	}
	t.Logf("fencing latency (unpublish call to node B's first failed write): %v (%v)", time.Since(start).Round(time.Millisecond), fenced)
	if _, err := os.ReadFile(filepath.Join(b, "node0-00")); err == nil {
		t.Log("node B still reads a file it had cached")
	}
	if err := writeSync(filepath.Join(a, "a-after-fence"), []byte("still here")); err != nil {
		t.Fatalf("node A after B was fenced: %v", err)
	}
	if line := exportClients(t, folder); strings.Contains(line, c.addrs[1]+"(") || !strings.Contains(line, c.addrs[0]+"(") {
		t.Fatalf("export after fencing B: %q", line)
	}

	// Published again, B writes again through the mount it kept.
	nfsTimed(t, "ControllerPublishVolume node 1 (restore)", func() (*csi.ControllerPublishVolumeResponse, error) {
		return c.ctrl.Controller().ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: v.VolumeId, NodeId: c.ids[1],
			VolumeCapability: rwx, VolumeContext: v.VolumeContext})
	})
	start = time.Now()
	var err error
	for time.Since(start) < 60*time.Second {
		if err = writeSync(filepath.Join(b, "b-restored"), []byte("back")); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("node B after publishing again: %v", err)
	}
	t.Logf("node B writes again %v after the new ControllerPublishVolume", time.Since(start).Round(time.Millisecond))
	if data, err := os.ReadFile(filepath.Join(a, "b-restored")); err != nil || string(data) != "back" {
		t.Fatalf("node A reads B's write after restore: %q, %v", data, err)
	}

	// Capacity: writing past 64 MiB fails on the client: EDQUOT, or
	// ENOSPC where the pool is xfs, whose project quotas report a full
	// filesystem (as its statfs reports the quota as the size).
	var quotaErr error
	chunk := make([]byte, 1<<20)
	for n := 0; n < 100 && quotaErr == nil; n++ {
		quotaErr = writeSync(filepath.Join(a, fmt.Sprintf("fill-%03d", n)), chunk)
	}
	if !errors.Is(quotaErr, unix.EDQUOT) && !errors.Is(quotaErr, unix.ENOSPC) {
		t.Fatalf("writing past the volume's 64 MiB: %v, want EDQUOT or ENOSPC", quotaErr)
	}
	t.Logf("writing past the volume's 64 MiB: %v", quotaErr)
	var st unix.Statfs_t
	if err := unix.Statfs(a, &st); err == nil {
		t.Logf("node A sees %d MiB total, %d MiB free when full", int64(st.Blocks)*st.Bsize>>20, int64(st.Bavail)*st.Bsize>>20)
	}
	nfsTimed(t, "ControllerExpandVolume 64 -> 128 MiB", func() (*csi.ControllerExpandVolumeResponse, error) {
		return c.ctrl.Controller().ControllerExpandVolume(context.Background(), &csi.ControllerExpandVolumeRequest{VolumeId: v.VolumeId,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: rwx})
	})
	for n := range 16 {
		if err := writeSync(filepath.Join(a, fmt.Sprintf("grown-%02d", n)), chunk); err != nil {
			t.Fatalf("write %d MiB after the expansion, same mount: %v", n+1, err)
		}
	}
	if err := unix.Statfs(b, &st); err == nil {
		total := int64(st.Blocks) * st.Bsize
		t.Logf("node B sees %d MiB total after the expansion", total>>20)
		if total < 100<<20 || total > 128<<20 {
			t.Errorf("node B's statfs total %d bytes, want the volume's 128 MiB", total)
		}
	}

	c.unpublish(t, v, 0)
	c.unpublish(t, v, 1)
	c.delete(t, v)
	if line := exportClients(t, folder); line != "" {
		t.Errorf("export left after DeleteVolume: %s", line)
	}
	if _, err := os.Stat(folder); !os.IsNotExist(err) {
		t.Errorf("volume folder left after DeleteVolume: %v", err)
	}
}

// treeSum hashes the names and contents of the files in dir.
func treeSum(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %d\n", rel, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:16]
}

// TestVMNFSSnapshotRestoreClone: a snapshot of a 1 GiB volume holding 256
// MiB is cut on the storage host (reflinks on xfs); its time and the bytes
// it took are reported; restore and clone are verified by content on
// another node.
func TestVMNFSSnapshotRestoreClone(t *testing.T) {
	c := newNFSCluster(t)
	v := c.create(t, "snapsrc", 1<<30, nil, nil)
	folder := v.VolumeContext["export"]
	// The data is written on the storage host: what is measured is the
	// snapshot, not the network.
	data := make([]byte, 4<<20)
	for i := range 64 {
		for j := range data {
			data[j] = byte(i*7 + j%251)
		}
		if err := os.WriteFile(filepath.Join(folder, fmt.Sprintf("data-%02d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	unix.Sync()
	want := treeSum(t, folder)
	var before, after unix.Statfs_t
	unix.Statfs(c.pool, &before)
	var snap *csi.Snapshot
	took := nfstest.Timed(t, "CreateSnapshot of 256 MiB in a 1 GiB volume", func() {
		r, err := c.ctrl.Controller().CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{SourceVolumeId: v.VolumeId, Name: "snap1"})
		if err != nil {
			t.Fatal(err)
		}
		snap = r.GetSnapshot()
	})
	unix.Sync()
	unix.Statfs(c.pool, &after)
	copied := (int64(before.Bfree) - int64(after.Bfree)) * before.Bsize
	t.Logf("snapshot: 256 MiB of data in %v (%.2f s per GiB of data); pool space taken %d KiB (reflinked: %v)",
		took.Round(time.Millisecond), took.Seconds()*4, copied>>10, copied < 16<<20)
	if !snap.GetReadyToUse() {
		t.Fatalf("snapshot not ready: %v", snap)
	}
	// Changes after the cut stay out of the snapshot.
	if err := os.WriteFile(filepath.Join(folder, "data-00"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	restored := c.create(t, "restored", 1<<30, nil, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.SnapshotId}}})
	clone := c.create(t, "clone", 1<<30, nil, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.VolumeId}}})
	if got := treeSum(t, c.publish(t, restored, 1)); got != want {
		t.Errorf("restore read on node B: %s, want %s", got, want)
	}
	cl := c.publish(t, clone, 0)
	if data, err := os.ReadFile(filepath.Join(cl, "data-00")); err != nil || string(data) != "changed" {
		t.Errorf("clone read on node A: data-00 = %.10q, %v; want the source as it was when cloned", data, err)
	}
	c.unpublish(t, restored, 1)
	c.unpublish(t, clone, 0)
	for _, x := range []*csi.Volume{restored, clone, v} {
		c.delete(t, x)
	}
	nfsTimed(t, "DeleteSnapshot", func() (*csi.DeleteSnapshotResponse, error) {
		return c.ctrl.Controller().DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId})
	})
	if ents, _ := os.ReadDir(c.pool); len(ents) != 0 {
		t.Errorf("pool after deleting everything: %v", ents)
	}
}

// TestVMNFSClientMode: folders of an operator's export, shared by both
// nodes; capacity is advisory and the context says so; onDelete archive
// keeps the folder under another name.
func TestVMNFSClientMode(t *testing.T) {
	c := newNFSCluster(t)
	params := map[string]string{"mode": "client", "server": nfstest.ServerAddr, "share": c.share, "onDelete": "archive"}
	v := c.create(t, "client1", 32<<20, params, nil)
	if v.VolumeContext["capacity"] != "advisory" {
		t.Errorf("client-mode context %v does not say the capacity is advisory", v.VolumeContext)
	}
	a, b := c.publish(t, v, 0), c.publish(t, v, 1)
	if err := writeSync(filepath.Join(a, "from-a"), []byte("hello from a")); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(b, "from-a")); err != nil || string(data) != "hello from a" {
		t.Fatalf("node B reads A's write: %q, %v", data, err)
	}
	folder := filepath.Join(c.share, strings.TrimPrefix(v.VolumeId, "nfs:"))
	if _, err := os.Stat(filepath.Join(folder, "from-a")); err != nil {
		t.Fatalf("the write is not in the share's folder %s: %v", folder, err)
	}
	snap := nfsTimed(t, "CreateSnapshot (client mode, server-side copy)", func() (*csi.CreateSnapshotResponse, error) {
		return c.ctrl.Controller().CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{SourceVolumeId: v.VolumeId, Name: "csnap"})
	}).GetSnapshot()
	c.unpublish(t, v, 0)
	c.unpublish(t, v, 1)
	c.delete(t, v)
	archived := filepath.Join(c.share, "archived-"+strings.TrimPrefix(v.VolumeId, "nfs:"))
	if data, err := os.ReadFile(filepath.Join(archived, "from-a")); err != nil || string(data) != "hello from a" {
		t.Errorf("onDelete archive: %s holds %q, %v", archived, data, err)
	}
	if _, err := os.Stat(folder); !os.IsNotExist(err) {
		t.Errorf("folder still under its name after an archiving delete: %v", err)
	}
	nfsTimed(t, "DeleteSnapshot", func() (*csi.DeleteSnapshotResponse, error) {
		return c.ctrl.Controller().DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId})
	})
}

// TestVMNFSBadInput: refused with INVALID_ARGUMENT and the reason, and
// nothing made.
func TestVMNFSBadInput(t *testing.T) {
	c := newNFSCluster(t)
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}}
	for _, tc := range []struct {
		name   string
		params map[string]string
		cap    *csi.VolumeCapability
		want   string
	}{
		{"unknown-mode", map[string]string{"mode": "magic"}, rwx, "mode"},
		{"server-not-granted", map[string]string{"mode": "client", "server": "203.0.113.9", "share": "/srv"}, rwx, "not granted"},
		{"export-outside-roots", map[string]string{"mode": "client", "server": nfstest.ServerAddr, "share": "/etc"}, rwx, "not granted"},
		{"client-params-in-server-mode", map[string]string{"mode": "server", "share": "/srv"}, rwx, "share"},
		{"block", nil, block, "block"},
	} {
		_, err := c.ctrl.Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "bad-" + tc.name,
			VolumeCapabilities: []*csi.VolumeCapability{tc.cap}, Parameters: tc.params})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(strings.ToLower(err.Error()), tc.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", tc.name, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(c.pool); len(ents) != 0 {
		t.Errorf("refused creations left %v in the pool", ents)
	}
	if ents, _ := os.ReadDir(c.ctrlMounts); len(ents) != 0 {
		t.Errorf("refused creations left %v in the controller's mounts", ents)
	}
	if ents, _ := os.ReadDir(c.share); len(ents) != 0 {
		t.Errorf("refused creations left %v in the share", ents)
	}
	if b, err := os.ReadFile("/etc/exports.d/wasmcsi-nfs.exports"); err == nil {
		t.Errorf("refused creations recorded exports:\n%s", b)
	}
}
