package sdk

import (
	"errors"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestNameID(t *testing.T) {
	for _, pair := range [][2]string{{"pvc-1", "pvc-2"}, {"PVC_1", "pvc-1"}, {"a/b", "a-b"}, {strings.Repeat("x", 60) + "1", strings.Repeat("x", 60) + "2"}} {
		if NameID(pair[0], "v") == NameID(pair[1], "v") {
			t.Errorf("%q and %q share an ID", pair[0], pair[1])
		}
	}
	for _, name := range []string{"pvc-1", "../../etc", "/", "..", "", "a\x00b", strings.Repeat("é", 100), "UPPER case"} {
		id := NameID(name, "v")
		if !ValidNameID(id) {
			t.Errorf("NameID(%q) = %q is not a valid ID", name, id)
		}
		if id != NameID(name, "v") {
			t.Errorf("NameID(%q) is not deterministic", name)
		}
	}
	if got := NameID("PVC 1", "v"); !strings.HasPrefix(got, "pvc-1-") {
		t.Errorf("slug of %q: %q", "PVC 1", got)
	}
	if got := NameID("..", "snap"); !strings.HasPrefix(got, "snap-") {
		t.Errorf("fallback: %q", got)
	}
	for _, id := range []string{"", "-a", "a/b", "..", "A", strings.Repeat("a", NameIDMax+1)} {
		if ValidNameID(id) {
			t.Errorf("ValidNameID(%q) = true", id)
		}
	}
}

func TestPoolRoot(t *testing.T) {
	for in, want := range map[string]string{"/p": "/p", "/p//": "/p", "/a/b/": "/a/b"} {
		if got, err := PoolRoot(in); err != nil || got != want {
			t.Errorf("PoolRoot(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "p", "/", "//"} {
		if _, err := PoolRoot(in); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("PoolRoot(%q): %v", in, err)
		}
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "1Ki": KiB, "1KiB": KiB, " 3Mi ": 3 * MiB, "2GiB": 2 * GiB, "1Ti": TiB} {
		if got, ok := ParseSize(in); !ok || got != want {
			t.Errorf("ParseSize(%q) = %d, %v", in, got, ok)
		}
	}
	for _, in := range []string{"", "-1", "1KB", "x", "9999999999Ti", "1.5Gi"} {
		if _, ok := ParseSize(in); ok {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
	if RoundUp(1, 4096) != 4096 || RoundUp(4096, 4096) != 4096 || RoundDown(4097, 4096) != 4096 {
		t.Error("rounding")
	}
	if got := FormatSize(300 * MiB); got != "314572800 bytes (300 MiB)" {
		t.Errorf("FormatSize: %q", got)
	}
}

func TestWrap(t *testing.T) {
	if Wrap(nil, "x") != nil {
		t.Error("Wrap(nil)")
	}
	err := Wrap(abi.Errorf(abi.NotFound, "no file"), "clone")
	if abi.CodeOf(err) != abi.NotFound || err.(*abi.Error).Message != "clone: no file" {
		t.Errorf("Wrap kept %v", err)
	}
	if abi.CodeOf(Wrap(errors.New("plain"), "x")) != abi.Internal {
		t.Error("a plain error must become INTERNAL")
	}
	if e := Error(abi.OutOfRange, "a", "b"); e.(*abi.Error).Message != "ab" {
		t.Errorf("Error: %v", e)
	}
}

func TestNameIDSlugs(t *testing.T) {
	long := strings.Repeat("abcdefghij", 30)
	tests := []struct {
		name, fallback, slug string
	}{
		{"pvc-123", "vol", "pvc-123"},
		{"PVC_1", "vol", "pvc-1"},
		{"pvc-1", "vol", "pvc-1"},
		{"  weird//name..x ", "vol", "weird-name-x"},
		{"---", "vol", "vol"},
		{"日本語", "snap", "snap"},
		{"a.b.c", "vol", "a-b-c"},
		{long, "vol", long[:nameSlugMax]},
		{"sanity-node-full-volume-" + strings.Repeat("9", 30), "vol", "sanity-node-full-volume-9999999999999999"},
		{"", "vol", "vol"},
	}
	seen := map[string]string{}
	for _, tc := range tests {
		id := NameID(tc.name, tc.fallback)
		if !ValidNameID(id) {
			t.Errorf("NameID(%q) = %q: not a valid local ID", tc.name, id)
		}
		slug, hash, ok := cutLast(id, "-")
		if !ok || slug != tc.slug || len(hash) != nameHashHex {
			t.Errorf("NameID(%q) = %q, want slug %q and a %d-digit hash", tc.name, id, tc.slug, nameHashHex)
		}
		if again := NameID(tc.name, tc.fallback); again != id {
			t.Errorf("NameID(%q) is not deterministic: %q then %q", tc.name, id, again)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("names %q and %q share local ID %q", other, tc.name, id)
		}
		seen[id] = tc.name
	}
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

func TestValidNameIDTable(t *testing.T) {
	for id, want := range map[string]bool{
		"pvc-1-0123456789abcdef": true,
		"":                       false,
		"-x":                     false,
		"..":                     false,
		"Upper":                  false,
		"a_b":                    false,
		strings.Repeat("a", 58):  false,
		strings.Repeat("a", 57):  true,
	} {
		if got := ValidNameID(id); got != want {
			t.Errorf("ValidNameID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestParseSizeTable(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"4096", 4096, true},
		{"1Mi", MiB, true},
		{"4MiB", 4 * MiB, true},
		{"64Ki", 64 * KiB, true},
		{"1Gi", GiB, true},
		{" 2Ti ", 2 * TiB, true},
		{"1M", 0, false},
		{"-1", 0, false},
		{"", 0, false},
		{"1.5Gi", 0, false},
		{"99999999999Ti", 0, false},
	}
	for _, tc := range tests {
		got, ok := ParseSize(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
