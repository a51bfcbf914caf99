package moduletest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
)

// SanityOptions tune Sanity.
type SanityOptions struct {
	// Name is the module's name (default "module").
	Name string
	// Params are the StorageClass parameters of the test volumes.
	Params map[string]string
	// Mutable are mutable parameters csi-sanity's ModifyVolume sets
	// (keys of BackendInfo.MutableParameters).
	Mutable map[string]string
	// Block tests block access instead of mount access.
	Block bool
	// SizeBytes is the test volumes' size (default csi-sanity's 10 GiB;
	// give a small one for backends that allocate).
	SizeBytes int64
}

// Sanity is the conformance kit: it checks the module contract the daemon
// relies on (a repeated create_volume answers the same LocalID, a
// repeated delete_volume succeeds, a StorageClass parameter nobody knows
// is INVALID_ARGUMENT, a call finishes within a tight guest-time budget),
// then serves the module in a real daemon on a unix socket with the
// grant, and runs csi-sanity (csi-test v5) against it. Node checks need
// root (mounts); without it they are skipped and the test says so. The
// grant's roots are the module's pool: give folders of t.TempDir().
//
// csi-sanity runs a Ginkgo suite, so a test binary calls Sanity once.
func Sanity(t *testing.T, wasm string, grant Grant, opt SanityOptions) {
	t.Helper()
	if opt.Name == "" {
		opt.Name = "module"
	}
	t.Run("contract", func(t *testing.T) { contract(t, wasm, grant, opt) })
	if t.Failed() {
		return
	}
	serveSanity(t, wasm, grant, opt)
}

// contract checks what the daemon relies on and cannot check itself.
func contract(t *testing.T, wasm string, grant Grant, opt SanityOptions) {
	m := Load(t, wasm, Options{Name: opt.Name, Grant: grant, Host: RealCalls(),
		Limits: Limits{CallTimeout: 2 * time.Second}})
	size := opt.SizeBytes
	if size == 0 {
		size = 16 << 20
	}
	req := &abi.CreateVolumeRequest{Name: "sanity-contract", RequiredBytes: size, Parameters: opt.Params}
	var first, again abi.CreateVolumeResponse
	if err := m.Call(abi.OpCreateVolume, req, &first); err != nil {
		t.Fatalf("create_volume: %v", err)
	}
	// A replay (after a crash between the module's work and the host's
	// record) must land on the same volume.
	if err := m.Call(abi.OpCreateVolume, req, &again); err != nil || again.LocalID != first.LocalID {
		t.Errorf("create_volume repeated: %q, %v; want the same LocalID %q", again.LocalID, err, first.LocalID)
	}
	other := &abi.CreateVolumeRequest{Name: "sanity-contract-2", RequiredBytes: size, Parameters: opt.Params}
	var second abi.CreateVolumeResponse
	if err := m.Call(abi.OpCreateVolume, other, &second); err != nil {
		t.Errorf("create_volume of a second name: %v", err)
	} else if second.LocalID == first.LocalID {
		t.Errorf("two names answered one LocalID %q", first.LocalID)
	}
	params := map[string]string{"wasmcsi-sanity-unknown": "1"}
	for k, v := range opt.Params {
		params[k] = v
	}
	bad := &abi.CreateVolumeRequest{Name: "sanity-contract-bad", RequiredBytes: size, Parameters: params}
	err := m.Call(abi.OpCreateVolume, bad, &abi.CreateVolumeResponse{})
	if m.Info.DeclaresParameters {
		// The daemon refuses it before the module runs; the declaration
		// must then not accept it either.
		err = abi.CheckParameters(m.Info.Parameters, params)
	}
	if abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("create_volume with an unknown parameter: %v, want INVALID_ARGUMENT", err)
	}
	for _, v := range []abi.CreateVolumeResponse{first, second} {
		if v.LocalID == "" {
			continue
		}
		del := &abi.DeleteVolumeRequest{Volume: abi.VolumeRef{LocalID: v.LocalID, Context: v.Context, CapacityBytes: v.CapacityBytes}}
		for i := range 2 {
			if err := m.Call(abi.OpDeleteVolume, del, &abi.Empty{}); err != nil {
				t.Errorf("delete_volume %s (%d): %v; a repeat must succeed", v.LocalID, i+1, err)
			}
		}
	}
}

// serveSanity serves the module in a real daemon and runs csi-sanity.
func serveSanity(t *testing.T, wasm string, grant Grant, opt SanityOptions) {
	work, err := os.MkdirTemp("", "wcsi-kit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	mods := filepath.Join(work, "modules")
	if err := os.Mkdir(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mods, opt.Name+".wasm"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(work, "csi.sock")
	cfg, err := config.Load(nil, []string{
		"WASMCSI_ENDPOINT=unix://" + sock,
		"WASMCSI_STATE_DIR=" + filepath.Join(work, "state"),
		"WASMCSI_MODULE_DIR=" + mods,
		"WASMCSI_CACHE_DIR=" + filepath.Join(os.TempDir(), "wasmcsi-moduletest-cache"),
		"WASMCSI_NODE_ID=sanity-node",
		"WASMCSI_WATCH_MODULES=false",
		"WASMCSI_DEFAULT_BACKEND=" + opt.Name,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Modules = map[string]config.Module{opt.Name: {HostCalls: grant.HostCalls, Roots: grant.Roots, Config: grant.Config}}
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := host.New(ctx, cfg, host.Options{Log: log})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if len(srv.Backends()) != 1 {
		cancel()
		srv.Close(context.Background())
		t.Fatalf("the daemon did not load %s:\n%s", opt.Name, logs.String())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-served
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		srv.Close(cctx)
		if t.Failed() {
			t.Logf("daemon log (warnings and errors):\n%s", logs.String())
		}
	})

	scfg := sanity.NewTestConfig()
	scfg.Address = "unix://" + sock
	scfg.TargetPath = filepath.Join(work, "target")
	scfg.StagingPath = filepath.Join(work, "staging")
	scfg.TestVolumeParameters = opt.Params
	scfg.TestVolumeMutableParameters = opt.Mutable
	scfg.IdempotentCount = 2
	if opt.Block {
		scfg.TestVolumeAccessType = "block"
	}
	if opt.SizeBytes > 0 {
		scfg.TestVolumeSize = opt.SizeBytes
		scfg.TestVolumeExpandSize = 2 * opt.SizeBytes
	}
	suite, reporter := ginkgo.GinkgoConfiguration()
	if os.Geteuid() != 0 {
		t.Log("not root: csi-sanity's Node Service checks (mounts) are skipped")
		suite.SkipStrings = append(suite.SkipStrings, "Node Service")
	}
	ginkgo.Describe(opt.Name, func() { sanity.GinkgoTest(&scfg) })
	gomega.RegisterFailHandler(ginkgo.Fail)
	ginkgo.RunSpecs(t, "wasmcsi conformance: "+opt.Name, suite, reporter)
}
