package filepool_test

import (
	"context"
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// With hostcalls.DirSyncs in the context, Create and Remove leave the
// root's sync to its owner and record the root, repeats included (an
// earlier call's change may still wait for its batch).
func TestDeferredRootSync(t *testing.T) {
	p := newPool(t)
	for _, step := range []struct {
		what string
		do   func(ctx context.Context) error
	}{
		{"create", func(ctx context.Context) error { return p.Create(ctx, "v", mib, false) }},
		{"repeated create", func(ctx context.Context) error { return p.Create(ctx, "v", mib, false) }},
		{"remove", func(ctx context.Context) error { return p.Remove(ctx, "v") }},
		{"repeated remove", func(ctx context.Context) error { return p.Remove(ctx, "v") }},
	} {
		var d hostcalls.DirSyncs
		if err := step.do(hostcalls.WithDirSyncs(context.Background(), &d)); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		if got := d.Dirs(); !slices.Equal(got, []string{p.Root()}) {
			t.Errorf("%s recorded %v, want [%s]", step.what, got, p.Root())
		}
	}
	create(t, p, "w", mib)
	if got := rootEntries(t, p); !slices.Contains(got, "w") {
		t.Errorf("create without DirSyncs: root holds %v", got)
	}
}
