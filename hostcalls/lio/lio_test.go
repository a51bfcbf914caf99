package lio

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/iscsi"
)

const (
	testPrefix = "iqn.2024-01.dev.wasmcsi:test."
	testNames  = "wcsitest-"
)

func TestNewChecksConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{IQNPrefix: testPrefix, NamePrefix: testNames}, true},
		{"explicit root", Config{Root: "/x/target/", IQNPrefix: "iqn.2024-01.dev.wasmcsi:", NamePrefix: "a"}, true},
		{"relative root", Config{Root: "target", IQNPrefix: testPrefix, NamePrefix: testNames}, false},
		{"no IQN prefix", Config{NamePrefix: testNames}, false},
		{"IQN prefix not an IQN", Config{IQNPrefix: "wasmcsi", NamePrefix: testNames}, false},
		{"IQN prefix upper case", Config{IQNPrefix: "iqn.2024-01.DEV.wasmcsi:", NamePrefix: testNames}, false},
		{"no name prefix", Config{IQNPrefix: testPrefix}, false},
		{"name prefix with slash", Config{IQNPrefix: testPrefix, NamePrefix: "a/b"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(tc.cfg)
			if tc.ok != (err == nil) {
				t.Fatalf("New = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && abi.CodeOf(err) != abi.InvalidArgument {
				t.Fatalf("code %v, want INVALID_ARGUMENT", abi.CodeOf(err))
			}
			if err == nil && c.cfg.Root == "" {
				t.Fatal("root not defaulted")
			}
		})
	}
}

// newTest returns a Configfs on root (a temp dir without LIO unless given).
func newTest(t *testing.T, root string) *Configfs {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	c, err := New(Config{Root: root, IQNPrefix: testPrefix, NamePrefix: testNames})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRequestsAreCheckedBeforeLIO runs every entry point with bad or
// ungranted arguments; none may reach configfs (the root here is an empty
// folder, which would answer FAILED_PRECONDITION).
func TestRequestsAreCheckedBeforeLIO(t *testing.T) {
	c := newTest(t, "")
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(file, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(t.TempDir(), "odd")
	if err := os.WriteFile(odd, make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	good := LUN{Target: testPrefix + "t1", LUN: 0, Backstore: Backstore{Kind: FileIO, Name: testNames + "a", Path: file}, Portals: []string{"127.0.0.1:3260"}}
	with := func(f func(*LUN)) LUN { l := good; f(&l); return l }
	tests := []struct {
		name string
		call func() error
		code abi.Code
	}{
		{"target outside prefix", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Target = "iqn.2024-01.dev.other:t1" }))
		}, abi.PermissionDenied},
		{"target is the bare prefix", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Target = "iqn.2024-01.dev.wasmcsi:test" }))
		}, abi.PermissionDenied},
		{"target not an IQN", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Target = testPrefix + "T1" }))
		}, abi.InvalidArgument},
		{"LUN out of range", func() error { return c.CreateLUN(ctx, with(func(l *LUN) { l.LUN = 256 })) }, abi.InvalidArgument},
		{"negative LUN", func() error { return c.CreateLUN(ctx, with(func(l *LUN) { l.LUN = -1 })) }, abi.InvalidArgument},
		{"no portals", func() error { return c.CreateLUN(ctx, with(func(l *LUN) { l.Portals = nil })) }, abi.InvalidArgument},
		{"host name portal", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Portals = []string{"storage:3260"} }))
		}, abi.InvalidArgument},
		{"backstore outside prefix", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Name = "other-a" }))
		}, abi.PermissionDenied},
		{"backstore name with slash", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Name = testNames + "a/../b" }))
		}, abi.InvalidArgument},
		{"unknown kind", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Kind = "rd_mcp" }))
		}, abi.InvalidArgument},
		{"relative path", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Path = "img" }))
		}, abi.InvalidArgument},
		{"unclean path", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Path = filepath.Dir(file) + "/./img" }))
		}, abi.InvalidArgument},
		{"comma in path", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Path = file + ",fd_dev_size=1" }))
		}, abi.InvalidArgument},
		{"missing file", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Path = file + "x" }))
		}, abi.NotFound},
		{"file as block", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Kind = Block }))
		}, abi.InvalidArgument},
		{"directory as fileio", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Path = filepath.Dir(file) }))
		}, abi.InvalidArgument},
		{"fileio size not sector aligned", func() error {
			return c.CreateLUN(ctx, with(func(l *LUN) { l.Backstore.Path = odd }))
		}, abi.InvalidArgument},
		{"grant to a bad initiator", func() error { return c.Grant(ctx, good.Target, 0, "initiator", nil) }, abi.InvalidArgument},
		{"grant with a short CHAP secret", func() error {
			return c.Grant(ctx, good.Target, 0, "iqn.1993-08.org.debian:01:x", &iscsi.CHAP{User: "u", Secret: "short"})
		}, abi.InvalidArgument},
		{"revoke outside prefix", func() error {
			return c.Revoke(ctx, "iqn.2024-01.dev.other:t1", 0, "iqn.1993-08.org.debian:01:x")
		}, abi.PermissionDenied},
		{"delete LUN outside prefix", func() error { return c.DeleteLUN(ctx, "iqn.2024-01.dev.other:t1", 0) }, abi.PermissionDenied},
		{"delete target outside prefix", func() error { return c.DeleteTarget(ctx, "iqn.2024-01.dev.other:t1") }, abi.PermissionDenied},
		{"delete backstore outside prefix", func() error { return c.DeleteBackstore(ctx, FileIO, "other") }, abi.PermissionDenied},
		{"resize to an odd size", func() error { return c.ResizeFileIO(ctx, testNames+"a", 1000) }, abi.InvalidArgument},
		{"LIO absent", func() error { return c.CreateLUN(ctx, good) }, abi.FailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); abi.CodeOf(err) != tc.code {
				t.Fatalf("err = %v, want %v", err, tc.code)
			}
		})
	}
	if ents, _ := os.ReadDir(c.cfg.Root); len(ents) != 0 {
		t.Fatalf("refused requests wrote %d entries under the root", len(ents))
	}
}

func TestPortalName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"127.0.0.1", "127.0.0.1:3260"},
		{"192.0.2.1:3261", "192.0.2.1:3261"},
		{"0.0.0.0:3260", "0.0.0.0:3260"},
		{"[::]:3260", "[::]:3260"},
		{"[fd00::1]", "[fd00::1]:3260"},
		{"0.0.0.0:0", ""},
		{"host:3260", ""},
	}
	for _, tc := range tests {
		got, err := portalName(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("portalName(%q) = %q, want error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("portalName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
