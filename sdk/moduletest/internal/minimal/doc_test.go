//go:build !wasip1

package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The authoring guide shows this module and excerpts of real, tested
// files; these tests keep it that way.

const (
	guide    = "../../../../docs/authoring.md"
	repoRoot = "../../../.."
)

// normalize drops indentation and blank lines, so an excerpt from inside a
// function matches its file whatever the guide's indentation.
func normalize(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func goBlocks(t *testing.T, doc string) []string {
	t.Helper()
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(doc, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) == 0 {
		t.Fatal("the guide has no Go snippets")
	}
	return blocks
}

func readGuide(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(guide)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestGuideShowsThisModule: the guide's first snippet is this file, whole.
func TestGuideShowsThisModule(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if first := goBlocks(t, readGuide(t))[0]; first != string(src) {
		t.Error("the first Go snippet of docs/authoring.md is not sdk/moduletest/internal/minimal/main.go; copy the file into the guide")
	}
}

// TestGuideSnippetsAreExcerpts: every Go snippet is a verbatim excerpt of a
// Go file of sdk/ or examples/, so it compiles and its tests run.
func TestGuideSnippetsAreExcerpts(t *testing.T) {
	var sources []string
	for _, dir := range []string{"sdk", "examples"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
				return err
			}
			b, err := os.ReadFile(p)
			sources = append(sources, normalize(string(b)))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, block := range goBlocks(t, readGuide(t)) {
		want := normalize(block)
		found := false
		for _, src := range sources {
			if strings.Contains(src, want) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("Go snippet %d of docs/authoring.md is in no Go file of sdk/ or examples/:\n%s", i+1, block)
		}
	}
}

// TestGuidePathsExist: every repository path the guide names exists.
func TestGuidePathsExist(t *testing.T) {
	doc := readGuide(t)
	var paths []string
	for _, m := range regexp.MustCompile(`\]\(\.\./([^)#]+)\)`).FindAllStringSubmatch(doc, -1) {
		paths = append(paths, m[1])
	}
	for _, m := range regexp.MustCompile("`((?:abi|sdk|host|hostcalls|modules|examples|cmd|deploy|docs|\\.ci)/[A-Za-z0-9_./*-]+)`").FindAllStringSubmatch(doc, -1) {
		paths = append(paths, m[1])
	}
	if len(paths) < 10 {
		t.Fatalf("found only %d paths in the guide: %v", len(paths), paths)
	}
	for _, p := range paths {
		matches, err := filepath.Glob(filepath.Join(repoRoot, p))
		if err != nil || len(matches) == 0 {
			t.Errorf("docs/authoring.md names %s, which does not exist", p)
		}
	}
}
