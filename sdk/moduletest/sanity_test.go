//go:build !wasip1

package moduletest_test

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

// TestSanity runs the conformance kit on the guide's minimal module, as an
// author runs it on theirs: the module contract, then csi-sanity against a
// real daemon serving it (node checks as root only).
func TestSanity(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: serves the module in a daemon and runs csi-sanity")
	}
	wasm := moduletest.Build(t, minimal, moduletest.Go)
	moduletest.Sanity(t, wasm, moduletest.Grant{HostCalls: []string{"dir"}, Roots: []string{t.TempDir()}},
		moduletest.SanityOptions{Name: "minimal"})
}
