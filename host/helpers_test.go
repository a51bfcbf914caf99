package host_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// backendParam is the StorageClass parameter that picks a backend (the
// configuration's default).
const backendParam = "wasmcsi.dev/backend"

// localdirWasm builds the localdir example with the standard Go toolchain
// (once per test binary).
func localdirWasm(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat("../examples/localdir"); err != nil {
		t.Skip("example modules not present: ", err)
	}
	return moduletest.Build(t, "../examples/localdir", moduletest.Go)
}

// localdirModule is the first module of most tests: localdir with quotas
// turned off, so what it offers does not depend on the test machine's
// filesystem.
func localdirOptions(t testing.TB) daemonOptions {
	return daemonOptions{
		backend: "localdir", wasm: localdirWasm(t), hostcalls: []string{"dir", "mount"},
		config: map[string]string{"quota": "off"},
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var rwCap = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func rwCaps() []*csi.VolumeCapability { return []*csi.VolumeCapability{rwCap} }

// callCtx bounds one CSI call of a test.
func callCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails the test unless err has code c and its message contains
// every one of words.
func wantCode(t testing.TB, err error, c codes.Code, words ...string) {
	t.Helper()
	st, _ := status.FromError(err)
	if err == nil || st.Code() != c {
		t.Fatalf("got %v, want %s", err, c)
	}
	for _, w := range words {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("message %q does not contain %q", st.Message(), w)
		}
	}
}

// createVolume creates a volume and deletes it when the test ends.
func createVolume(t testing.TB, d *daemon, req *csi.CreateVolumeRequest) *csi.Volume {
	t.Helper()
	if req.VolumeCapabilities == nil {
		req.VolumeCapabilities = rwCaps()
	}
	resp, err := d.controller().CreateVolume(callCtx(t), req)
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", req.Name, err)
	}
	id := resp.GetVolume().GetVolumeId()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	})
	return resp.GetVolume()
}

// mountsAt counts the mounts whose mount point is path (stacked mounts
// each count).
func mountsAt(t testing.TB, path string) int {
	t.Helper()
	ms, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) { return i.Mountpoint != path, false })
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}

// mountsUnder lists the mount points at dir or below it.
func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out
}

// workDir returns a folder for staging and target paths whose mounts are
// all detached when the test ends, also when it fails half-way. It is
// outside every pool, as a CO's paths are.
func workDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "wcsi-work-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unmountAll(t, dir)
		os.RemoveAll(dir)
	})
	return dir
}

// unmountAll detaches every mount at or below dir, deepest first.
func unmountAll(t testing.TB, dir string) {
	ms := mountsUnder(t, dir)
	slices.SortFunc(ms, func(a, b string) int { return len(b) - len(a) })
	for _, m := range ms {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s: %v", m, err)
		}
	}
}

// staging and target paths the way kubelet lays them out.
func stagingPath(dir, name string) string { return filepath.Join(dir, "staging", name) }
func targetPath(dir, name string) string  { return filepath.Join(dir, "pods", name, "mount") }

// gate is the test_wait host call: a module call that reaches it blocks
// until the test opens the gate (or the call's deadline passes), so a test
// can hold a module call, and every lock it holds, for as long as it likes.
type gate struct {
	entered chan string // the name of each request that reached the gate
	once    sync.Once
	open    chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan string, 16), open: make(chan struct{})}
}

// release lets every waiting and future call through.
func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

func (g *gate) hostCall() hostcalls.Func {
	return hostcalls.Func{
		Name: "test_wait", Family: "test",
		Call: func(ctx context.Context, _ *hostcalls.Env, req []byte) ([]byte, error) {
			var r abi.CreateVolumeRequest
			if err := r.UnmarshalWire(req); err != nil {
				return nil, abi.Errorf(abi.InvalidArgument, "%v", err)
			}
			g.entered <- r.Name
			select {
			case <-g.open:
				return nil, nil
			case <-ctx.Done():
				return nil, abi.Errorf(abi.DeadlineExceeded, "test_wait: %v", ctx.Err())
			}
		},
	}
}

// faultModule is the fault fixture with the gate's host call granted.
func faultModule(limits *config.Limits) daemonModule {
	return daemonModule{name: "fault", wasm: filepath.Join("testdata", "fault.wasm"), hostcalls: []string{"test"}, limits: limits}
}
