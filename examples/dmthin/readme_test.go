//go:build !wasip1

package main

import (
	"os"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/sdk"
)

// TestReadmeShowsParameters: README.md shows the parameter table generated
// from the declared Parameters (wasmcsi modules inspect prints the same).
func TestReadmeShowsParameters(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if os.IsNotExist(err) {
		t.Skip("README.md is not here: a test binary run outside the source tree (the VM tier)")
	} else if err != nil {
		t.Fatal(err)
	}
	if want := sdk.ParameterTable(Parameters); !strings.Contains(string(readme), want) {
		t.Errorf("README.md lacks the generated parameter table; paste it under \"StorageClass parameters\":\n%s", want)
	}
	// sdk.ParameterValue hands the module its Default: a value, never prose.
	for _, p := range Parameters {
		if p.Default != "" && p.Check(p.Default) != nil {
			t.Errorf("parameter %s: Default %q is not a value of its type; prose belongs in DefaultNote", p.Name, p.Default)
		}
	}
}
