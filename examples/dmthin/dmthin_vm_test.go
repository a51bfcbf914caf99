//go:build !wasip1

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/examples/dmthin/dmthintest"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// The built module on a real thin pool (VM tier): every operation through
// the real host calls, with the data on the thin devices checked, the
// pool's accounting checked against what was written, and a reboot after
// which configure must find the pool and every id again. Each step logs
// its time.
func TestModuleOnThinPool(t *testing.T) {
	for _, tc := range moduletest.Toolchains {
		t.Run(string(tc), func(t *testing.T) {
			dmthintest.Require(t)
			wasm := dmthintest.Module(t, tc)
			fx := dmthintest.New(t, "mod-"+string(tc), 256*mib, 8*mib)
			grant := modules.Grant{HostCalls: dmthintest.HostCalls, Roots: append([]string{t.TempDir()}, fx.Roots()...), Config: fx.Config()}
			var m *moduletest.Module
			dmthintest.Timed(t, string(tc)+" load + configure (new pool)", func() {
				m = moduletest.Load(t, wasm, moduletest.Options{Name: "dmthin", Grant: grant, HostCalls: catalog.All()})
			})
			op := func(what string, o abi.Op, req, resp abi.Message) {
				t.Helper()
				var err error
				dmthintest.Timed(t, string(tc)+" "+what, func() { err = m.Call(o, req, resp) })
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			available := func() int64 {
				t.Helper()
				var c abi.GetCapacityResponse
				op("get_capacity", abi.OpGetCapacity, &abi.GetCapacityRequest{}, &c)
				return c.AvailableBytes
			}
			stage := func(v abi.VolumeRef) string {
				t.Helper()
				var st abi.NodeStageResponse
				op("node_stage (activate)", abi.OpNodeStage, &abi.NodeStageRequest{Volume: v, Capability: blockCap()[0]}, &st)
				return st.Device
			}
			unstage := func(v abi.VolumeRef) {
				t.Helper()
				op("node_unstage (deactivate)", abi.OpNodeUnstage, &abi.NodeUnstageRequest{Volume: v}, &abi.Empty{})
			}

			empty := available()
			if empty <= 0 || empty > 256*mib {
				t.Fatalf("capacity of an empty 256 MiB pool: %d", empty)
			}
			var a abi.CreateVolumeResponse
			op("create_volume", abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "vol-a", RequiredBytes: 64 * mib, Capabilities: blockCap()}, &a)
			var again abi.CreateVolumeResponse
			op("create_volume (repeat)", abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "vol-a", RequiredBytes: 64 * mib, Capabilities: blockCap()}, &again)
			if again.LocalID != a.LocalID {
				t.Fatalf("repeat gave %s, first %s", again.LocalID, a.LocalID)
			}
			aref := ref(&a)
			dev := stage(aref)
			if got := deviceSize(t, dev); got != 64*mib {
				t.Fatalf("%s has %d bytes, want 64 MiB", dev, got)
			}
			first := pattern(4*mib, 1)
			writeDevice(t, dev, 0, first)
			if used := empty - available(); used != 4*mib {
				t.Errorf("writing 4 MiB used %d bytes of capacity", used)
			}

			var s abi.CreateSnapshotResponse
			op("create_snapshot (origin active)", abi.OpCreateSnapshot, &abi.CreateSnapshotRequest{Name: "snap-a", Source: aref}, &s)
			if used := empty - available(); used != 4*mib {
				t.Errorf("after the snapshot %d bytes used, want the 4 MiB written once", used)
			}
			writeDevice(t, dev, 0, pattern(mib, 2))
			if used := empty - available(); used != 5*mib {
				t.Errorf("after overwriting 1 MiB shared with the snapshot %d bytes used, want 5 MiB", used)
			}

			sref := abi.SnapshotRef{LocalID: s.LocalID, Context: s.Context, SizeBytes: s.SizeBytes}
			var r abi.CreateVolumeResponse
			op("create_volume (restore, bigger)", abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "vol-r", RequiredBytes: 96 * mib,
				Capabilities: blockCap(), Source: &abi.VolumeSource{Snapshot: &sref}}, &r)
			rdev := stage(ref(&r))
			if got := deviceSize(t, rdev); got != 96*mib {
				t.Errorf("restored device %d bytes, want 96 MiB", got)
			}
			if got := readDevice(t, rdev, 0, int64(len(first))); !bytes.Equal(got, first) {
				t.Error("the restored volume does not hold the snapshot's data")
			}
			var c abi.CreateVolumeResponse
			op("create_volume (clone)", abi.OpCreateVolume, &abi.CreateVolumeRequest{Name: "vol-c", RequiredBytes: mib,
				Capabilities: blockCap(), Source: &abi.VolumeSource{Volume: &aref}}, &c)
			cdev := stage(ref(&c))
			if got := readDevice(t, cdev, 0, mib); !bytes.Equal(got, pattern(mib, 2)) {
				t.Error("the clone does not hold the volume's current data")
			}
			if used := empty - available(); used != 5*mib {
				t.Errorf("restore and clone took %d bytes, want none", used-5*mib)
			}

			// Expansion while staged shows at once; while unstaged it shows
			// at the next stage, even with the creation's context.
			var ex abi.ExpandVolumeResponse
			op("expand_volume (active)", abi.OpExpandVolume, &abi.ExpandVolumeRequest{Volume: aref, RequiredBytes: 128 * mib}, &ex)
			if got := deviceSize(t, dev); got != 128*mib {
				t.Errorf("after expand_volume the device has %d bytes", got)
			}
			var ne abi.NodeExpandResponse
			op("node_expand", abi.OpNodeExpand, &abi.NodeExpandRequest{Volume: aref, Device: dev, RequiredBytes: 128 * mib}, &ne)
			if ne.CapacityBytes != 128*mib {
				t.Errorf("node_expand reports %d", ne.CapacityBytes)
			}
			unstage(aref)
			if _, err := os.Stat(dev); !os.IsNotExist(err) {
				t.Errorf("%s after unstage: %v", dev, err)
			}
			op("expand_volume (inactive)", abi.OpExpandVolume, &abi.ExpandVolumeRequest{Volume: aref, RequiredBytes: 160 * mib}, &ex)
			dev = stage(aref)
			if got := deviceSize(t, dev); got != 160*mib {
				t.Errorf("restaged after an inactive expansion: %d bytes, want 160 MiB", got)
			}

			// A reboot: the pool device is gone; configure (here natively,
			// the same code against the real host calls, which spares a
			// second compilation of the module) opens the pool from its
			// metadata, and names find their ids again.
			for _, v := range []abi.VolumeRef{aref, ref(&r), ref(&c)} {
				unstage(v)
			}
			mapper, err := dm.New(fx.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			if err := mapper.Remove(context.Background(), fx.Pool); err != nil {
				t.Fatal(err)
			}
			hostcall.SetHost(moduletest.RealHost(catalog.All(), grant.Roots))
			t.Cleanup(func() { hostcall.SetHost(nil) })
			native := New()
			dmthintest.Timed(t, "native configure (reopen pool after reboot)", func() {
				err = native.Configure(&abi.ConfigureRequest{Config: grant.Config, Roots: grant.Roots, NodeID: "moduletest", Role: "all"})
			})
			if err != nil {
				t.Fatal(err)
			}
			if info, _ := mapper.Info(context.Background(), fx.Pool); !info.Exists {
				t.Fatal("configure did not activate the pool")
			}
			after, err := native.CreateVolume(&abi.CreateVolumeRequest{Name: "vol-a", RequiredBytes: 160 * mib, Capabilities: blockCap()})
			if err != nil || after.LocalID != a.LocalID {
				t.Errorf("after the reboot vol-a is %+v (%v), was %s", after, err, a.LocalID)
			}
			dev = stage(aref)
			if got := readDevice(t, dev, mib, mib); !bytes.Equal(got, first[mib:2*mib]) {
				t.Error("data lost across the reboot")
			}
			if got := deviceSize(t, dev); got != 160*mib {
				t.Errorf("after the reboot the volume has %d bytes, want 160 MiB", got)
			}
			unstage(aref)

			op("delete_snapshot", abi.OpDeleteSnapshot, &abi.DeleteSnapshotRequest{Snapshot: sref}, &abi.Empty{})
			for _, v := range []abi.VolumeRef{aref, ref(&r), ref(&c)} {
				op("delete_volume", abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: v}, &abi.Empty{})
			}
			if got := available(); got != empty {
				t.Errorf("after deleting everything %d bytes available, want %d", got, empty)
			}
			left, err := os.ReadDir(grant.Roots[0])
			if err != nil || len(left) != 0 {
				t.Errorf("state folder after deleting everything: %v %v", left, err)
			}
		})
	}
}

// pattern returns n bytes that differ per seed and per 4 KiB.
func pattern(n int64, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i>>12) + byte(i)
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
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writeDevice(t *testing.T, dev string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("write %s: %v", dev, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", dev, err)
	}
}

func readDevice(t *testing.T, dev string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	return b
}
