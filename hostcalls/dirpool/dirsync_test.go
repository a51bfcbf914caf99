package dirpool

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// With hostcalls.DirSyncs in the context, Create and Remove leave the
// root's sync to its owner and record the root, repeats included (an
// earlier call's change may still wait for its batch); without, nothing
// is recorded anywhere.
func TestDeferredRootSync(t *testing.T) {
	root := t.TempDir()
	p := newPool(t, root)
	for _, step := range []struct {
		what string
		do   func(ctx context.Context) error
	}{
		{"create", func(ctx context.Context) error { _, err := p.Create(ctx, "v", 0); return err }},
		{"repeated create", func(ctx context.Context) error { _, err := p.Create(ctx, "v", 0); return err }},
		{"remove", func(ctx context.Context) error { return p.Remove(ctx, "v") }},
		{"repeated remove", func(ctx context.Context) error { return p.Remove(ctx, "v") }},
	} {
		var d hostcalls.DirSyncs
		if err := step.do(hostcalls.WithDirSyncs(context.Background(), &d)); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		if got := d.Dirs(); !slices.Equal(got, []string{root}) {
			t.Errorf("%s recorded %v, want [%s]", step.what, got, root)
		}
	}
	if _, err := p.Create(context.Background(), "w", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "w")); err != nil {
		t.Fatalf("create without DirSyncs: %v", err)
	}
}
