// Package gencheck holds what the generators' tests share: that generated
// files are current, and reading the tables the documents show.
package gencheck

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// UpToDate fails t for every file whose content on disk is not src.
func UpToDate(t *testing.T, files map[string][]byte) {
	t.Helper()
	for path, src := range files {
		have, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(have, src) {
			t.Errorf("%s is out of date (%v): run go generate in its package", path, err)
		}
	}
}

// Lines returns the lines of the document at path.
func Lines(t *testing.T, path string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(src), "\n")
}

// Table returns the rows of the table whose header line starts with header
// in the document at path (every "|" line after it, up to the first other).
func Table(t *testing.T, path, header string) []string {
	t.Helper()
	var rows []string
	in := false
	for _, l := range Lines(t, path) {
		switch {
		case strings.HasPrefix(l, header):
			in = true
		case in && !strings.HasPrefix(l, "|"):
			in = false
		case in:
			rows = append(rows, l)
		}
	}
	return rows
}

var tick = regexp.MustCompile("`(\\w+)`")

// Ticked returns the `quoted` names in s, in order.
func Ticked(s string) []string {
	var out []string
	for _, m := range tick.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}
