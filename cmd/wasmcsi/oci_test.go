package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/modules/oci/ocitest"
)

// TestPushAndServeFromRegistry follows "Publishing and pulling signed
// modules" (docs/authoring.md): keygen, push, a daemon configured with the
// reference and the public key serves the module; restarted while the
// registry is down, it serves the cached version.
func TestPushAndServeFromRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds an example module and a registry")
	}
	dir := t.TempDir()
	buildExample(t, dir, "localdir")
	t.Chdir(dir)
	reg := ocitest.Start(t)
	ref := reg.Ref("wasmcsi/localdir:1.0")

	var out bytes.Buffer
	if err := run([]string{"modules", "keygen", "signer"}, &out); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"modules", "keygen", "signer"}, &out); err == nil {
		t.Error("keygen replaced an existing key")
	}
	if st, err := os.Stat("signer.key"); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("signer.key: %v, %v; want mode 0600", st, err)
	}
	if err := run([]string{"modules", "push", "localdir.wasm", ref}, &out); err == nil {
		t.Error("push without --key or --unsigned accepted")
	}
	out.Reset()
	if err := run([]string{"modules", "push", "localdir.wasm", ref, "--key", "signer.key", "--plain-http"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "signed by key") {
		t.Errorf("push says %q", out.String())
	}

	// The artifact follows the CNCF wasm layout and carries the module's
	// description.
	req, _ := http.NewRequest("GET", "http://"+reg.Addr+"/v2/wasmcsi/localdir/manifests/1.0", nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var man struct {
		Config struct {
			MediaType string `json:"mediaType"`
		} `json:"config"`
		Layers []struct {
			MediaType string `json:"mediaType"`
		} `json:"layers"`
		Annotations map[string]string `json:"annotations"`
	}
	err = json.NewDecoder(resp.Body).Decode(&man)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if man.Config.MediaType != "application/vnd.wasm.config.v0+json" || len(man.Layers) != 1 || man.Layers[0].MediaType != "application/wasm" {
		t.Errorf("not the CNCF wasm layout: %+v", man)
	}
	if a := man.Annotations; a["dev.wasmcsi.module.name"] != "localdir" || a["dev.wasmcsi.module.hostcalls"] != "dir" || a["dev.wasmcsi.module.abi"] == "" || a["org.opencontainers.image.version"] == "" {
		t.Errorf("annotations %v", a)
	}

	conf := filepath.Join(dir, "wasmcsi.yaml")
	if err := os.WriteFile(conf, []byte(`
module_dir: `+filepath.Join(dir, "empty")+`
state_dir: `+filepath.Join(dir, "state")+`
cache_dir: ""
oci:
  key: signer.pub
  plain_http: ["`+reg.Addr+`"]
modules:
  localdir:
    source: `+ref+`
    hostcalls: [dir]
    roots: [`+filepath.Join(dir, "pool")+`]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	start := func() (*bytes.Buffer, *host.Server) {
		t.Helper()
		fs := pflag.NewFlagSet("wasmcsi", pflag.ContinueOnError)
		config.Flags(fs)
		if err := fs.Parse([]string{"--config", conf}); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(fs, nil)
		if err != nil {
			t.Fatal(err)
		}
		logs := &bytes.Buffer{}
		srv, err := host.New(context.Background(), cfg, host.Options{Log: slog.New(slog.NewTextHandler(logs, nil)), NoRecords: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close(context.Background()) })
		return logs, srv
	}
	logs, srv := start()
	if b := srv.Backends(); strings.Join(b, ",") != "localdir" || !strings.Contains(logs.String(), "module version verified") {
		t.Fatalf("backends %v; log:\n%s", b, logs)
	}

	// The tag moves to another build (the same module with its description
	// section written); a reload (SIGHUP) takes it up.
	if err := run([]string{"modules", "inspect", "--write", "localdir.wasm"}, &out); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(must(os.ReadFile("localdir.wasm")))
	if err := run([]string{"modules", "push", "localdir.wasm", ref, "--key", "signer.key", "--plain-http"}, &out); err != nil {
		t.Fatal(err)
	}
	srv.Reload(context.Background())
	if d := strings.Join(srv.Describe(), "\n"); !strings.Contains(d, hex.EncodeToString(sum[:])) {
		t.Fatalf("moved tag not served after reload: %s\nlog:\n%s", d, logs)
	}

	// Without a signal, the tag is resolved again every interval.
	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan struct{})
	go func() { srv.WatchRegistries(ctx, 100*time.Millisecond); close(watching) }()
	third := append(must(os.ReadFile("localdir.wasm")), 0, 2, 1, 'x') // an extra custom section "x"
	if err := os.WriteFile("localdir.wasm", third, 0o644); err != nil {
		t.Fatal(err)
	}
	sum = sha256.Sum256(third)
	if err := run([]string{"modules", "push", "localdir.wasm", ref, "--key", "signer.key", "--plain-http"}, &out); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(strings.Join(srv.Describe(), "\n"), hex.EncodeToString(sum[:])); {
		if time.Now().After(deadline) {
			cancel()
			<-watching
			t.Fatalf("moved tag not served 20s later: %s\nlog:\n%s", srv.Describe(), logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-watching
	srv.Close(context.Background())

	reg.Stop()
	logs, srv = start()
	if b := srv.Backends(); strings.Join(b, ",") != "localdir" || !strings.Contains(logs.String(), "last verified version keeps serving") {
		t.Fatalf("registry down: backends %v; log:\n%s", b, logs)
	}
	if d := strings.Join(srv.Describe(), "\n"); !strings.Contains(d, hex.EncodeToString(sum[:])) {
		t.Fatalf("registry down: not the last verified version: %s", d)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
