package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The configurations the layouts ship load and serve with the daemon's
// own loader and the modules their init containers install, built from
// examples/, on this machine's kernel without device-mapper, LIO or
// iscsid: the node-local daemon refuses dmthin at load with the reason
// (detaching the loop devices its pool files took) and serves localdir
// and loopfile; the iscsi controller and node daemons load iscsi with
// their grants (it checks LIO and sessions only when a volume needs
// them). Each advertises ControllerPublish exactly where its CSIDriver
// requires attachment.
//
// It takes some 20 s (module builds and compiles); -short skips it.
func TestShippedConfigsServe(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the daemon and the modules")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the daemon attaches loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices: ", err)
	}
	if _, err := os.Stat("/dev/mapper/control"); err == nil {
		t.Skip("the kernel has device-mapper: dmthin would make its pool here; the VM tier tests dmthin")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command to build the daemon: ", err)
	}
	bin := filepath.Join(t.TempDir(), "wasmcsi")
	build := exec.Command(goCmd, "build", "-o", bin, "../cmd/wasmcsi")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the daemon: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		l        layout
		workload string
		serves   []string
		refused  string // what the log says of a refused module
		attach   bool
	}{
		{layouts[0], "wasmcsi", []string{"localdir", "loopfile"}, "device-mapper is not available", false},
		{layouts[1], "wasmcsi-iscsi-controller", []string{"iscsi", "nvmeof"}, "", true},
		{layouts[1], "wasmcsi-iscsi-node", []string{"iscsi", "nvmeof"}, "", false},
	} {
		t.Run(tc.workload, func(t *testing.T) {
			t.Parallel()
			serveShipped(t, bin, tc.l, tc.workload, tc.serves, tc.refused, tc.attach)
		})
	}
}

func serveShipped(t *testing.T, bin string, l layout, workload string, serves []string, refused string, attach bool) {
	objs := readObjects(t, l.dir)
	spec := workloads(t, objs)[workload]
	d := spec.container(t, "wasmcsi")
	key := strings.TrimPrefix(d.Args[len(d.Args)-1], "/etc/wasmcsi/")
	dir := t.TempDir()
	text := strings.ReplaceAll(configMapYAML(t, l, objs, key), l.base, dir)
	text = regexp.MustCompile(`(?m)^metrics_address: .*$`).ReplaceAllString(text, `metrics_address: ""`)
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig(t, text, podEnviron(t, d))

	// What install-modules copies, built from examples/.
	if err := os.MkdirAll(cfg.ModuleDir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, mods := installedModules(t, spec.container(t, "install-modules").Command)
	for _, m := range mods {
		wasm, err := os.ReadFile(moduletest.Build(t, "../examples/"+m, moduletest.Go))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfg.ModuleDir, m+".wasm"), wasm, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	sock := filepath.Join(dir, "csi.sock")
	logFile, err := os.Create(filepath.Join(dir, "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "serve", "--config", cfgFile)
	cmd.Env = append(os.Environ(), "CSI_ENDPOINT=unix://"+sock, "WASMCSI_NODE_ID="+testNodeID)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		for _, f := range loopsUnder(t, dir) {
			t.Errorf("loop device %s still attached to %s", f[0], f[1])
			_ = exec.Command("losetup", "-d", f[0]).Run()
		}
	})
	log := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }

	// Start-up compiles the modules: allow for a loaded machine.
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(log(), "serving CSI") {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the daemon exited: %v\n%s", err, log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not serve after 3 minutes:\n%s", log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The socket may appear just after the log line: wait for it.
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	var served []string
	for k := range info.Manifest {
		if name, ok := strings.CutPrefix(k, "backend/"); ok {
			served = append(served, name)
		}
	}
	slices.Sort(served)
	if !slices.Equal(served, serves) || info.Name != cfg.DriverName {
		t.Errorf("%s serves %q, want %s serving %q\n%s", info.Name, served, cfg.DriverName, serves, log())
	}
	if refused != "" && !strings.Contains(log(), refused) {
		t.Errorf("the log does not say %q:\n%s", refused, log())
	}
	if refused == "" && strings.Contains(log(), "module refused") {
		t.Errorf("a module was refused:\n%s", log())
	}
	probe, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Errorf("Probe: %v, %v", probe, err)
	}
	if cfg.Role != config.RoleNode {
		caps, err := csi.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		publish := false
		for _, c := range caps.Capabilities {
			publish = publish || c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME
		}
		if publish != attach {
			t.Errorf("PUBLISH_UNPUBLISH_VOLUME advertised %v, the layout's CSIDriver has attachRequired: %v", publish, attach)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
	case <-time.After(time.Minute):
		t.Fatal("the daemon does not stop on SIGTERM")
	}
}

// loopsUnder lists the loop devices (device, backing file) whose backing
// file lies below dir.
func loopsUnder(t *testing.T, dir string) [][2]string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out [][2]string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if backing := strings.TrimSpace(string(b)); strings.HasPrefix(backing, dir+"/") {
			out = append(out, [2]string{"/dev/" + strings.Split(f, "/")[3], backing})
		}
	}
	return out
}
