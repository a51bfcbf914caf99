package modules

import (
	"context"
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// cacheFiles lists the files under dir with their modification times.
func cacheFiles(t *testing.T, dir string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[path] = info.ModTime()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCompilationCacheReuse: the first runtime writes compiled code to the
// cache folder; a second runtime (a daemon restart) loads from it and writes
// nothing new.
func TestCompilationCacheReuse(t *testing.T) {
	cache := t.TempDir()
	dir := t.TempDir()
	writeModule(t, dir, "good", fixture(t, "good"))
	writeModule(t, dir, "trap", fixture(t, "trap"))
	load := func() time.Duration {
		cfg := testConfig(dir, nil)
		cfg.CacheDir = cache
		r, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := r.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
		}()
		start := time.Now()
		if errs := r.Load(context.Background()); len(errs) != 0 {
			t.Fatal(errs)
		}
		d := time.Since(start)
		if resp, err := mustModule(t, r, "good").Call(context.Background(), abi.OpCreateVolume, []byte("cached")); err != nil || string(resp) != "cached" {
			t.Fatalf("call: %q, %v", resp, err)
		}
		return d
	}
	cold := load()
	first := cacheFiles(t, cache)
	if len(first) < 2 {
		t.Fatalf("cache holds %d files after loading 2 modules: %v", len(first), first)
	}
	warm := load()
	second := cacheFiles(t, cache)
	if len(second) != len(first) {
		t.Fatalf("second load changed the cache: %d files, then %d", len(first), len(second))
	}
	for path, mt := range first {
		if !second[path].Equal(mt) {
			t.Fatalf("second load rewrote %s instead of reusing it", path)
		}
	}
	t.Logf("load of 2 modules: cold %s, from cache %s (%d cache files)", cold, warm, len(first))
}
