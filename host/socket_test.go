package host_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
)

// TestSocketMode: the CSI socket is 0600 whatever the umask, or 0660 and
// owned by socket_group when one is configured, from the moment it
// appears at its path; the daemon removes it when it stops.
func TestSocketMode(t *testing.T) {
	for _, tc := range []struct {
		name, group string
		mode        uint32
	}{
		{"owner only", "", 0o600},
		{"group", "daemon", 0o660},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gid := -1
			if tc.group != "" {
				g, err := user.LookupGroup(tc.group)
				if err != nil {
					t.Skipf("no group %q on this machine: %v", tc.group, err)
				}
				gid, _ = strconv.Atoi(g.Gid)
			}
			cfg, _ := testConfig(t)
			cfg.Modules = map[string]config.Module{}
			cfg.SocketGroup = tc.group
			if err := os.MkdirAll(cfg.ModuleDir, 0o755); err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv, err := host.New(ctx, cfg, host.Options{Log: log})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx) }()
			var st unix.Stat_t
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := unix.Lstat(cfg.SocketPath(), &st)
				if err == nil {
					break
				}
				if !errors.Is(err, unix.ENOENT) || time.Now().After(deadline) {
					t.Fatalf("socket %s: %v", cfg.SocketPath(), err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
				t.Errorf("%s is not a socket: mode %o", cfg.SocketPath(), st.Mode)
			}
			if got := st.Mode & 0o7777; got != tc.mode {
				t.Errorf("socket mode %o, want %o", got, tc.mode)
			}
			if gid >= 0 && int(st.Gid) != gid {
				t.Errorf("socket group %d, want %d (%s)", st.Gid, gid, tc.group)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
			if _, err := os.Lstat(cfg.SocketPath()); !os.IsNotExist(err) {
				t.Errorf("socket still there after the daemon stopped: %v", err)
			}
		})
	}
}

// TestSocketLongPath: a socket path near the 107 bytes a unix address
// holds (Nomad's plugin folders come close) is still served, 0600 from the
// start. Binding in a private folder and renaming the socket into place
// made the bound path longer than the one asked for, and the daemon
// exited under Nomad.
func TestSocketLongPath(t *testing.T) {
	dir := t.TempDir()
	pad := 104 - len(dir) - len("/csi.sock") - 1
	if pad < 1 {
		t.Skipf("temporary folder %s is too long for this test", dir)
	}
	dir = dir + "/" + strings.Repeat("p", pad)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := dir + "/csi.sock"
	lis, err := host.ListenPrivate(path, "")
	if err != nil {
		t.Fatalf("listen on a %d-byte path: %v", len(path), err)
	}
	defer lis.Close()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o777 != 0o600 {
		t.Errorf("socket mode %o, want 600", st.Mode&0o777)
	}
}
