package faulttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

const (
	envVM         = "WASMCSI_VM"
	backendParam  = "wasmcsi.dev/backend"
	callTimeout   = 60 * time.Second
	dataBytes     = 64 << 10
	headerBytes   = 4096
	blockMagic    = "wasmcsi-fault\n"
	dataFile      = "data"
	localdirBytes = 16 << 20
	loopfileBytes = 16 << 20
)

// require skips t unless it runs as root inside the VM tier, where it loads
// the kernel modules named (a module that does not load fails t: the tier
// promises it). These tests change block devices and device-mapper tables:
// never on a developer's machine.
func require(t *testing.T, modules ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root and the VM tier: run make test-faults")
	}
	if os.Getenv(envVM) != "1" {
		t.Skip("needs the VM tier (dm-log-writes, dm-flakey on a kernel of its own): run make test-faults")
	}
	for _, m := range append([]string{"loop", "dm_mod"}, modules...) {
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			t.Fatalf("VM tier: modprobe %s: %v: %s", m, err, strings.TrimSpace(string(out)))
		}
	}
	daemontest.Require(t)
}

// run runs a command a test needs (dmsetup, mkfs) and fails t with its
// output when it fails.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out)
}

// sparseFile makes a sparse file of size bytes.
func sparseFile(t testing.TB, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err == nil {
		err = errors.Join(f.Truncate(size), f.Close())
	}
	if err != nil {
		t.Fatal(err)
	}
}

// attach attaches file as a loop device and returns its path; detach
// undoes it (the caller registers it where the order of cleanups needs).
func attach(t testing.TB, file string) string {
	t.Helper()
	dev, err := loop.Attach(context.Background(), file, loop.Options{})
	if err != nil {
		t.Fatalf("attach %s: %v", file, err)
	}
	return dev.Path
}

func detach(t testing.TB, dev string) {
	if err := loop.Detach(context.Background(), dev); err != nil {
		t.Errorf("detach %s: %v", dev, err)
	}
}

// dmCreate creates device-mapper device name with a one-line table and
// returns its node; the device is removed when t ends.
func dmCreate(t testing.TB, name, table string) string {
	t.Helper()
	exec.Command("dmsetup", "remove", "--retry", name).Run() // left by an aborted run
	run(t, "dmsetup", "create", name, "--table", table)
	t.Cleanup(func() { exec.Command("dmsetup", "remove", "--retry", name).Run() })
	return "/dev/mapper/" + name
}

func sectors(t testing.TB, dev string) string {
	t.Helper()
	return strings.TrimSpace(run(t, "blockdev", "--getsz", dev))
}

// mountFS mounts an ext4 device at dir.
func mountFS(t testing.TB, dev, dir, opts string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, dir, "ext4", 0, opts); err != nil {
		t.Fatalf("mount %s at %s: %v", dev, dir, err)
	}
}

func unmount(t testing.TB, dir string) {
	if err := unix.Unmount(dir, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		t.Errorf("unmount %s: %v", dir, err)
	}
}

// modules are the daemon's backends for these tiers: the two node-local
// examples, each with a pool folder of its own. Their TinyGo builds when
// the tier has them (WASMCSI_TINYGO set): under emulation the daemon
// compiles a Go-built module for minutes, a TinyGo one in seconds.
func modules(t testing.TB) []daemontest.Module {
	tc := toolchain()
	return []daemontest.Module{
		{Name: "localdir", Wasm: moduletest.Build(t, "../../examples/localdir", tc), HostCalls: []string{"dir"}, Pool: true},
		{Name: "loopfile", Wasm: moduletest.Build(t, "../../examples/loopfile", tc), HostCalls: []string{"file", "loop"}, Pool: true},
	}
}

func toolchain() moduletest.Toolchain {
	dir := os.Getenv(moduletest.EnvModuleDir)
	for _, m := range []string{"localdir", "loopfile"} {
		if _, err := os.Stat(filepath.Join(dir, m+".tinygo.wasm")); dir == "" || err != nil {
			return moduletest.Go
		}
	}
	return moduletest.TinyGo
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// vol is a volume as the CO knows it.
type vol struct {
	name, id, backend string
	block             bool
	capacity          int64
	volCtx            map[string]string
	token             string // the data last written and acknowledged ("" none)
}

func (v *vol) capability() *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if v.block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}
	}
	return c
}

func staging(node string, v *vol) string { return filepath.Join(node, "staging", v.name) }
func target(node string, v *vol) string  { return filepath.Join(node, "target", v.name) }

