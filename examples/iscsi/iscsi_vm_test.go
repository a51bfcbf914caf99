//go:build !wasip1

package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/iscsi/iscsitest"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// The built module against the daemon's real host calls: LIO on loopback,
// open-iscsi's initiator and files in a temporary pool (VM tier). The host
// steps (format, mount) are not involved; the host's own VM tests run the
// module through the CSI services.

// loadOnSAN loads the module built with tc, granted the file, lio and iscsi
// families over a fresh pool and the fixture's prefix and portal.
func loadOnSAN(t *testing.T, tc moduletest.Toolchain, fx *iscsitest.Fixture) (*moduletest.Module, string) {
	t.Helper()
	wasm := iscsitest.Module(t, tc)
	pool := t.TempDir()
	calls, err := catalog.New(catalog.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	m := moduletest.Load(t, wasm, moduletest.Options{
		Name:      "iscsi",
		HostCalls: calls,
		Grant:     modules.Grant{HostCalls: iscsitest.HostCalls, Roots: append([]string{pool}, fx.Roots()...), Config: fx.Config()},
	})
	return m, pool
}

// timedCall runs op, logs its time and fails the test on an error.
func timedCall[R any, PR interface {
	*R
	abi.Message
}](t *testing.T, m *moduletest.Module, op abi.Op, req abi.Message) PR {
	t.Helper()
	var resp PR
	iscsitest.Timed(t, string(op), func() { resp = call[R, PR](t, m, op, req) })
	return resp
}

func TestVMModuleOnSAN(t *testing.T) {
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			fx := iscsitest.New(t, "module-"+string(tc)).WithCHAP()
			m, pool := loadOnSAN(t, tc, fx)
			info := timedCall[abi.NodeInfoResponse](t, m, abi.OpNodeInfo, &abi.Empty{})
			if info.Context[NodeContextInitiator] == "" {
				t.Fatalf("node info without an initiator name: %+v", info)
			}
			block := []abi.Capability{{Block: true, AccessMode: abi.AccessSingleNodeWriter}}
			create := func(name string, src *abi.VolumeSource) *abi.CreateVolumeResponse {
				return timedCall[abi.CreateVolumeResponse](t, m, abi.OpCreateVolume,
					&abi.CreateVolumeRequest{Name: name, RequiredBytes: 16 * sdk.MiB, Capabilities: block, Source: src})
			}
			stage := func(v *abi.CreateVolumeResponse) *abi.NodeStageResponse {
				pub := timedCall[abi.ControllerPublishResponse](t, m, abi.OpControllerPublish,
					&abi.ControllerPublishRequest{Volume: ref(v), NodeID: "vm", NodeContext: info.Context})
				return timedCall[abi.NodeStageResponse](t, m, abi.OpNodeStage,
					&abi.NodeStageRequest{Volume: ref(v), PublishContext: pub.PublishContext, StagingPath: "/unused", Capability: block[0]})
			}
			unstage := func(v *abi.CreateVolumeResponse, st *abi.NodeStageResponse) {
				timedCall[abi.Empty](t, m, abi.OpNodeUnstage, &abi.NodeUnstageRequest{Volume: ref(v), Device: st.Device, StageContext: st.Context})
			}
			a, b := create("vm-a", nil), create("vm-b", nil)
			stA, stB := stage(a), stage(b)
			ss := fx.Sessions(t)
			if len(ss) != 1 || len(ss[0].Disks) != 2 {
				t.Fatalf("sessions %+v: want one session with two disks", ss)
			}
			dataA := bytes.Repeat([]byte("volume A;"), 4096)[:16<<10]
			writeDevice(t, stA.Device, 1<<20, dataA)
			writeDevice(t, stB.Device, 0, bytes.Repeat([]byte("volume B;"), 4096)[:16<<10])

			// Grow A online: the file and the LUN on the target, then the
			// node's disk.
			exp := timedCall[abi.ExpandVolumeResponse](t, m, abi.OpExpandVolume, &abi.ExpandVolumeRequest{Volume: ref(a), RequiredBytes: 32 * sdk.MiB})
			a.CapacityBytes = exp.CapacityBytes
			nexp := timedCall[abi.NodeExpandResponse](t, m, abi.OpNodeExpand,
				&abi.NodeExpandRequest{Volume: ref(a), Device: stA.Device, RequiredBytes: 32 * sdk.MiB, StageContext: stA.Context})
			if nexp.CapacityBytes != 32*sdk.MiB || deviceSize(t, stA.Device) != 32*sdk.MiB {
				t.Fatalf("after expansion: node_expand %d, device %d bytes; want 32 MiB", nexp.CapacityBytes, deviceSize(t, stA.Device))
			}

			// A snapshot of A restored as C holds A's data.
			snap := timedCall[abi.CreateSnapshotResponse](t, m, abi.OpCreateSnapshot, &abi.CreateSnapshotRequest{Name: "vm-snap", Source: ref(a)})
			c := create("vm-c", &abi.VolumeSource{Snapshot: &abi.SnapshotRef{LocalID: snap.LocalID, Context: snap.Context, SizeBytes: snap.SizeBytes, Source: ref(a)}})
			if c.CapacityBytes != 32*sdk.MiB {
				t.Fatalf("restored volume of %d bytes, want the snapshot's 32 MiB", c.CapacityBytes)
			}
			stC := stage(c)
			if got := readDevice(t, stC.Device, 1<<20, len(dataA)); !bytes.Equal(got, dataA) {
				t.Fatal("the restored volume does not hold the snapshot's data")
			}

			// Unstaging A leaves the session to B and C.
			unstage(a, stA)
			if ss := fx.Sessions(t); len(ss) != 1 || len(ss[0].Disks) != 2 {
				t.Fatalf("after unstaging A: sessions %+v, want one with B's and C's disks", ss)
			}
			more := bytes.Repeat([]byte("B again;"), 512)
			writeDevice(t, stB.Device, 4<<20, more)
			if got := readDevice(t, stB.Device, 4<<20, len(more)); !bytes.Equal(got, more) {
				t.Fatal("volume B does not read back what was written after A left")
			}
			unstage(b, stB)
			unstage(c, stC)
			if ss := fx.Sessions(t); len(ss) != 0 {
				t.Fatalf("sessions after the last unstage: %+v", ss)
			}
			for _, v := range []*abi.CreateVolumeResponse{a, b, c} {
				timedCall[abi.Empty](t, m, abi.OpControllerUnpublish, &abi.ControllerUnpublishRequest{Volume: ref(v), NodeID: "vm", NodeContext: info.Context})
				timedCall[abi.Empty](t, m, abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: ref(v)})
			}
			timedCall[abi.Empty](t, m, abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: abi.SnapshotRef{LocalID: snap.LocalID, Context: snap.Context}})
			if _, err := os.Stat(filepath.Join("/sys/kernel/config/target/iscsi", fx.Target)); !os.IsNotExist(err) {
				t.Fatalf("target %s left after its last volume was deleted: %v", fx.Target, err)
			}
			if ents, _ := os.ReadDir(pool); len(ents) != 0 {
				t.Fatalf("pool holds %d files after every volume and snapshot was deleted", len(ents))
			}
		})
	}
}

func writeDevice(t *testing.T, dev string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("write %s at %d: %v", dev, off, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync %s: %v", dev, err)
	}
}

// readDevice reads from the disk itself, not from this node's cache of it.
func readDevice(t *testing.T, dev string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0); err != nil {
		t.Fatalf("flush the cache of %s: %v", dev, err)
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s at %d: %v", dev, off, err)
	}
	return b
}

func deviceSize(t *testing.T, dev string) int64 {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd) // a block device's end is its size
	if err != nil {
		t.Fatalf("size of %s: %v", dev, err)
	}
	return n
}
