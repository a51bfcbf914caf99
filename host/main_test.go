package host_test

import (
	"os"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
)

func TestMain(m *testing.M) {
	// The daemon under test starts quiesce guardians by running this
	// binary again (hostcalls/node/quiesce).
	quiesce.Main()
	os.Exit(m.Run())
}
