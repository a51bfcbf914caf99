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
}
