package loop_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// BenchmarkAttachDetach measures one Attach + Detach by ioctl.
func BenchmarkAttachDetach(b *testing.B) {
	looptest.Require(b)
	file := looptest.SparseFile(b, 64*mib)
	attachDetach(b, file)
}

// BenchmarkLosetup measures the same work done by running losetup, for
// comparison.
func BenchmarkLosetup(b *testing.B) {
	looptest.Require(b)
	if _, err := exec.LookPath("losetup"); err != nil {
		b.Skip("needs losetup: ", err)
	}
	file := looptest.SparseFile(b, 64*mib)
	for b.Loop() {
		out, err := exec.Command("losetup", "-f", "--show", file).Output()
		if err != nil {
			b.Fatal(err)
		}
		dev := strings.TrimSpace(string(out))
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			b.Fatalf("losetup -d %s: %v: %s", dev, err, out)
		}
	}
}

// BenchmarkAttachDetachAmong is BenchmarkAttachDetach with eight other
// files bound: Detach forgets where the file was, so each Attach reads the
// status of every bound device to make sure the file is on none of them.
func BenchmarkAttachDetachAmong(b *testing.B) {
	looptest.Require(b)
	bindOthers(b, 8)
	file := looptest.SparseFile(b, 64*mib)
	attachDetach(b, file)
}

// BenchmarkFindAbsentAmong is the look-up that precedes every such Attach
// alone: a file attached nowhere, eight other files bound.
func BenchmarkFindAbsentAmong(b *testing.B) {
	looptest.Require(b)
	ctx := context.Background()
	bindOthers(b, 8)
	file := looptest.SparseFile(b, mib)
	for b.Loop() {
		if _, found, err := loop.Find(ctx, file); err != nil || found {
			b.Fatal(found, err)
		}
	}
}

// attachDetach is the timed loop of the attach benchmarks: one Attach and
// one Detach of file per iteration.
func attachDetach(b *testing.B, file string) {
	ctx := context.Background()
	b.Helper()
	for b.Loop() {
		d, err := loop.Attach(ctx, file, loop.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := loop.Detach(ctx, d.Path); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStageUnstageCalls measures the loop work of one NodeStage and
// one NodeUnstage of a loopfile volume, each its own operation (memo):
// loop_attach and the host's claim of the device, then loop_find and
// loop_detach.
func BenchmarkStageUnstageCalls(b *testing.B) {
	looptest.Require(b)
	root := b.TempDir()
	file := filepath.Join(root, "v.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(file, 64*mib); err != nil {
		b.Fatal(err)
	}
	env := &hostcalls.Env{Module: "bench", Roots: []string{root}}
	calls := map[string]hostcalls.Func{}
	for _, f := range loop.Bindings() {
		calls[f.Name] = f
	}
	call := func(ctx context.Context, name string, req, resp hostcalls.Message) {
		out, err := calls[name].Call(ctx, env, req.AppendWire(nil))
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		if err := resp.UnmarshalWire(out); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		if d, ok, err := loop.Find(context.Background(), file); err == nil && ok {
			loop.DetachBound(context.Background(), d)
		}
	})
	for b.Loop() {
		stage := hostcalls.WithMemo(context.Background())
		var dev abi.LoopDevice
		call(stage, abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: file}, &dev)
		if _, owned, err := loop.Devices.OwnsDevice(stage, hostcalls.Device{Path: dev.Path, Real: dev.Path}, env.Roots); err != nil || !owned {
			b.Fatalf("claim of %s: %v, %v", dev.Path, owned, err)
		}
		unstage := hostcalls.WithMemo(context.Background())
		var found abi.LoopFindResponse
		call(unstage, abi.HostCallLoopFind, &abi.LoopFileRequest{File: file}, &found)
		call(unstage, abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: found.Device.Path}, &abi.Empty{})
	}
}

// bindOthers binds n other files for the benchmark's time.
func bindOthers(b *testing.B, n int) {
	ctx := context.Background()
	for range n {
		d, err := loop.Attach(ctx, looptest.SparseFile(b, mib), loop.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := loop.DetachBound(ctx, d); err != nil {
				b.Error(err)
			}
		})
	}
}
