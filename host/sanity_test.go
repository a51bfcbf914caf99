package host_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/wasmcsi/wasmcsi/examples/dmthin/dmthintest"
	"github.com/wasmcsi/wasmcsi/examples/iscsi/iscsitest"
	"github.com/wasmcsi/wasmcsi/examples/lvm/lvmmodule"
	"github.com/wasmcsi/wasmcsi/examples/nfs/nfstest"
	"github.com/wasmcsi/wasmcsi/examples/nvmeof/nvmeoftest"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm/lvmtest"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// sanityTarget is one daemon configuration csi-sanity runs against.
type sanityTarget struct {
	name string
	opts daemonOptions
	// accessType is "mount" or "block" (csi-sanity's TestVolumeAccessType).
	accessType string
	params     map[string]string
	mutable    map[string]string
	size       int64
	skip       []string
}

// sanityTargets lists the backends csi-sanity checks here, once per
// toolchain. WASMCSI_SANITY narrows the list (a comma-separated list of
// name prefixes, e.g. "localdir/go").
func sanityTargets(t *testing.T) []sanityTarget {
	var out []sanityTarget
	for _, tc := range moduletest.Toolchains {
		// In the VM tier the module files decide (prepare); here, TinyGo.
		if tc == moduletest.TinyGo && !dmthintest.InVM() && moduletest.TinyGoPath() == "" && os.Getenv("WASMCSI_REQUIRE_TINYGO") == "" {
			t.Log("TinyGo not found: csi-sanity runs only against standard-Go modules (set WASMCSI_TINYGO)")
			continue
		}
		for _, b := range sanityBackends {
			// Each backend runs in the tier whose kernel it needs.
			if vmBackend := b.prepare != nil; vmBackend != dmthintest.InVM() {
				continue
			}
			for _, access := range b.access {
				label := b.backend
				if b.variant != "" {
					label += "-" + b.variant
				}
				if b.label != "" {
					label = b.label
				}
				name := fmt.Sprintf("%s/%s/%s", label, tc, access)
				if !selected(name) {
					continue
				}
				opts := daemonOptions{backend: b.backend, hostcalls: b.hostcalls}
				if b.prepare != nil {
					if !b.prepare(t, tc, strings.ReplaceAll(name, "/", "-"), &opts) {
						continue
					}
				} else {
					opts.wasm = moduletest.Build(t, "../examples/"+b.backend, tc)
				}
				out = append(out, sanityTarget{
					name:       name,
					opts:       opts,
					accessType: access,
					params:     b.params,
					mutable:    b.mutable,
					size:       b.size,
					skip:       b.skip,
				})
			}
		}
	}
	return out
}

type sanityBackend struct {
	backend string
	// variant tells targets of one backend apart (its device class).
	variant string
	// label names the target instead of backend (one backend, two
	// StorageClass modes).
	label     string
	hostcalls []string
	access    []string
	params    map[string]string
	// mutable are csi-sanity's TestVolumeMutableParameters: what its
	// ModifyVolume specs set on backends with mutable parameters.
	mutable map[string]string
	size    int64
	// skip are regular expressions of csi-sanity specs left out for this
	// target, matched against the spec's text after the target's name.
	skip []string
	// prepare, for backends of the VM tier, fills in the module file and
	// its grants for one target, or reports false (having logged why) to
	// leave the target out. Backends without it are built here and run
	// outside the VM.
	prepare func(t *testing.T, tc moduletest.Toolchain, name string, o *daemonOptions) bool
}

// sanityBackends are the node-local backends this machine can test for
// real; device-mapper, iSCSI (LIO and open-iscsi on loopback, the
// controller and the node in one daemon) and NVMe/TCP (nvmet and the
// kernel's initiator on loopback) run in the VM tier.
var sanityBackends = []sanityBackend{
	{backend: "localdir", hostcalls: []string{"dir", "mount"}, access: []string{"mount"}},
	{backend: "loopfile", hostcalls: []string{"file", "loop"}, access: []string{"mount", "block"}, size: 16 << 20,
		mutable: map[string]string{"prealloc": "true"}},
	{backend: "dmthin", hostcalls: dmthintest.HostCalls, access: []string{"mount", "block"}, size: 16 << 20, prepare: prepareDmthin},
	{backend: "iscsi", hostcalls: iscsitest.HostCalls, access: []string{"mount", "block"}, size: 16 << 20, prepare: prepareIscsi,
		mutable: map[string]string{"writeCache": "true"}},
	// Each lvm call runs the lvm tool (about a second each under TCG), so
	// each class is checked with one access type: thin with mount (the
	// snapshot, restore and expansion specs), thick with block.
	{backend: "lvm", variant: "thin", hostcalls: lvmmodule.HostCalls, access: []string{"mount"}, size: 16 << 20, prepare: prepareLvm,
		params: map[string]string{"deviceClass": "thin"}},
	{backend: "lvm", variant: "thick", hostcalls: lvmmodule.HostCalls, access: []string{"block"}, size: 16 << 20, prepare: prepareLvm,
		params: map[string]string{"deviceClass": "thick"}, skip: thickSkips},
	{backend: "nvmeof", hostcalls: nvmeoftest.HostCalls, access: []string{"mount", "block"}, size: 16 << 20, prepare: prepareNvmeof},
	{backend: "nfs", label: "nfs-server", hostcalls: nfstest.HostCalls, access: []string{"mount"}, size: 16 << 20,
		params: map[string]string{"mode": "server"}, prepare: prepareNFS},
	{backend: "nfs", label: "nfs-client", hostcalls: nfstest.HostCalls, access: []string{"mount"}, size: 16 << 20,
		params: map[string]string{"mode": "client", "server": "127.0.0.1", "share": nfsSanityShare}, prepare: prepareNFS},
}

