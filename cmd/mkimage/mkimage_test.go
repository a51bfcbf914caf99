package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The image built without Docker follows deploy/Dockerfile's final stage,
// which this reads: the slim Debian base, its packages, the initiator name
// removed, the daemon and modules where the manifests expect them, and the
// entrypoint.
func TestDockerfileFinalStage(t *testing.T) {
	f, err := os.Open("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rt, err := parseDockerfile(f)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Suite != "bookworm" {
		t.Errorf("suite %s", rt.Suite)
	}
	for _, p := range []string{"e2fsprogs", "xfsprogs", "util-linux", "open-iscsi"} {
		if !slices.Contains(rt.Packages, p) {
			t.Errorf("packages %v lack %s", rt.Packages, p)
		}
	}
	if !slices.Equal(rt.Remove, []string{"/etc/iscsi/initiatorname.iscsi"}) {
		t.Errorf("removed %v", rt.Remove)
	}
	want := []copyOp{{"wasmcsi", "/usr/local/bin/wasmcsi"}, {"modules/", "/opt/wasmcsi/modules/"}}
	if !slices.Equal(rt.Copies, want) {
		t.Errorf("copies %v, want %v", rt.Copies, want)
	}
	if !slices.Equal(rt.Entrypoint, []string{"/usr/local/bin/wasmcsi"}) || !slices.Equal(rt.Cmd, []string{"serve"}) {
		t.Errorf("entrypoint %q cmd %q", rt.Entrypoint, rt.Cmd)
	}
}

// A final stage the builder would not reproduce is refused, not ignored.
func TestDockerfileUnknownRefused(t *testing.T) {
	base := "FROM golang AS build\nRUN go build\nFROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y --no-install-recommends e2fsprogs\nENTRYPOINT [\"/x\"]\n"
	if _, err := parseDockerfile(strings.NewReader(base)); err != nil {
		t.Fatal(err)
	}
	for _, extra := range []string{
		"RUN useradd csi\n",
		"RUN apt-get install -y --no-install-recommends -t bookworm-backports xfsprogs\n",
		"USER 1000\n",
		"ENV FOO=bar\n",
		"COPY examples /examples\n",
		"RUN rm -f /etc/*.conf\n",
	} {
		if _, err := parseDockerfile(strings.NewReader(base + extra)); err == nil {
			t.Errorf("%q accepted", extra)
		}
	}
	if _, err := parseDockerfile(strings.NewReader("FROM alpine:3\nENTRYPOINT [\"/x\"]\n")); err == nil {
		t.Error("a non-Debian final stage accepted")
	}
}

// The archive holds the root filesystem, then the build outputs at the
// Dockerfile's paths (TinyGo builds left out), with its entrypoint, under
// the given name, readable as a docker-archive.
func TestWasmcsiImage(t *testing.T) {
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs.tar")
	var rb bytes.Buffer
	tw := tar.NewWriter(&rb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "usr/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin-marker", Mode: 0o644, Size: 2})
	tw.Write([]byte("ok"))
	tw.Close()
	if err := os.WriteFile(rootfs, rb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(dir, "bin")
	os.MkdirAll(filepath.Join(from, "modules"), 0o755)
	for f, content := range map[string]string{"wasmcsi": "daemon", "modules/localdir.wasm": "l", "modules/loopfile.wasm": "f", "modules/localdir.tinygo.wasm": "t"} {
		if err := os.WriteFile(filepath.Join(from, f), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, _ := os.Open("../../deploy/Dockerfile")
	rt, err := parseDockerfile(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	img, err := wasmcsiImage(rt, rootfs, from)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	if err := write(img, "wasmcsi/wasmcsi:t1", out); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("wasmcsi/wasmcsi:t1")
	back, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, rt.Entrypoint) || !slices.Equal(cf.Config.Cmd, rt.Cmd) || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config %+v", cf.Config)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("%d layers, %v", len(layers), err)
	}
	got := map[string]string{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			got[h.Name] = string(b)
		}
		rc.Close()
	}
	want := map[string]string{"usr/": "", "usr/bin-marker": "ok", "usr/local/": "", "usr/local/bin/": "", "usr/local/bin/wasmcsi": "daemon",
		"opt/": "", "opt/wasmcsi/": "", "opt/wasmcsi/modules/": "", "opt/wasmcsi/modules/localdir.wasm": "l", "opt/wasmcsi/modules/loopfile.wasm": "f"}
	if len(got) != len(want) {
		t.Errorf("files %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}
