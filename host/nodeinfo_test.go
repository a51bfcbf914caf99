package host_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeGetInfoDegradesPerBackend: a backend whose node_info fails is
// left out of NodeGetInfo, which still answers with the other backends'
// topology, so the node registers for them; the failure is logged.
func TestNodeGetInfoDegradesPerBackend(t *testing.T) {
	o := localdirOptions(t)
	o.more = []daemonModule{{name: "badnode", wasm: filepath.Join("testdata", "badnode.wasm")}}
	d := startDaemon(t, o)
	info, err := d.node().NodeGetInfo(callCtx(t), nil)
	if err != nil {
		t.Fatalf("NodeGetInfo with one failing backend: %v", err)
	}
	if !strings.HasPrefix(info.GetNodeId(), "test-node;") {
		t.Errorf("node ID %q", info.GetNodeId())
	}
	if got := info.GetAccessibleTopology().GetSegments()[nodeTopologyKey]; got != "test-node" {
		t.Errorf("topology %v: localdir's segment missing", info.GetAccessibleTopology())
	}
}
