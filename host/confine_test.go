package host_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

// TestStageConfinedToRoots: whatever the escape fixture's node_stage names
// — a directory outside its roots, a link inside them that leads out, a
// device that is not a block device, a loop device over a file outside its
// roots — the host refuses it with INTERNAL, mounts nothing, formats
// nothing and keeps no stage record. The same module naming a directory or
// a loop device its roots do explain is staged (one mount), so the
// refusals are the confinement's and not the fixture's.
func TestStageConfinedToRoots(t *testing.T) {
	requireRoot(t)
	w := workDir(t) // granted as a root, so "<staging>-src" can lie inside it
	d := startDaemon(t, daemonOptions{backend: "escape", wasm: filepath.Join("testdata", "escape.wasm"), extraRoots: []string{w}})
	if err := os.MkdirAll(filepath.Join(w, "staging"), 0o755); err != nil {
		t.Fatal(err)
	}

	// Devices: one over a file outside every root, one over a file inside.
	outsideDev, outsideFile := looptest.Device(t, 32<<20)
	insideFile := filepath.Join(w, "inside.img")
	if err := os.WriteFile(insideFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(insideFile, 32<<20); err != nil {
		t.Fatal(err)
	}
	inside, err := loop.Attach(context.Background(), insideFile, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.DetachBound(context.Background(), inside); err != nil {
			t.Errorf("detach %s: %v", inside.Path, err)
		}
	})
	t.Cleanup(func() { unmountAll(t, w) }) // before the detaches

	cases := []struct {
		name string // its first letter picks what node_stage answers
		// src, when set, is what "<staging path>-src" is made to be: a
		// directory ("dir") or a symlink to the given path.
		src   string
		words []string // "" words: staging succeeds
	}{
		{name: "abs-etc", words: []string{"outside its roots"}},
		{name: "s-link-out", src: "/etc", words: []string{"resolves outside"}},
		{name: "d-not-block", src: "/dev/null", words: []string{"not a block device"}},
		{name: "d-loop-outside", src: outsideDev, words: []string{"grants do not explain"}},
		{name: "s-dir-inside", src: "dir"},
		{name: "d-loop-inside", src: inside.Path},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := callCtx(t)
			v := createVolume(t, d, &csi.CreateVolumeRequest{Name: c.name})
			staging := filepath.Join(w, "staging", c.name)
			switch c.src {
			case "":
			case "dir":
				if err := os.Mkdir(staging+"-src", 0o755); err != nil {
					t.Fatal(err)
				}
			default:
				if err := os.Symlink(c.src, staging+"-src"); err != nil {
					t.Fatal(err)
				}
			}
			before := len(mountsUnder(t, w))
			_, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: rwCap})
			if len(c.words) == 0 {
				if err != nil {
					t.Fatalf("NodeStage of storage inside the roots: %v", err)
				}
				if n := mountsAt(t, staging); n != 1 {
					t.Errorf("%d mounts at the staging path, want 1", n)
				}
				if _, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging}); err != nil {
					t.Fatal(err)
				}
				if n := mountsAt(t, staging); n != 0 {
					t.Errorf("%d mounts at the staging path after unstage", n)
				}
				return
			}
			wantCode(t, err, codes.Internal, append([]string{"escape"}, c.words...)...)
			if after := mountsUnder(t, w); len(after) != before {
				t.Errorf("mounts changed by a refused stage: %v", after)
			}
			_, err = d.node().NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: v.GetVolumeId()})
			wantCode(t, err, codes.NotFound)
		})
	}
	// The refused device was never formatted.
	head := make([]byte, 1<<20)
	f, err := os.Open(outsideFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(head, make([]byte, len(head))) {
		t.Error("the device outside the roots was written to")
	}
}
