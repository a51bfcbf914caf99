package crashtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

// EnvDaemon names a built daemon binary (make crash passes bin/wasmcsi);
// unset, the test builds cmd/wasmcsi itself. EnvToolchain picks the
// modules' build: go (the default, as make build) or tinygo (smaller
// modules, faster restarts).
const (
	EnvDaemon    = "WASMCSI_CRASH_DAEMON"
	EnvToolchain = "WASMCSI_CRASH_TOOLCHAIN"
)

// daemon is one wasmcsi process after another on the same configuration,
// records, pools and socket, as a node sees its driver come and go.
type daemon struct {
	t      *testing.T
	bin    string
	dir    string // everything of the run lies below it
	config string
	socket string
	state  string
	pools  map[string]string // backend -> pool folder
	node   string            // staging and target paths, as a CO lays them out

	cmd    *exec.Cmd
	exited chan struct{}
	starts int
	log    string // the current process's log file
	conn   *grpc.ClientConn
	ctrl   csi.ControllerClient
	nodeC  csi.NodeClient
}

// daemonBinary returns the daemon to run: $WASMCSI_CRASH_DAEMON, or
// cmd/wasmcsi built into dir.
func daemonBinary(t *testing.T, dir string) string {
	t.Helper()
	if p := os.Getenv(EnvDaemon); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", EnvDaemon, p, err)
		}
		return p
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("needs the go command to build the daemon (or %s naming a built one): %v", EnvDaemon, err)
	}
	out := filepath.Join(dir, "wasmcsi")
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", out, "github.com/wasmcsi/wasmcsi/cmd/wasmcsi")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the daemon: %v\n%s", err, b)
	}
	return out
}

