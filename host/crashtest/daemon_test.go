package crashtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/host/internal/daemontest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// EnvToolchain picks the modules' build: go (the default, as make build)
// or tinygo (smaller modules, faster restarts).
const EnvToolchain = "WASMCSI_CRASH_TOOLCHAIN"

// daemon is the wasmcsi program serving the two node-local example
// backends with the configuration an operator would write for them
// (daemontest runs it), and the folder where the CO keeps its staging and
// target paths. reconcile.clean stays off (the default), so whatever a
// crash leaves behind stays visible to the checks.
type daemon struct {
	*daemontest.Daemon
	pools map[string]string // backend -> pool folder
	node  string
}

func newDaemon(t *testing.T) *daemon {
	t.Helper()
	daemontest.Require(t)
	tc := moduletest.Go
	switch os.Getenv(EnvToolchain) {
	case "", "go":
	case "tinygo":
		tc = moduletest.TinyGo
	default:
		t.Fatalf("%s=%q: want go or tinygo", EnvToolchain, os.Getenv(EnvToolchain))
	}
	dd := daemontest.New(t, daemontest.Options{LogFormat: "json", Modules: []daemontest.Module{
		{Name: "localdir", Wasm: moduletest.Build(t, "../../examples/localdir", tc), HostCalls: []string{"dir"}, Pool: true},
		{Name: "loopfile", Wasm: moduletest.Build(t, "../../examples/loopfile", tc), HostCalls: []string{"file", "loop"}, Pool: true},
	}})
	d := &daemon{Daemon: dd, node: filepath.Join(dd.Dir, "node"),
		pools: map[string]string{"localdir": dd.Pool("localdir"), "loopfile": dd.Pool("loopfile")}}
	if err := os.MkdirAll(d.node, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// unfinished returns the errors of the current process's log that say
// start-up could not finish a logged create or a marked deletion
// (replay.go): what a crash left must converge at the next start.
func (d *daemon) unfinished() []string {
	var out []string
	for _, line := range d.Log() {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Name  string `json:"name"`
			Vol   string `json:"volume"`
			Snap  string `json:"snapshot"`
			Err   string `json:"err"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Level != "ERROR" || !strings.HasPrefix(rec.Msg, "finish ") {
			continue
		}
		out = append(out, strings.TrimSpace(fmt.Sprintf("%s %s%s%s: %s", rec.Msg, rec.Name, rec.Vol, rec.Snap, rec.Err)))
	}
	return out
}

// finding is one start-up reconciliation report of the daemon's log.
type finding struct{ Kind, Path, Detail string }

// findings reads the reconcile reports of the current process's log.
func (d *daemon) findings() []finding {
	var out []finding
	for _, line := range d.Log() {
		var rec struct {
			Msg    string `json:"msg"`
			Kind   string `json:"kind"`
			Path   string `json:"path"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "reconcile" && rec.Kind != "" {
			out = append(out, finding{rec.Kind, rec.Path, rec.Detail})
		}
	}
	return out
}
