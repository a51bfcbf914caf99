package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"oras.land/oras-go/v2/content"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/modules"
)

// runtime is a real module runtime whose only modules are p's.
func runtimeFor(t *testing.T, p *Puller, grant ...string) *modules.Runtime {
	t.Helper()
	ctx := context.Background()
	rt, err := modules.New(ctx, modules.Config{
		Dir:      t.TempDir(),
		External: p.Files,
		Grants:   map[string]modules.Grant{"m": {HostCalls: grant}},
		HostCalls: map[string]hostcalls.Func{abi.HostCallFileCreate: {Family: "file",
			Call: func(context.Context, *hostcalls.Env, []byte) ([]byte, error) { return nil, nil }}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	if errs := rt.Load(ctx); len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	return rt
}

// serving returns what module m's backend_info answers: its version.
func serving(t *testing.T, rt *modules.Runtime) string {
	t.Helper()
	m, ok := rt.Module("m")
	if !ok {
		return "none"
	}
	out, err := m.Call(context.Background(), abi.OpInfo, nil)
	if err != nil {
		t.Fatalf("backend_info: %v", err)
	}
	return string(out)
}

func reload(t *testing.T, rt *modules.Runtime) {
	t.Helper()
	if errs := rt.Reload(context.Background()); len(errs) > 0 {
		t.Fatalf("reload: %v", errs)
	}
}

func TestSignedModuleLoads(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:1")
	manifest := r.push(t, ref, "v1", key)
	p := newPuller(t, r, t.TempDir(), Source{Name: "m", Ref: ref, Key: pub})
	if len(p.Files()) != 0 {
		t.Fatalf("files before the first sync: %v", p.Files())
	}
	if !p.Sync(context.Background(), false) {
		t.Fatalf("first sync changed nothing; log:\n%s", p.log)
	}
	rt := runtimeFor(t, p.Puller)
	if got := serving(t, rt); got != "v1" {
		t.Fatalf("serving %q, want v1", got)
	}
	if !strings.Contains(p.log.String(), "manifest="+manifest) {
		t.Errorf("log does not name manifest %s:\n%s", manifest, p.log)
	}
	if p.Sync(context.Background(), false) {
		t.Error("a second sync of an unmoved tag changed something")
	}
}

func TestDigestReference(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	manifest := r.push(t, r.ref("modules/m:1"), "v1", key)
	ref := r.ref("modules/m@" + manifest)
	p := newPuller(t, r, t.TempDir(), Source{Name: "m", Ref: ref, Key: pub})
	p.Sync(context.Background(), false)
	rt := runtimeFor(t, p.Puller)
	if got := serving(t, rt); got != "v1" {
		t.Fatalf("serving %q, want v1; log:\n%s", got, p.log)
	}
	// The tag moves; the digest does not.
	r.push(t, r.ref("modules/m:1"), "v2", key)
	if p.Sync(context.Background(), false) {
		t.Fatal("a digest reference changed when its tag moved")
	}
}

func TestTagMovedReloads(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:stable")
	r.push(t, ref, "v1", key)
	p := newPuller(t, r, t.TempDir(), Source{Name: "m", Ref: ref, Key: pub, Grant: []string{"file"}})
	p.Sync(context.Background(), false)
	rt := runtimeFor(t, p.Puller)
	if got := serving(t, rt); got != "v1" {
		t.Fatalf("serving %q, want v1", got)
	}
	v1Layer := p.sources[0].cur.Layer
	r.push(t, ref, "v2", key)
	if !p.Sync(context.Background(), false) {
		t.Fatalf("moved tag not taken up; log:\n%s", p.log)
	}
	reload(t, rt)
	if got := serving(t, rt); got != "v2" {
		t.Fatalf("serving %q after the tag moved, want v2", got)
	}
	// The serving version and the one before stay cached (a reload may
	// be reading it), no more.
	r.push(t, ref, "v3file", key)
	if !p.Sync(context.Background(), false) {
		t.Fatalf("third version not taken up; log:\n%s", p.log)
	}
	blobs, _ := os.ReadDir(p.opt.Dir + "/sha256")
	if len(blobs) != 2 {
		t.Errorf("cache holds %d modules, want 2", len(blobs))
	}
	for _, b := range blobs {
		if b.Name() == strings.TrimPrefix(v1Layer, "sha256:")+".wasm" {
			t.Error("the version two changes back is still cached")
		}
	}
}

// TestRefusedKeepsPrevious moves the tag to versions that must be refused:
// each is logged with its reason and counted, and v1 keeps serving.
func TestRefusedKeepsPrevious(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	otherKey, _ := newKey(t)
	ref := r.ref("modules/m:stable")
	v1 := r.push(t, ref, "v1", key)
	p := newPuller(t, r, t.TempDir(), Source{Name: "m", Ref: ref, Key: pub})
	p.Sync(context.Background(), false)
	rt := runtimeFor(t, p.Puller)

	cases := []struct {
		name, reason, logs string
		push               func(t *testing.T)
	}{
		{"unsigned", ReasonUnsigned, "no signature", func(t *testing.T) { r.push(t, ref, "v2", nil) }},
		{"wrong key", ReasonKey, "none verifies with key " + KeyID(pub), func(t *testing.T) { r.push(t, ref, "v2", otherKey) }},
		{"digest mismatch", ReasonDigest, "signs manifest " + v1, func(t *testing.T) {
			// v2 carries a valid signature by the right key, taken from
			// v1: it signs v1's digest, not v2's.
			v2 := r.push(t, ref, "v2", nil)
			repo, _ := PushOptions{PlainHTTP: true}.repository(mustRef(t, ref))
			payload := NewPayload(mustRef(t, ref).Repo(), v1)
			sig, err := Sign(key, payload)
			if err != nil {
				t.Fatal(err)
			}
			if err := pushSignature(context.Background(), repo, mustDigest(t, v2), payload, sig); err != nil {
				t.Fatal(err)
			}
		}},
		{"grants changed", ReasonGrants, "asks for host-call families [file]", func(t *testing.T) { r.push(t, ref, "v3file", key) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.push(t)
			if p.Sync(context.Background(), false) {
				t.Fatal("refused version taken up")
			}
			if got := p.failures("m", c.reason); got != 1 {
				t.Errorf("wasmcsi_module_verify_failures_total{module=m,reason=%s} = %v, want 1", c.reason, got)
			}
			log := p.log.String()
			if !strings.Contains(log, "module version refused; previous version keeps serving") ||
				!strings.Contains(log, "reason="+c.reason) || !strings.Contains(log, c.logs) {
				t.Errorf("no clear refusal in the log (want reason=%s and %q):\n%s", c.reason, c.logs, log)
			}
			reload(t, rt)
			if got := serving(t, rt); got != "v1" {
				t.Fatalf("serving %q, want v1 kept", got)
			}
			// Refused again for the same reason: not counted again.
			p.Sync(context.Background(), false)
			if got := p.failures("m", c.reason); got != 1 {
				t.Errorf("refused version counted again: %v", got)
			}
		})
	}
}

// TestSignedLater: a version refused unsigned is taken up once its
// signature is pushed.
func TestSignedLater(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:stable")
	r.push(t, ref, "v1", key)
	p := newPuller(t, r, t.TempDir(), Source{Name: "m", Ref: ref, Key: pub})
	p.Sync(context.Background(), false)
	r.push(t, ref, "v2", nil)
	if p.Sync(context.Background(), false) {
		t.Fatal("unsigned version taken up")
	}
	r.push(t, ref, "v2", key)
	if !p.Sync(context.Background(), false) {
		t.Fatalf("signed version not taken up; log:\n%s", p.log)
	}
}

// TestGrantedAfterRefusal: a version asking for more host calls is
// refused until the operator grants them, then it loads.
func TestGrantedAfterRefusal(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:stable")
	r.push(t, ref, "v1", key)
	cache := t.TempDir()
	p := newPuller(t, r, cache, Source{Name: "m", Ref: ref, Key: pub})
	p.Sync(context.Background(), false)
	r.push(t, ref, "v3file", key)
	p.Sync(context.Background(), false)
	if got := p.failures("m", ReasonGrants); got != 1 {
		t.Fatalf("grants refusals %v, want 1; log:\n%s", got, p.log)
	}
	// The operator grants "file" and restarts the daemon.
	p2 := newPuller(t, r, cache, Source{Name: "m", Ref: ref, Key: pub, Grant: []string{"file"}})
	if !p2.Sync(context.Background(), false) {
		t.Fatalf("granted version not taken up; log:\n%s", p2.log)
	}
	rt := runtimeFor(t, p2.Puller, "file")
	if got := serving(t, rt); got != "v3" {
		t.Fatalf("serving %q, want v3", got)
	}
}

// TestRegistryDownAtStartup: the daemon restarts while the registry is
// down; the last verified version serves from the cache.
func TestRegistryDownAtStartup(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:stable")
	r.push(t, ref, "v1", key)
	cache := t.TempDir()
	src := Source{Name: "m", Ref: ref, Key: pub}
	newPuller(t, r, cache, src).Sync(context.Background(), false)
	r.stop()

	p := newPuller(t, r, cache, src)
	if p.Sync(context.Background(), false) {
		t.Fatal("sync with the registry down changed something")
	}
	if got := p.pullFailuresOf("m"); got != 1 {
		t.Errorf("pull failures %v, want 1", got)
	}
	if !strings.Contains(p.log.String(), "last verified version keeps serving") {
		t.Errorf("log does not say the cached version serves:\n%s", p.log)
	}
	rt := runtimeFor(t, p.Puller)
	if got := serving(t, rt); got != "v1" {
		t.Fatalf("serving %q with the registry down, want the cached v1", got)
	}

	// Another key in the configuration does not trust that cache.
	_, other := newKey(t)
	if files := newPuller(t, r, cache, Source{Name: "m", Ref: ref, Key: other}).Files(); len(files) != 0 {
		t.Errorf("cache verified under another key used: %v", files)
	}
	// Nor is a cached module whose bytes changed on disk.
	for _, path := range p.Files() {
		if err := os.WriteFile(path, fixture(t, "v2"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if files := newPuller(t, r, cache, src).Files(); len(files) != 0 {
		t.Errorf("tampered cache used: %v", files)
	}
}

func TestRequestedFamilies(t *testing.T) {
	for name, want := range map[string]string{"v1": "", "v3file": "file"} {
		got, err := RequestedFamilies(fixture(t, name))
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("%s: %v, %v; want [%s]", name, got, err, want)
		}
	}
	if _, err := RequestedFamilies([]byte("not wasm")); err == nil {
		t.Error("garbage accepted")
	}
}

func mustRef(t *testing.T, s string) Ref {
	t.Helper()
	r, err := ParseRef(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustDigest(t *testing.T, s string) digest.Digest {
	t.Helper()
	d, err := digest.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestReferrerSignature: a signature attached as an OCI 1.1 referrer (no
// sha256-DIGEST.sig tag) is found and verified.
func TestReferrerSignature(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:1")
	d := mustDigest(t, r.push(t, ref, "v1", nil))
	rf := mustRef(t, ref)
	repo, err := PushOptions{PlainHTTP: true}.repository(rf)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	subject, err := repo.Resolve(ctx, d.String())
	if err != nil {
		t.Fatal(err)
	}
	payload := NewPayload(rf.Repo(), d.String())
	sig, err := Sign(key, payload)
	if err != nil {
		t.Fatal(err)
	}
	layer := content.NewDescriptorFromBytes(MediaTypeSimpleSigning, payload)
	layer.Annotations = map[string]string{AnnotationSignature: sig}
	if err := pushBlob(ctx, repo, layer, payload); err != nil {
		t.Fatal(err)
	}
	empty := []byte("{}")
	cfg := content.NewDescriptorFromBytes(ocispec.MediaTypeEmptyJSON, empty)
	if err := pushBlob(ctx, repo, cfg, empty); err != nil {
		t.Fatal(err)
	}
	man, _ := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactTypeSignature, Config: cfg, Layers: []ocispec.Descriptor{layer}, Subject: &subject,
	})
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, man)
	if err := repo.Push(ctx, md, bytes.NewReader(man)); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Resolve(ctx, SignatureTag(d)); err == nil {
		t.Fatal("the signature has a cosign tag: this test would not reach the referrers")
	}
	p := newPuller(t, r, t.TempDir(), Source{Name: "m", Ref: ref, Key: pub})
	if !p.Sync(ctx, false) {
		t.Fatalf("referrer signature not accepted; log:\n%s", p.log)
	}
}

// TestTamperedModuleRefused: a registry (here a proxy in front of it)
// that serves other bytes than the signed manifest names is refused for
// the digest, and the previous version keeps serving.
func TestTamperedModuleRefused(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:stable")
	r.push(t, ref, "v1", key)
	v2 := fixture(t, "v2")
	other := fixture(t, "v1") // same size as v2, other bytes
	if len(other) != len(v2) {
		t.Fatalf("fixtures differ in size: %d, %d", len(other), len(v2))
	}
	v2Layer := content.NewDescriptorFromBytes(MediaTypeWasmLayer, v2).Digest.String()
	target, _ := url.Parse("http://" + r.Addr)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if strings.HasSuffix(resp.Request.URL.Path, "/blobs/"+v2Layer) && resp.StatusCode == http.StatusOK {
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(other))
		}
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	proxied := strings.Replace(ref, r.Addr, strings.TrimPrefix(srv.URL, "http://"), 1)

	lb := &logBuffer{}
	reg := prometheus.NewRegistry()
	p, err := New(Options{Dir: t.TempDir(), Sources: []Source{{Name: "m", Ref: proxied, Key: pub}},
		PlainHTTP: []string{strings.TrimPrefix(srv.URL, "http://")}, Log: slog.New(slog.NewTextHandler(lb, nil)), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	tp := &puller{Puller: p, log: lb, reg: reg}
	if !p.Sync(context.Background(), false) {
		t.Fatalf("v1 not taken up; log:\n%s", lb)
	}
	r.push(t, ref, "v2", key)
	if p.Sync(context.Background(), false) {
		t.Fatal("tampered module taken up")
	}
	if got := tp.failures("m", ReasonDigest); got != 1 {
		t.Errorf("digest refusals %v, want 1; log:\n%s", got, lb)
	}
	rt := runtimeFor(t, p)
	if got := serving(t, rt); got != "v1" {
		t.Fatalf("serving %q, want v1", got)
	}
}

// TestRevertAfterLoadRefusal: a signed version the runtime refuses to load
// gives way to the version before it, on disk too (a restart serves that
// one), is counted, and is not taken up again until it changes or a
// forced Sync.
func TestRevertAfterLoadRefusal(t *testing.T) {
	r := startRegistry(t)
	key, pub := newKey(t)
	ref := r.ref("modules/m:stable")
	r.push(t, ref, "v1", key)
	cache := t.TempDir()
	src := Source{Name: "m", Ref: ref, Key: pub, Grant: []string{"file"}}
	p := newPuller(t, r, cache, src)
	p.Sync(context.Background(), false)
	v1 := p.Files()["m"]
	r.push(t, ref, "v2", key)
	if !p.Sync(context.Background(), false) {
		t.Fatalf("v2 not taken up; log:\n%s", p.log)
	}
	if !p.Revert("m", errors.New("compile: invalid module")) {
		t.Fatal("Revert found no previous version")
	}
	if got := p.Files()["m"]; got != v1 {
		t.Fatalf("after Revert the module file is %s, want v1's %s", got, v1)
	}
	if n := p.failures("m", ReasonLoad); n != 1 {
		t.Errorf("load refusals counted %v, want 1", n)
	}
	if p.Sync(context.Background(), false) {
		t.Error("the refused version was taken up again at the next interval")
	}
	// A restart reads the cache: v1.
	p2 := newPuller(t, r, cache, src)
	if got := p2.Files()["m"]; got != v1 {
		t.Fatalf("after a restart the cached module file is %s, want v1's %s", got, v1)
	}
}