// newDaemon lays out a fresh folder with the two node-local example
// backends and registers the cleanup that kills the daemon and releases
// every mount and loop device below the folder, whatever the test left.
func newDaemon(t *testing.T) *daemon {
	t.Helper()
	// Short: a unix socket path is limited to 108 bytes.
	dir, err := os.MkdirTemp("", "wcrash-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{
		t: t, dir: dir,
		config: filepath.Join(dir, "wasmcsi.yaml"),
		socket: filepath.Join(dir, "csi.sock"),
		state:  filepath.Join(dir, "state"),
		node:   filepath.Join(dir, "node"),
		pools: map[string]string{
			"localdir": filepath.Join(dir, "pools", "localdir"),
			"loopfile": filepath.Join(dir, "pools", "loopfile"),
		},
	}
	t.Cleanup(func() {
		d.kill(true)
		releaseUnder(t, dir)
		if !t.Failed() || os.Getenv("WASMCSI_CRASH_KEEP") == "" {
			os.RemoveAll(dir)
		} else {
			t.Logf("kept %s (WASMCSI_CRASH_KEEP)", dir)
		}
	})
	d.bin = daemonBinary(t, dir)
	mods := filepath.Join(dir, "modules")
	for _, p := range []string{mods, d.node, d.pools["localdir"], d.pools["loopfile"], filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tc := moduletest.Go
	switch os.Getenv(EnvToolchain) {
	case "", "go":
	case "tinygo":
		tc = moduletest.TinyGo
	default:
		t.Fatalf("%s=%q: want go or tinygo", EnvToolchain, os.Getenv(EnvToolchain))
	}
	for name := range d.pools {
		wasm, err := os.ReadFile(moduletest.Build(t, "../../examples/"+name, tc))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mods, name+".wasm"), wasm, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The configuration an operator would write for these two backends;
	// reconcile.clean stays off (the default), so whatever a crash leaves
	// behind stays visible to the checks. The compilation cache is shared
	// with the host tests: start-up compiles nothing after the first run.
	cfg := fmt.Sprintf(`endpoint: unix://%s
node_id: crash-node
state_dir: %s
module_dir: %s
cache_dir: %s
watch_modules: false
log_level: info
log_format: json
default_backend: localdir
modules:
  localdir:
    hostcalls: [dir]
    roots: [%s]
  loopfile:
    hostcalls: [file, loop]
    roots: [%s]
`, d.socket, d.state, mods, filepath.Join(os.TempDir(), "wasmcsi-test-cache"), d.pools["localdir"], d.pools["loopfile"])
	if err := os.WriteFile(d.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// childEnv is this process's environment without what would reconfigure
// the daemon behind the configuration file's back (WASMCSI_* and
// CSI_ENDPOINT override it).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "WASMCSI_") || strings.HasPrefix(kv, "CSI_ENDPOINT=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// spawn starts a daemon process without waiting for it to serve.
func (d *daemon) spawn() error {
	if d.cmd != nil {
		return errors.New("daemon already running")
	}
	d.starts++
	d.log = filepath.Join(d.dir, "logs", fmt.Sprintf("start-%04d.log", d.starts))
	logf, err := os.Create(d.log)
	if err != nil {
		return err
	}
	cmd := exec.Command(d.bin, "serve", "--config", d.config)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a kill takes its children (mkfs, blkid) with
	// it, as the crash of a container or a systemd unit does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", d.bin, err)
	}
	logf.Close()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	d.cmd, d.exited = cmd, exited
	return nil
}

// start runs a daemon and waits until it answers Probe on its socket.
func (d *daemon) start() error {
	if err := d.spawn(); err != nil {
		return err
	}
	return d.waitReady(60 * time.Second)
}

func (d *daemon) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-d.exited:
			state := d.cmd.ProcessState
			d.cmd = nil
			return fmt.Errorf("daemon exited at start-up (%s); log:\n%s", state, tail(d.log, 20))
		default:
		}
		if _, err := os.Stat(d.socket); err == nil {
			if err := d.connect(); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				resp, err := csi.NewIdentityClient(d.conn).Probe(ctx, &csi.ProbeRequest{})
				cancel()
				if err == nil && (resp.GetReady() == nil || resp.GetReady().GetValue()) {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon not serving after %v; log:\n%s", limit, tail(d.log, 20))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connect makes a new client connection: after a restart the old one
// would wait out gRPC's reconnect back-off.
func (d *daemon) connect() error {
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	d.conn, d.ctrl, d.nodeC = conn, csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	return nil
}

// kill SIGKILLs the daemon and waits until it is gone. With group, the
// programs it runs (mkfs, blkid, resize2fs) die with it, as when a
// container or a systemd unit is killed; without, they run on, as when
// the kernel's OOM killer picks the daemon alone, and the next daemon
// meets them at work.
func (d *daemon) kill(group bool) {
	if d.cmd == nil {
		return
	}
	pid := d.cmd.Process.Pid
	if group {
		pid = -pid
	}
	syscall.Kill(pid, syscall.SIGKILL)
	<-d.exited
	d.cmd = nil
}

// stop asks the daemon to shut down (SIGTERM) and waits; after 30 s it is
// killed and stop reports that.
func (d *daemon) stop() error {
	if d.cmd == nil {
		return nil
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		d.cmd = nil
		return nil
	case <-time.After(30 * time.Second):
		d.kill(true)
		return errors.New("daemon did not stop within 30s of SIGTERM; killed")
	}
}

// finding is one start-up reconciliation report of the daemon's log.
type finding struct{ Kind, Path, Detail string }

// findings reads the reconcile reports of the current process's log.
func (d *daemon) findings() []finding {
	f, err := os.Open(d.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []finding
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct {
			Msg    string `json:"msg"`
			Kind   string `json:"kind"`
			Path   string `json:"path"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "reconcile" && rec.Kind != "" {
			out = append(out, finding{rec.Kind, rec.Path, rec.Detail})
		}
	}
	return out
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// mountsUnder lists the mount points at dir or below, deepest first.
func mountsUnder(dir string) ([]string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// loopsUnder lists the loop devices whose backing file lies below dir.
func loopsUnder(dir string) ([]loop.Device, error) {
	devs, err := loop.List(context.Background())
	if err != nil {
		return nil, err
	}
	var out []loop.Device
	for _, dev := range devs {
		if strings.HasPrefix(dev.BackingFile, dir+"/") {
			out = append(out, dev)
		}
	}
	return out, nil
}

// releaseUnder unmounts everything below dir and detaches every loop
// device backed by a file below it.
func releaseUnder(t *testing.T, dir string) {
	ms, err := mountsUnder(dir)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, m := range ms {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s: %v", m, err)
		}
	}
	devs, err := loopsUnder(dir)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, dev := range devs {
		if err := loop.Detach(context.Background(), dev.Path); err != nil {
			t.Errorf("cleanup: detach %s (%s): %v", dev.Path, dev.BackingFile, err)
		}
	}
}
