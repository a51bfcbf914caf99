// Command mkimage builds the project's container images without Docker or
// a registry, as docker-archive tarballs that `docker load`, `podman load`
// and `ctr images import` read.
//
//	mkimage wasmcsi -dockerfile deploy/Dockerfile -from bin -tag wasmcsi/wasmcsi:v1 -out bin/image/wasmcsi.tar
//	mkimage binary -tag registry.k8s.io/sig-storage/livenessprobe:v2.17.0 -file bin/livenessprobe=/livenessprobe -entrypoint /livenessprobe -out lp.tar
//
// The wasmcsi image is what deploy/Dockerfile's final stage describes, read
// from that file: Debian <suite>-slim's root filesystem with the same
// packages (built with mmdebstrap from Debian's archive, variant minbase
// with documentation left out as the slim images do), the same files
// removed, the build stage's outputs (taken from -from, where make build
// writes the same files) at the same paths, and the same entrypoint and
// command. The root filesystem is cached per package list under -cache.
//
// It is a module of its own so that go-containerregistry stays out of the
// daemon's dependencies.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every file's and the image's time: the same inputs give the
// same image.
var epoch = time.Unix(1767225600, 0).UTC() // 2026-01-01

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mkimage wasmcsi|binary [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "wasmcsi":
		err = cmdWasmcsi(os.Args[2:])
	case "binary":
		err = cmdBinary(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want wasmcsi or binary", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func cmdWasmcsi(args []string) error {
	fs := flag.NewFlagSet("wasmcsi", flag.ExitOnError)
	dockerfile := fs.String("dockerfile", "deploy/Dockerfile", "the Dockerfile whose final stage the image follows")
	from := fs.String("from", "bin", "the folder standing for the build stage's /out (make build's bin)")
	tag := fs.String("tag", "wasmcsi/wasmcsi:dev", "the image's name")
	out := fs.String("out", "bin/image/wasmcsi.tar", "the docker-archive to write")
	cache := fs.String("cache", "/var/cache/wasmcsi/image", "where root filesystems are kept per package list")
	rootfs := fs.String("rootfs", "", "a root filesystem tarball to use instead of building one (tests)")
	fs.Parse(args)

	f, err := os.Open(*dockerfile)
	if err != nil {
		return err
	}
	rt, err := parseDockerfile(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", *dockerfile, err)
	}
	base := *rootfs
	if base == "" {
		if base, err = debianRoot(rt, *cache); err != nil {
			return err
		}
	}
	img, err := wasmcsiImage(rt, base, *from)
	if err != nil {
		return err
	}
	return write(img, *tag, *out)
}

// wasmcsiImage stacks the root filesystem and the build outputs.
func wasmcsiImage(rt *runtime, rootfs, from string) (v1.Image, error) {
	baseLayer, err := tarball.LayerFromFile(rootfs)
	if err != nil {
		return nil, err
	}
	var files []file
	for _, c := range rt.Copies {
		src := filepath.Join(from, c.Src)
		if !strings.HasSuffix(c.Src, "/") {
			files = append(files, file{src: src, dst: c.Dst, mode: 0o755})
			continue
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			// What the Dockerfile builds: examples/<name> -> <name>.wasm.
			// TinyGo builds (make modules-tinygo) are not in the image.
			if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".wasm") || strings.HasSuffix(e.Name(), ".tinygo.wasm") {
				continue
			}
			files = append(files, file{src: filepath.Join(src, e.Name()), dst: path.Join(c.Dst, e.Name()), mode: 0o644})
		}
	}
	appLayer, err := filesLayer(files)
	if err != nil {
		return nil, err
	}
	return image([]v1.Layer{baseLayer, appLayer}, rt.Entrypoint, rt.Cmd)
}

type file struct {
	src, dst string
	mode     int64
}

