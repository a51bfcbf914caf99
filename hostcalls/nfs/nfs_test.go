package nfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

func TestGrantedServer(t *testing.T) {
	roots := []string{"/var/lib/m", "192.0.2.0/24:/", "198.51.100.7:/srv/nfs", "nfs.example:/", "[fd00::/64]:/", "203.0.113.0/24", "203.0.113.5"}
	for _, tc := range []struct {
		server, export string
		want           bool
	}{
		{"192.0.2.9", "/anything", true},
		{"192.0.3.9", "/anything", false},
		{"198.51.100.7", "/srv/nfs", true},
		{"198.51.100.7", "/srv/nfs/vol", true},
		{"198.51.100.7", "/srv/nfsx", false},
		{"198.51.100.7", "/etc", false},
		{"NFS.example", "/x", true},
		{"other.example", "/x", false},
		{"fd00::3", "/x", true},
		{"/var/lib/m", "/x", false},
		// Bare addresses and prefixes are other families' roots (nfsd's
		// clients): they grant no server.
		{"203.0.113.5", "/x", false},
		{"203.0.113.9", "/x", false},
	} {
		if got := GrantedServer(roots, tc.server, tc.export); got != tc.want {
			t.Errorf("GrantedServer(%s:%s) = %v, want %v", tc.server, tc.export, got, tc.want)
		}
	}
}

func TestCheckOptions(t *testing.T) {
	if err := CheckOptions([]string{"hard", "timeo=600", "nconnect=4", "noatime", "rsize=1048576"}); err != nil {
		t.Errorf("usual options refused: %v", err)
	}
	for _, o := range []string{"vers=3", "nfsvers=4.0", "addr=10.0.0.1", "proto=udp", "soft,hard", "bind", "x-foo", "retry=5", ""} {
		if err := CheckOptions([]string{o}); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("option %q: %v, want InvalidArgument", o, err)
		}
	}
}

// Refusals come before anything is created or run.
func TestMountRefusals(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "nfs", Roots: []string{root, "192.0.2.5:/srv/nfs"}}
	for _, tc := range []struct {
		req  abi.NfsMountRequest
		want abi.Code
	}{
		{abi.NfsMountRequest{Server: "203.0.113.1", Export: "/srv/nfs", Target: root + "/m"}, abi.PermissionDenied},
		{abi.NfsMountRequest{Server: "192.0.2.5", Export: "/etc", Target: root + "/m"}, abi.PermissionDenied},
		{abi.NfsMountRequest{Server: "192.0.2.5", Export: "/srv/nfs", Target: "/mnt/m"}, abi.PermissionDenied},
		{abi.NfsMountRequest{Server: "192.0.2.5", Export: "/srv/nfs", Target: root + "/a/b"}, abi.InvalidArgument},
		{abi.NfsMountRequest{Server: "192.0.2.5", Export: "/srv/nfs", Target: root + "/m", Version: "3"}, abi.InvalidArgument},
		{abi.NfsMountRequest{Server: "192.0.2.5", Export: "/srv/nfs", Target: root + "/m", Options: []string{"vers=3"}}, abi.InvalidArgument},
		{abi.NfsMountRequest{Server: "192.0.2.5;rm", Export: "/srv/nfs", Target: root + "/m"}, abi.InvalidArgument},
		{abi.NfsMountRequest{Server: "192.0.2.5", Export: "srv", Target: root + "/m"}, abi.InvalidArgument},
	} {
		_, err := mountCall(context.Background(), env, &tc.req)
		if abi.CodeOf(err) != tc.want {
			t.Errorf("%+v: %v, want %v", tc.req, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("refused mounts left %v", ents)
	}
}

func TestUnmountNotMounted(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "nfs", Roots: []string{root}}
	if err := os.Mkdir(filepath.Join(root, "m"), 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := unmountCall(context.Background(), env, &abi.NfsTargetRequest{Target: root + "/m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "m")); !os.IsNotExist(err) {
		t.Errorf("folder left: %v", err)
	}
	if _, err := unmountCall(context.Background(), env, &abi.NfsTargetRequest{Target: root + "/m"}); err != nil {
		t.Errorf("repeat: %v", err)
	}
	if _, err := statCall(context.Background(), env, &abi.NfsTargetRequest{Target: root + "/m"}); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("stat of nothing: %v", err)
	}
}

// A call that a syscall holds returns at its bound.
func TestBounded(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	start := time.Now()
	err := bounded(context.Background(), 50*time.Millisecond, func() error { <-block; return nil })
	if !errors.Is(err, errTimeout) || time.Since(start) > 2*time.Second {
		t.Fatalf("bounded: %v after %v", err, time.Since(start))
	}
}
