package modules

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// A folder may hold a standard-Go and a TinyGo build of one module; the
// runtime serves one of them as the module, per PreferTinyGo.
func TestPreferTinyGo(t *testing.T) {
	std := fixture(t, "good")
	tiny := withCustomSection(std, "tinygo build")
	for _, tc := range []struct {
		name   string
		prefer bool
		files  map[string][]byte
		want   []byte
	}{
		{"both, standard preferred", false, map[string][]byte{"good": std, "good.tinygo": tiny}, std},
		{"both, tinygo preferred", true, map[string][]byte{"good": std, "good.tinygo": tiny}, tiny},
		{"only tinygo, standard preferred", false, map[string][]byte{"good.tinygo": tiny}, tiny},
		{"only standard, tinygo preferred", true, map[string][]byte{"good": std}, std},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, errs := startRuntime(t, nil, nil, func(c *Config) {
				c.PreferTinyGo = tc.prefer
				for name, data := range tc.files {
					writeModule(t, c.Dir, name, data)
				}
			})
			if len(errs) != 0 {
				t.Fatalf("load errors: %v", errs)
			}
			if got := len(r.Modules()); got != 1 {
				t.Fatalf("%d modules loaded, want 1", got)
			}
			m := mustModule(t, r, "good")
			if want := digestOf(tc.want); m.Digest() != want {
				t.Fatalf("served digest %s, want %s", m.Digest(), want)
			}
		})
	}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
