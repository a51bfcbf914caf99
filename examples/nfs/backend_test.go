//go:build !wasip1

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/hostcalls/nfsd"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// controller configures a server-mode controller natively against the
// real dir and nfsd host calls; the export records go to a temporary
// folder and exportfs is recorded, not run.
func controller(t *testing.T) (*Backend, *nfsd.Server, string) {
	t.Helper()
	dir := t.TempDir()
	pool := filepath.Join(dir, "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &nfsd.Server{Dir: filepath.Join(dir, "exports.d"), Etab: filepath.Join(dir, "etab"), Threads: filepath.Join(dir, "threads"),
		Run: func(context.Context, ...string) error { return nil }}
	calls, err := catalog.New(catalog.Options{Exports: s})
	if err != nil {
		t.Fatal(err)
	}
	roots := []string{pool, "192.0.2.0/24"}
	hostcall.SetHost(moduletest.RealHost(calls, roots))
	t.Cleanup(func() { hostcall.SetHost(nil) })
	b := New()
	if err := b.Configure(&abi.ConfigureRequest{Roots: roots, Role: "controller", Config: map[string]string{"server": "192.0.2.5", "quota": "off"}}); err != nil {
		t.Fatal(err)
	}
	return b, s, pool
}

func rwx() []abi.Capability {
	return []abi.Capability{{AccessMode: abi.AccessMultiNodeMultiWriter}}
}

// Publishing adds exactly the node's address to the volume's own export;
// unpublishing takes it away; deleting withdraws the export before the
// folder goes.
func TestServerModePublishFences(t *testing.T) {
	b, s, pool := controller(t)
	v, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "pvc-1", RequiredBytes: 1 << 20, Capabilities: rwx(), Parameters: map[string]string{"mode": "server"}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(pool, v.LocalID)
	if v.Context[ctxExport] != path || v.Context[ctxServer] != "192.0.2.5" || v.Context[ctxCapacity] != "advisory" || len(v.Topology) != 0 {
		t.Fatalf("create: %+v", v)
	}
	exports := func() []nfsd.Export {
		e, err := s.Load("native")
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if e := exports(); len(e) != 1 || e[0].Path != path || len(e[0].Clients) != 0 {
		t.Fatalf("exports after create: %+v", e)
	}
	ref := abi.VolumeRef{LocalID: v.LocalID, Context: v.Context}
	for _, node := range []string{"192.0.2.10", "192.0.2.11"} {
		pub, err := b.ControllerPublish(&abi.ControllerPublishRequest{Volume: ref, NodeID: node, NodeContext: map[string]string{NodeContextClient: node}})
		if err != nil {
			t.Fatal(err)
		}
		if pub.PublishContext[pubExport] != path || pub.PublishContext[pubServer] != "192.0.2.5" {
			t.Fatalf("publish context %v", pub.PublishContext)
		}
	}
	if e := exports(); len(e[0].Clients) != 2 {
		t.Fatalf("exports after two publications: %+v", e)
	}
	if err := b.ControllerUnpublish(&abi.ControllerUnpublishRequest{Volume: ref, NodeID: "n", NodeContext: map[string]string{NodeContextClient: "192.0.2.10"}}); err != nil {
		t.Fatal(err)
	}
	if e := exports(); len(e[0].Clients) != 1 || e[0].Clients[0].Address != "192.0.2.11" {
		t.Fatalf("exports after fencing 192.0.2.10: %+v", e)
	}
	// A node outside the granted client addresses is never exported to.
	if _, err := b.ControllerPublish(&abi.ControllerPublishRequest{Volume: ref, NodeID: "x", NodeContext: map[string]string{NodeContextClient: "198.51.100.1"}}); abi.CodeOf(err) != abi.PermissionDenied {
		t.Errorf("publish to an address outside the roots: %v", err)
	}
	if _, err := b.ControllerPublish(&abi.ControllerPublishRequest{Volume: ref, NodeID: "y"}); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Errorf("publish to a node without an address: %v", err)
	}
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref}); err != nil {
		t.Fatal(err)
	}
	if e := exports(); len(e) != 0 {
		t.Fatalf("exports after delete: %+v", e)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("folder after delete: %v", err)
	}
	if err := b.DeleteVolume(&abi.DeleteVolumeRequest{Volume: ref}); err != nil {
		t.Errorf("repeated delete: %v", err)
	}
}

func TestBadInputCreatesNothing(t *testing.T) {
	b, s, pool := controller(t)
	for _, tc := range []struct {
		params map[string]string
		caps   []abi.Capability
		want   string
	}{
		{map[string]string{"mode": "magic"}, rwx(), "mode"},
		{map[string]string{"mode": "server", "share": "/x"}, rwx(), "share"},
		{map[string]string{"mode": "client", "server": "192.0.2.9"}, rwx(), "share"},
		{nil, []abi.Capability{{Block: true, AccessMode: abi.AccessMultiNodeMultiWriter}}, "block"},
		// The controller has no mounts folder: client mode cannot work here.
		{map[string]string{"mode": "client", "server": "192.0.2.9", "share": "/srv"}, rwx(), "mounts"},
	} {
		_, err := b.CreateVolume(&abi.CreateVolumeRequest{Name: "bad", RequiredBytes: 1 << 20, Capabilities: tc.caps, Parameters: tc.params})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %+v: %v, want an error naming %q", tc.params, tc.caps, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(pool); len(ents) != 0 {
		t.Errorf("pool after refusals: %v", ents)
	}
	if e, _ := s.Load("native"); len(e) != 0 {
		t.Errorf("exports after refusals: %+v", e)
	}
}