// stagePublish stages and publishes v as kubelet does (it makes the
// staging folder and the target's parent).
func stagePublish(c context.Context, d *daemontest.Daemon, node string, v *vol) error {
	st, tg := staging(node, v), target(node, v)
	if err := errors.Join(os.MkdirAll(st, 0o750), os.MkdirAll(filepath.Dir(tg), 0o750)); err != nil {
		return err
	}
	if _, err := d.Node().NodeStageVolume(c, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: st,
		VolumeCapability: v.capability(), VolumeContext: v.volCtx}); err != nil {
		return fmt.Errorf("NodeStageVolume: %w", err)
	}
	if _, err := d.Node().NodePublishVolume(c, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: st,
		TargetPath: tg, VolumeCapability: v.capability(), VolumeContext: v.volCtx}); err != nil {
		return fmt.Errorf("NodePublishVolume: %w", err)
	}
	return nil
}

func unpublishUnstage(c context.Context, d *daemontest.Daemon, node string, v *vol) error {
	if _, err := d.Node().NodeUnpublishVolume(c, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: target(node, v)}); err != nil {
		return fmt.Errorf("NodeUnpublishVolume: %w", err)
	}
	if _, err := d.Node().NodeUnstageVolume(c, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: staging(node, v)}); err != nil {
		return fmt.Errorf("NodeUnstageVolume: %w", err)
	}
	return nil
}

// payload is token's data: the token and fill derived from it, so a
// reader tells a whole generation from a torn one.
func payload(token string) []byte {
	seed := sha256.Sum256([]byte(token))
	b := make([]byte, dataBytes)
	rand.NewChaCha8(seed).Read(b)
	copy(b, token+"\n")
	return b
}

// writeData makes token the data of the published volume at tg, durably,
// as an application that fsyncs: on a filesystem a new file renamed over
// the old one, on a block device the fill first and the header last.
func writeData(tg string, block bool, token string) error {
	if block {
		f, err := os.OpenFile(tg, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteAt(payload(token), headerBytes); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		h := make([]byte, headerBytes)
		copy(h, blockMagic+token+"\n")
		if _, err := f.WriteAt(h, 0); err != nil {
			return err
		}
		return f.Sync()
	}
	tmp := filepath.Join(tg, dataFile+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(payload(token))
	if err == nil {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(tg, dataFile)); err != nil {
		return err
	}
	dir, err := os.Open(tg)
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

// readToken tells which generation the published volume at tg holds: ""
// for none, an error for a torn or foreign one.
func readToken(tg string, block bool) (string, error) {
	var b []byte
	if block {
		f, err := os.Open(tg)
		if err != nil {
			return "", err
		}
		defer f.Close()
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		h := make([]byte, headerBytes)
		if _, err := io.ReadFull(f, h); err != nil {
			return "", err
		}
		if bytes.Equal(h, make([]byte, headerBytes)) {
			return "", nil
		}
		tok, ok := bytes.CutPrefix(h, []byte(blockMagic))
		if !ok {
			return "", fmt.Errorf("header %q", bytes.TrimRight(h[:64], "\x00"))
		}
		token, _, _ := strings.Cut(string(tok), "\n")
		b = make([]byte, dataBytes)
		if _, err := f.ReadAt(b, headerBytes); err != nil {
			return "", err
		}
		if !bytes.Equal(b, payload(token)) {
			return "", fmt.Errorf("data %q: fill torn", token)
		}
		return token, nil
	}
	b, err := os.ReadFile(filepath.Join(tg, dataFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	token, _, _ := strings.Cut(string(b), "\n")
	if !bytes.Equal(b, payload(token)) {
		return "", fmt.Errorf("data %q: %d bytes, torn", token, len(b))
	}
	return token, nil
}

// startDaemon starts the daemon the first time: under emulation (TCG)
// compiling the modules into the shared cache takes minutes; later starts
// load them from it.
func startDaemon(t *testing.T, d *daemontest.Daemon) {
	t.Helper()
	begin := time.Now()
	if err := d.Spawn(); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitReady(10 * time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("first start (compiles the modules unless cached) took %v", time.Since(begin).Round(time.Millisecond))
}

// start starts the daemon again, with room for a slow start-up: under
// emulation loading even cached modules takes tens of seconds.
func start(d *daemontest.Daemon) error {
	if err := d.Spawn(); err != nil {
		return err
	}
	err := d.WaitReady(3 * time.Minute)
	if err != nil && d.Running() {
		// Hung: its goroutines (SIGQUIT) say where.
		unix.Kill(d.Pid(), unix.SIGQUIT)
		time.Sleep(2 * time.Second)
		lines := d.Log()
		if len(lines) > 80 {
			lines = lines[:80]
		}
		err = fmt.Errorf("%w\ngoroutines:\n%s", err, strings.Join(lines, "\n"))
		d.Kill(true)
	}
	return err
}
