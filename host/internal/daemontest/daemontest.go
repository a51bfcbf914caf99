// Package daemontest runs the wasmcsi program as a child process of a
// test, the way an operator runs it: cmd/wasmcsi built once per test
// binary, a configuration file, a temporary folder of its own for the
// socket, records, modules and pools. A test starts it, kills it with
// SIGKILL as a crash would, stops it with SIGTERM and reads its log.
// Every test of what survives a crash uses it: the kill -9 tests of host
// and the crash test in host/crashtest.
//
// It is for tests only and must never be imported by the daemon. It skips
// (never passes) a test where root, loop devices or the go command are
// missing, and it releases every mount and loop device below its folder
// when the test ends, also when it fails.
package daemontest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// EnvBinary names a built daemon to run instead of building cmd/wasmcsi
// (make crash passes the one make build wrote).
const EnvBinary = "WASMCSI_TEST_DAEMON"

// Module is one backend module the daemon serves.
type Module struct {
	Name      string
	Wasm      string // the built module file
	HostCalls []string
	// Pool makes the module's first root a pool folder of its own,
	// Dir/pools/<Name>; Roots follow it.
	Pool   bool
	Roots  []string
	Config map[string]string
}

// Options shape the daemon.
type Options struct {
	Modules []Module
	// LogFormat is the daemon's log_format: text (the default) or json.
	LogFormat string
	// Role is the daemon's role (default all); NodeID its node_id
	// (default test-node).
	Role, NodeID string
	// Wrap, when set, runs the daemon through this command prefix (a
	// network namespace of its own: nsenter ...); it must exec the daemon.
	Wrap []string
}

// Daemon is one wasmcsi process after another on the same configuration,
// records, pools and socket, as a node sees its driver come and go.
type Daemon struct {
	Dir    string // everything of the daemon lies below it
	Socket string
	State  string // the state_dir: records and node state
	// Modules are written into the configuration at every start, so a test
	// may change them between runs.
	Modules []Module
	// Clean is reconcile's clean from the next start on.
	Clean bool

	bin       string
	config    string
	logFormat string
	role      string
	nodeID    string
	wrap      []string
	cmd       *exec.Cmd
	exited    chan struct{}
	starts    int
	log       string // the log file of the current (or last) process
	conn      *grpc.ClientConn
}

// Require skips t unless it can run the daemon: root, loop devices, and a
// daemon to run (the go command to build one, or EnvBinary).
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the daemon mounts and attaches loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	if os.Getenv(EnvBinary) != "" {
		return
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command to build the daemon (or %s naming a built one): %v", EnvBinary, err)
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the daemon to run: $WASMCSI_TEST_DAEMON, or cmd/wasmcsi
// built once per test binary into a file that later builds of the same
// source tree overwrite, so that runs leave no copies behind.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", EnvBinary, p, err)
		}
		return p
	}
	binOnce.Do(func() { binPath, binErr = build() })
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func build() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), "wasmcsi-test-daemon")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// One file per source tree (worktrees of one repository build
	// different daemons), built under a name of this process and renamed:
	// test binaries of several packages build at once, and a running
	// daemon keeps the file it was started from.
	sum := sha256.Sum256([]byte(root))
	bin := filepath.Join(dir, "wasmcsi-"+hex.EncodeToString(sum[:8]))
	tmp := bin + "." + strconv.Itoa(os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, "./cmd/wasmcsi")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("build the daemon: %v\n%s", err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// moduleRoot is the folder of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: cannot build the daemon")
		}
		dir = parent
	}
}

