package host_test

import (
	"os"
	"testing"

	"github.com/wasmcsi/wasmcsi/host/quiesce"
)

func TestMain(m *testing.M) {
	// The daemon under test starts quiesce guardians by running this
	// binary again (host/quiesce).
	quiesce.Main()
	os.Exit(m.Run())
}