// thickSkips are the csi-sanity specs a thick device class cannot pass:
// thick LVs have no snapshots (the plugin offers them for thin classes),
// so every spec that snapshots or clones a volume is left to the thin
// target.
var thickSkips = []string{"[Ss]napshot", "source volume", "clone"}

// prepareLvm gives an lvm target the module file (the one the VM tier
// copied in) and a volume group of its own on a loop device, with a thin
// pool and an operator's LV that must come through untouched.
func prepareLvm(t *testing.T, tc moduletest.Toolchain, name string, o *daemonOptions) bool {
	if tc == moduletest.TinyGo && os.Getenv("WASMCSI_MODULE_DIR") != "" {
		if _, err := os.Stat(filepath.Join(os.Getenv("WASMCSI_MODULE_DIR"), "lvm.tinygo.wasm")); err != nil {
			t.Logf("%s left out: no lvm.tinygo.wasm", name)
			return false
		}
	}
	wasm := lvmmodule.Module(t, tc)
	fx := lvmtest.New(t, strings.NewReplacer("-", "", "/", "").Replace(name), 2<<30, 1<<30)
	t.Cleanup(func() { fx.CheckOperator(t) })
	*o = lvmOptions(wasm, fx)
	return true
}

// nfsSanityShare is the export client-mode sanity runs make their folders in.
const nfsSanityShare = "/tmp/wcsi-nfs-sanity-share"

// prepareNFS gives an nfs target the module file the VM tier copied in,
// the guest's NFS server (nodes and controller are one daemon on
// 127.0.0.1) and, for client mode, an export of the test's own.
func prepareNFS(t *testing.T, tc moduletest.Toolchain, name string, o *daemonOptions) bool {
	wasm, why := nfstest.ModuleFile(tc)
	if wasm == "" {
		t.Logf("%s left out: %s", name, why)
		return false
	}
	nfstest.Server(t)
	nfstest.Share(t, "sanity", nfsSanityShare, "127.0.0.1")
	mounts := t.TempDir()
	t.Cleanup(func() { nfstest.DetachUnder(t, mounts); nfstest.Withdraw(t) })
	*o = daemonOptions{backend: "nfs", wasm: wasm, hostcalls: nfstest.HostCalls,
		extraRoots: []string{mounts, "127.0.0.1", "127.0.0.1:/"},
		config:     map[string]string{"server": "127.0.0.1", "mounts": mounts}}
	return true
}

// prepareDmthin gives a dmthin target the module file the VM tier copied
// in and a thin pool of its own (sparse loop-backed files in a temporary
// folder, under a name prefix of its own), removed when the test ends.
func prepareDmthin(t *testing.T, tc moduletest.Toolchain, name string, o *daemonOptions) bool {
	wasm, why := dmthintest.ModuleFile(tc)
	if wasm == "" {
		t.Logf("%s left out: %s", name, why)
		return false
	}
	fx := dmthintest.New(t, name, 1<<30, 16<<20)
	*o = dmthinOptions(wasm, fx)
	return true
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
// each backend module, with real mounts and loop devices; in the VM tier,
// against the backends that need its kernel (dmthin on a real thin pool,
// iscsi on LIO and open-iscsi).
func TestSanity(t *testing.T) {
	requireRoot(t)
	if dmthintest.InVM() {
		// The VM tier copies built modules in; it has no examples folder.
		dmthintest.Require(t)
	} else if _, err := os.Stat("../examples"); err != nil {
		t.Skip("example modules not present")
	}
	targets := sanityTargets(t)
	if len(targets) == 0 {
		t.Skip("no sanity target selected (WASMCSI_SANITY) or no module file present")
	}
	suite, reporter := GinkgoConfiguration()
	for _, tg := range targets {
		for _, re := range tg.skip {
			suite.SkipStrings = append(suite.SkipStrings, regexp.QuoteMeta(tg.name)+" .*"+re)
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
		cfg.TestVolumeMutableParameters = tg.mutable
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
	RunSpecs(t, "wasmcsi csi-sanity", suite, reporter)
}