// filesLayer is a layer holding files at their destinations, with every
// parent folder.
func filesLayer(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	sort.Slice(files, func(i, j int) bool { return files[i].dst < files[j].dst })
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.dst); d != "/" && d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.dst, "/"), Mode: f.mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

func image(layers []v1.Layer, entrypoint, cmd []string) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = "amd64"
	cf.OS = "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Cmd = cmd
	cf.Config.Env = []string{defaultPath}
	return mutate.ConfigFile(img, cf)
}

func write(img v1.Image, tag, out string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s %d bytes\n", out, tag, d, st.Size())
	return nil
}

// slimExcludes are the dpkg path filters of Debian's -slim images
// (debuerreotype's slimify): no manuals, documentation beyond copyright,
// or translations.
var slimExcludes = []string{
	"path-exclude=/usr/share/man/*",
	"path-exclude=/usr/share/groff/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/lintian/*",
	"path-exclude=/usr/share/linda/*",
	"path-exclude=/usr/share/locale/*",
	"path-include=/usr/share/locale/locale.alias",
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
}

// debianRoot builds (or finds in cache) the root filesystem tarball of the
// final stage: the suite's minbase with the packages, without recommends,
// the listed files removed.
func debianRoot(rt *runtime, cache string) (string, error) {
	args := []string{"--variant=minbase", "--mode=root", "--format=tar",
		"--aptopt=APT::Install-Recommends \"false\"",
		"--include=" + strings.Join(rt.Packages, ",")}
	for _, e := range slimExcludes {
		args = append(args, "--dpkgopt="+e)
	}
	for _, p := range rt.Remove {
		args = append(args, fmt.Sprintf("--customize-hook=rm -f \"$1%s\"", p))
	}
	args = append(args, rt.Suite)
	h := sha256.Sum256([]byte(strings.Join(args, "\n")))
	dst := filepath.Join(cache, "rootfs-"+rt.Suite+"-"+hex.EncodeToString(h[:8])+".tar")
	if _, err := os.Stat(dst); err == nil {
		fmt.Fprintln(os.Stderr, "mkimage: root filesystem from cache:", dst)
		return dst, nil
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return "", fmt.Errorf("mmdebstrap is not installed (apt-get install mmdebstrap): %w", err)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	tmp := dst + ".tmp"
	cmd := exec.Command("mmdebstrap", append(args, tmp)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", epoch.Unix()))
	fmt.Fprintln(os.Stderr, "mkimage: mmdebstrap", strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("mmdebstrap: %w", err)
	}
	return dst, os.Rename(tmp, dst)
}

type fileFlags []string

func (f *fileFlags) String() string     { return strings.Join(*f, ",") }
func (f *fileFlags) Set(s string) error { *f = append(*f, s); return nil }

// cmdBinary builds a one-layer image of static binaries (the CSI sidecars,
// built from source, as their upstream images hold one binary each).
func cmdBinary(args []string) error {
	fs := flag.NewFlagSet("binary", flag.ExitOnError)
	var files fileFlags
	fs.Var(&files, "file", "SRC=DST: a file of the image (repeatable)")
	entry := fs.String("entrypoint", "", "the entrypoint (default: the first file's DST)")
	tag := fs.String("tag", "", "the image's name")
	out := fs.String("out", "", "the docker-archive to write")
	fs.Parse(args)
	if len(files) == 0 || *tag == "" || *out == "" {
		return fmt.Errorf("binary needs -file, -tag and -out")
	}
	var fl []file
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) {
			return fmt.Errorf("-file %s: want SRC=/DST", f)
		}
		fl = append(fl, file{src: src, dst: dst, mode: 0o755})
	}
	if *entry == "" {
		*entry = fl[0].dst
	}
	layer, err := filesLayer(fl)
	if err != nil {
		return err
	}
	img, err := image([]v1.Layer{layer}, []string{*entry}, nil)
	if err != nil {
		return err
	}
	return write(img, *tag, *out)
}
