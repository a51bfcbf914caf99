package host_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/wasmcsi/wasmcsi/sdk/moduletest"
)

// sanityTarget is one daemon configuration csi-sanity runs against.
type sanityTarget struct {
	name string
	opts daemonOptions
	// accessType is "mount" or "block" (csi-sanity's TestVolumeAccessType).
	accessType string
	params     map[string]string
	size       int64
}

// sanityTargets lists the backends csi-sanity checks here, once per
// toolchain. WASMCSI_SANITY narrows the list (a comma-separated list of
// name prefixes, e.g. "localdir/go").
func sanityTargets(t *testing.T) []sanityTarget {
	var out []sanityTarget
	for _, tc := range moduletest.Toolchains {
		if tc == moduletest.TinyGo && moduletest.TinyGoPath() == "" && os.Getenv("WASMCSI_REQUIRE_TINYGO") == "" {
			t.Log("TinyGo not found: csi-sanity runs only against standard-Go modules (set WASMCSI_TINYGO)")
			continue
		}
		for _, b := range sanityBackends {
			for _, access := range b.access {
				name := fmt.Sprintf("%s/%s/%s", b.backend, tc, access)
				if !selected(name) {
					continue
				}
				out = append(out, sanityTarget{
					name:       name,
					opts:       daemonOptions{backend: b.backend, wasm: moduletest.Build(t, "../examples/"+b.backend, tc), hostcalls: b.hostcalls},
					accessType: access,
					params:     b.params,
					size:       b.size,
				})
			}
		}
	}
	return out
}

type sanityBackend struct {
	backend   string
	hostcalls []string
	access    []string
	params    map[string]string
	size      int64
}

// sanityBackends are the node-local backends this machine can test for
// real; device-mapper and iSCSI run in the VM tier.
var sanityBackends = []sanityBackend{
	{backend: "localdir", hostcalls: []string{"dir", "mount"}, access: []string{"mount"}},
	{backend: "loopfile", hostcalls: []string{"file", "loop"}, access: []string{"mount", "block"}, size: 16 << 20},
}

func selected(name string) bool {
	only := os.Getenv("WASMCSI_SANITY")
	if only == "" {
		return true
	}
	for _, p := range strings.Split(only, ",") {
		if strings.HasPrefix(name, strings.TrimSpace(p)) {
			return true
		}
	}
	return false
}

// TestSanity runs the whole csi-sanity suite against a real daemon serving
// each backend module, with real mounts and loop devices.
func TestSanity(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("../examples"); err != nil {
		t.Skip("example modules not present")
	}
	targets := sanityTargets(t)
	if len(targets) == 0 {
		t.Skip("no sanity target selected (WASMCSI_SANITY)")
	}
	for _, tg := range targets {
		if _, err := os.Stat(filepath.Join("../examples", strings.SplitN(tg.name, "/", 2)[0])); err != nil {
			t.Fatalf("%s: %v", tg.name, err)
		}
		d := startDaemon(t, tg.opts)
		work, err := os.MkdirTemp("", "wcsi-sanity-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(work) })
		cfg := sanity.NewTestConfig()
		cfg.Address = d.socket
		cfg.TargetPath = filepath.Join(work, "target")
		cfg.StagingPath = filepath.Join(work, "staging")
		cfg.TestVolumeAccessType = tg.accessType
		cfg.TestVolumeParameters = tg.params
		cfg.IdempotentCount = 2
		if tg.size > 0 {
			cfg.TestVolumeSize = tg.size
			cfg.TestVolumeExpandSize = 2 * tg.size
		}
		Describe(tg.name, func() {
			sanity.GinkgoTest(&cfg)
		})
	}
	RegisterFailHandler(Fail)
	RunSpecs(t, "wasmcsi csi-sanity")
}
