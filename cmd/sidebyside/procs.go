package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const hostpathRepo = "csi-driver-host-path"

// buildHostpath returns the reference driver's binary, building it once per
// version into the cache folder, or why it cannot.
func buildHostpath(ctx context.Context, cfg config) (bin, skip string) {
	tars, _ := filepath.Glob(filepath.Join(cfg.thirdparty, hostpathRepo+"-*.tar.gz"))
	if len(tars) == 0 {
		return "", fmt.Sprintf("no %s-<version>.tar.gz (source with vendor/; the module proxy refuses it) in %s: set WASMCSI_THIRDPARTY", hostpathRepo, cfg.thirdparty)
	}
	sort.Strings(tars)
	tarball := tars[len(tars)-1]
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(tarball), hostpathRepo+"-"), ".tar.gz")
	dir := filepath.Join(cfg.cache, "hostpath-"+version)
	bin = filepath.Join(dir, "hostpathplugin")
	if _, err := os.Stat(bin); err == nil {
		return bin, ""
	}
	fmt.Printf("sidebyside: building hostpathplugin %s into %s (once)\n", version, dir)
	src, err := os.MkdirTemp("", "wasmcsi-hostpath-src.")
	if err != nil {
		return "", err.Error()
	}
	defer os.RemoveAll(src)
	if out, err := exec.CommandContext(ctx, "tar", "-xzf", tarball, "-C", src, "--strip-components=1").CombinedOutput(); err != nil {
		return "", fmt.Sprintf("unpacking %s: %v: %s", tarball, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err.Error()
	}
	tmp := bin + ".tmp"
	build := exec.CommandContext(ctx, envOr("GO", "go"), "build", "-trimpath", "-o", tmp, "./cmd/hostpathplugin")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=vendor", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Sprintf("building it from %s: %v: %s", tarball, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err.Error()
	}
	return bin, ""
}

// start runs a plugin in the background with its output in a log file and
// waits for its socket. The plugin dies with this process even if this one
// is killed before its teardown runs.
func start(ctx context.Context, name, dir, sock string, env []string, argv ...string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return cmd, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("%s exited before serving:\n%s", name, tail(log.Name()))
		case <-ctx.Done():
			return cmd, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return cmd, fmt.Errorf("%s did not serve %s within 2 minutes:\n%s", name, sock, tail(log.Name()))
		}
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// startWasmcsi serves bin/wasmcsi with the embedded configuration in a
// folder of the work folder: its relative paths (socket, records, pools)
// land there, on the work folder's filesystem.
func startWasmcsi(ctx context.Context, repo, work string) (*driver, *exec.Cmd, error) {
	dir := filepath.Join(work, "wasmcsi")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, nil, err
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CSI_ENDPOINT=") && !strings.HasPrefix(kv, "WASMCSI_") {
			env = append(env, kv)
		}
	}
	// The embedded configuration's one global name.
	env = append(env, fmt.Sprintf("WASMCSI_MODULES__DMTHIN__CONFIG__POOL=wasmcsi-thin-sidebyside-%d", os.Getpid()))
	sock := filepath.Join(dir, "run", "csi.sock")
	cmd, err := start(ctx, "wasmcsi", dir, sock, env,
		filepath.Join(repo, "bin", "wasmcsi"), "serve", "--module_dir", filepath.Join(repo, "bin", "modules"))
	if err != nil {
		return nil, cmd, err
	}
	d, err := newDriver("wasmcsi", sock, dir, map[string]string{"wasmcsi.dev/backend": "localdir"})
	return d, cmd, err
}

func startHostpath(ctx context.Context, bin, work string) (*driver, *exec.Cmd, error) {
	dir := filepath.Join(work, "hostpath")
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o750); err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(dir, "csi.sock")
	cmd, err := start(ctx, "hostpath", dir, sock, os.Environ(), bin,
		"--endpoint", "unix://"+sock, "--nodeid", "sidebyside", "--drivername", "hostpath.csi.k8s.io",
		"--statedir", filepath.Join(dir, "state"))
	if err != nil {
		return nil, cmd, err
	}
	d, err := newDriver("hostpath", sock, dir, nil)
	return d, cmd, err
}

// teardown stops the plugins, unmounts whatever is mounted below the work
// folder (deepest first), detaches the loop devices of its files and
// removes it — never through a mount.
func teardown(work string, procs []*exec.Cmd) error {
	for _, p := range procs {
		if p.Process == nil {
			continue
		}
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() {
			for p.ProcessState == nil && p.Process.Signal(syscall.Signal(0)) == nil {
				time.Sleep(50 * time.Millisecond)
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			p.Process.Kill()
		}
	}
	var errs []error
	for _, m := range mountsUnder(work) {
		if err := unix.Unmount(m, 0); err != nil {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
			}
		}
	}
	if left := mountsUnder(work); len(left) > 0 {
		return errors.Join(append(errs, fmt.Errorf("teardown left mounts under %s: %v", work, left))...)
	}
	// Loop devices of volumes or floor images an interrupt left attached.
	if err := detachLoops(work); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(work); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var ms []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) < 5 {
			continue
		}
		// Octal escapes (\040 for a space) do not occur in the paths made here.
		if m := fs[4]; m == dir || strings.HasPrefix(m, dir+"/") {
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	return ms
}
