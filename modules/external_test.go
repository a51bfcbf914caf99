package modules

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// External files (the OCI puller's cache) load, reload and refuse like
// folder files; one of the same name as a folder file wins over it.
func TestExternalFiles(t *testing.T) {
	dir, ext := t.TempDir(), t.TempDir()
	writeModule(t, dir, "good", fixture(t, "good"))
	writeModule(t, ext, "v1", withCustomSection(fixture(t, "good"), "external v1"))
	writeModule(t, ext, "v2", withCustomSection(fixture(t, "good"), "external v2"))
	var mu sync.Mutex
	files := map[string]string{"good": filepath.Join(ext, "v1.wasm")}
	g := newGate()
	cfg := testConfig(dir, g)
	cfg.External = func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]string{}
		for k, v := range files {
			out[k] = v
		}
		return out
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.open(); _ = r.Close(context.Background()) })
	if errs := r.Load(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	m := mustModule(t, r, "good")
	if m.File() != filepath.Join(ext, "v1.wasm") {
		t.Fatalf("loaded %s, want the external file", m.File())
	}
	mu.Lock()
	files["good"] = filepath.Join(ext, "v2.wasm")
	mu.Unlock()
	if errs := r.Reload(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	if m2 := mustModule(t, r, "good"); m2 == m || m2.File() != filepath.Join(ext, "v2.wasm") {
		t.Fatalf("external change not reloaded: %s", m2.File())
	}
	mu.Lock()
	files["Bad Name"] = filepath.Join(ext, "v1.wasm")
	files["rel"] = "v1.wasm"
	mu.Unlock()
	errs := r.Reload(context.Background())
	if err := errs["Bad Name"]; err == nil || !strings.Contains(err.Error(), "name must match") {
		t.Errorf("bad name: %v", err)
	}
	if err := errs["rel"]; err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Errorf("relative path: %v", err)
	}
}

// A module whose config names a registry source never loads from a folder
// file of its name, also while the registry has given no verified version
// yet: an unsigned file must not stand in for a signed one.
func TestExternalOnlyIgnoresFolderFile(t *testing.T) {
	dir := t.TempDir()
	writeModule(t, dir, "good", fixture(t, "good"))
	g := newGate()
	cfg := testConfig(dir, g)
	cfg.External = func() map[string]string { return map[string]string{} }
	cfg.ExternalOnly = map[string]bool{"good": true}
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.open(); _ = r.Close(context.Background()) })
	r.Load(context.Background())
	if m, ok := r.Module("good"); ok {
		t.Fatalf("the folder file %s loaded for a module that comes from a registry", m.File())
	}
}