// New lays out a daemon in a fresh temporary folder without starting it.
// When the test ends the daemon is killed, every mount and loop device
// below the folder released and the folder removed; cleanups the test
// registers later run before, while the daemon still serves.
func New(t testing.TB, o Options) *Daemon {
	t.Helper()
	Require(t)
	bin := Binary(t)
	// Short: a unix socket path is limited to 108 bytes.
	dir, err := os.MkdirTemp("", "wcsi-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{
		Dir: dir, Socket: filepath.Join(dir, "csi.sock"), State: filepath.Join(dir, "state"),
		Modules: o.Modules, bin: bin, config: filepath.Join(dir, "config.yaml"), logFormat: o.LogFormat,
		role: o.Role, nodeID: o.NodeID, wrap: o.Wrap,
	}
	if d.role == "" {
		d.role = "all"
	}
	if d.nodeID == "" {
		d.nodeID = "test-node"
	}
	if d.logFormat == "" {
		d.logFormat = "text"
	}
	t.Cleanup(func() {
		d.Kill(true)
		if d.conn != nil {
			d.conn.Close()
		}
		ReleaseUnder(t, dir)
		os.RemoveAll(dir)
	})
	for _, p := range []string{filepath.Join(dir, "modules"), filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range o.Modules {
		data, err := os.ReadFile(m.Wasm)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "modules", m.Name+".wasm"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if m.Pool {
			if err := os.MkdirAll(d.Pool(m.Name), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return d
}

// Pool is the pool folder of a module with Pool set.
func (d *Daemon) Pool(module string) string { return filepath.Join(d.Dir, "pools", module) }

// writeConfig writes the configuration an operator would write for the
// modules. The compilation cache is shared between tests, so a start
// compiles nothing after the first.
func (d *Daemon) writeConfig() error {
	var b strings.Builder
	fmt.Fprintf(&b, "endpoint: unix://%s\nnode_id: %s\nrole: %s\nstate_dir: %s\nmodule_dir: %s\ncache_dir: %s\n",
		d.Socket, d.nodeID, d.role, d.State, filepath.Join(d.Dir, "modules"), filepath.Join(os.TempDir(), "wasmcsi-test-cache"))
	fmt.Fprintf(&b, "watch_modules: false\nlog_level: info\nlog_format: %s\n", d.logFormat)
	fmt.Fprintf(&b, "reconcile:\n  clean: %t\n", d.Clean)
	if len(d.Modules) > 0 {
		fmt.Fprintf(&b, "default_backend: %s\n", d.Modules[0].Name)
	}
	b.WriteString("modules:\n")
	for _, m := range d.Modules {
		roots := slices.Clone(m.Roots)
		if m.Pool {
			roots = append([]string{d.Pool(m.Name)}, roots...)
		}
		fmt.Fprintf(&b, "  %s:\n    hostcalls: %s\n    roots: %s\n    config: {", m.Name, yamlList(m.HostCalls), yamlList(roots))
		for i, k := range slices.Sorted(maps.Keys(m.Config)) {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s: %s", strconv.Quote(k), strconv.Quote(m.Config[k]))
		}
		b.WriteString("}\n")
	}
	return os.WriteFile(d.config, []byte(b.String()), 0o644)
}

func yamlList(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// childEnv is this process's environment without what would reconfigure
// the daemon behind its configuration file's back (WASMCSI_* variables
// and CSI_ENDPOINT override the file).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WASMCSI_") && !strings.HasPrefix(kv, "CSI_ENDPOINT=") {
			env = append(env, kv)
		}
	}
	return env
}

// Spawn starts a daemon process on the current Modules without waiting
// for it to serve.
func (d *Daemon) Spawn() error {
	if d.cmd != nil {
		return errors.New("daemon already running")
	}
	if err := d.writeConfig(); err != nil {
		return err
	}
	d.starts++
	d.log = filepath.Join(d.Dir, "logs", fmt.Sprintf("start-%04d.log", d.starts))
	logf, err := os.Create(d.log)
	if err != nil {
		return err
	}
	defer logf.Close()
	argv := append(slices.Clone(d.wrap), d.bin, "serve", "--config", d.config)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own: Kill can take the daemon's children
	// (mkfs, blkid) with it, as the crash of a container or unit does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", d.bin, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	d.cmd, d.exited = cmd, exited
	return nil
}

// Start starts a daemon and waits until it answers Probe ready on its
// socket, after its start-up reconciliation.
func (d *Daemon) Start() error {
	if err := d.Spawn(); err != nil {
		return err
	}
	return d.WaitReady(60 * time.Second)
}

// WaitReady waits until the spawned daemon serves.
func (d *Daemon) WaitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-d.exited:
			state := d.cmd.ProcessState
			d.cmd = nil
			return fmt.Errorf("daemon exited at start-up (%s); log:\n%s", state, d.tail(20))
		default:
		}
		if _, err := os.Stat(d.Socket); err == nil {
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
			return fmt.Errorf("daemon not serving after %v; log:\n%s", limit, d.tail(20))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connect makes a new client connection: after a restart the old one
// would wait out gRPC's reconnect back-off.
func (d *Daemon) connect() error {
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	d.conn = conn
	return nil
}

// Kill SIGKILLs the daemon and waits until it is gone; it does nothing
// when none runs. With children, the programs it runs (mkfs, blkid,
// resize2fs) die with it, as when a container or a systemd unit is
// killed; without, they run on, as when the kernel's OOM killer picks the
// daemon alone, and the next daemon meets them at work.
func (d *Daemon) Kill(children bool) {
	if d.cmd == nil {
		return
	}
	pid := d.cmd.Process.Pid
	if children {
		pid = -pid
	}
	syscall.Kill(pid, syscall.SIGKILL)
	<-d.exited
	d.cmd = nil
}

// Stop asks the daemon to shut down (SIGTERM) and waits; after 30 s it is
// killed and Stop says so. It does nothing when none runs.
func (d *Daemon) Stop() error {
	if d.cmd == nil {
		return nil
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		d.cmd = nil
		return nil
	case <-time.After(30 * time.Second):
		d.Kill(true)
		return errors.New("daemon did not stop within 30s of SIGTERM; killed")
	}
}

// Pid is the process ID of the running daemon (0 when none runs).
func (d *Daemon) Pid() int {
	if d.cmd == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// Running reports whether a daemon process runs.
func (d *Daemon) Running() bool { return d.cmd != nil }

// Starts counts the processes started so far.
func (d *Daemon) Starts() int { return d.starts }

// Conn is the client connection to the daemon that last started.
func (d *Daemon) Conn() *grpc.ClientConn { return d.conn }

func (d *Daemon) Controller() csi.ControllerClient { return csi.NewControllerClient(d.conn) }
func (d *Daemon) Node() csi.NodeClient             { return csi.NewNodeClient(d.conn) }

// Group is a group controller client on the daemon's socket.
func (d *Daemon) Group() csi.GroupControllerClient { return csi.NewGroupControllerClient(d.conn) }

// Log returns the log lines of the current (or last) daemon process.
func (d *Daemon) Log() []string {
	f, err := os.Open(d.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func (d *Daemon) tail(n int) string {
	lines := d.Log()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// MountsUnder lists the mount points at dir or below, deepest first.
func MountsUnder(dir string) ([]string, error) {
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

// LoopsUnder lists the loop devices whose backing file lies below dir.
func LoopsUnder(dir string) ([]loop.Device, error) {
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

// ReleaseUnder unmounts everything below dir (deepest first) and detaches
// every loop device backed by a file below it.
func ReleaseUnder(t testing.TB, dir string) {
	ms, err := MountsUnder(dir)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, m := range ms {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s: %v", m, err)
		}
	}
	devs, err := LoopsUnder(dir)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, dev := range devs {
		// The device as listed: one freed meanwhile may back another
		// process's file by now.
		if err := loop.DetachBound(context.Background(), dev); err != nil {
			t.Errorf("cleanup: detach %s (%s): %v", dev.Path, dev.BackingFile, err)
		}
	}
}
