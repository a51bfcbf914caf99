//go:build !wasip1

package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// fakeFabric is an in-memory pool folder, NVMe target and NVMe/TCP
// initiator behind a FakeHost, with the semantics of abi/hc_file.go,
// abi/hc_nvmet.go and abi/hc_nvme.go, for native tests of the module's
// logic and for the built module.
type fakeFabric struct {
	host  *moduletest.FakeHost
	pool  string
	files map[string]int64 // path -> size
	total int64
	avail int64

	// subsystems: NQN -> its namespace and allowed hosts.
	subs map[string]*fakeSubsystem
	// denies counts nvmet_host_deny calls that ended controllers.
	denies int

	// The node's initiator.
	hostNQN string
	// ctrls: "address|subsystem" of the node's controllers.
	ctrls map[string]bool
}

type fakeSubsystem struct {
	path, uuid string
	size       int64 // the size the namespace reports
	ports      []string
	hosts      []string
}

const (
	testAddress = "192.0.2.5:4420"
	testPrefix  = "nqn.2024-01.dev.wasmcsi:"
	testSubs    = "nqn.2024-01.dev.wasmcsi:pool1."
	testHostNQN = "nqn.2014-08.org.nvmexpress:uuid:node1"
)

// testRoots are the grants the tests configure the module with.
var testRoots = []string{"/pool", testPrefix, testAddress}

// newFakeFabric installs a fake host for this test and answers a backend
// configured with testRoots, role "all" and cfg over the defaults.
func newFakeFabric(t *testing.T, cfg map[string]string) (*fakeFabric, *Backend) {
	t.Helper()
	s := newFabric()
	hostcall.SetHost(s.host.Native())
	t.Cleanup(func() { hostcall.SetHost(nil) })
	full := map[string]string{configAddress: testAddress, configNQNPrefix: testSubs}
	for k, v := range cfg {
		full[k] = v
	}
	b := New()
	if err := b.Configure(&abi.ConfigureRequest{Config: full, Roots: testRoots, NodeID: "n1", Role: "all"}); err != nil {
		t.Fatalf("configure %v: %v", full, err)
	}
	return s, b
}

func newFabric() *fakeFabric {
	s := &fakeFabric{
		host: &moduletest.FakeHost{}, pool: "/pool", files: map[string]int64{},
		total: 100 * sdk.GiB, avail: 50 * sdk.GiB,
		subs: map[string]*fakeSubsystem{}, hostNQN: testHostNQN, ctrls: map[string]bool{},
	}
	s.install()
	return s
}

func (s *fakeFabric) install() {
	f := s.host
	inPool := func(path string) error {
		if dirOf(path) != s.pool || strings.HasPrefix(baseOf(path), ".") {
			return abi.Errorf(abi.PermissionDenied, "%s is outside the granted roots", path)
		}
		return nil
	}
	moduletest.HandleTyped(f, "file", abi.HostCallFileCreate, func(r *abi.FileCreateRequest) (*abi.Empty, error) {
		if err := inPool(r.Path); err != nil {
			return nil, err
		}
		if _, ok := s.files[r.Path]; ok {
			return nil, abi.Errorf(abi.AlreadyExists, "%s exists", r.Path)
		}
		s.files[r.Path] = r.SizeBytes
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileResize, func(r *abi.FileResizeRequest) (*abi.Empty, error) {
		if _, ok := s.files[r.Path]; !ok {
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.Path)
		}
		s.files[r.Path] = r.SizeBytes
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileRemove, func(r *abi.FileRequest) (*abi.Empty, error) {
		delete(s.files, r.Path)
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileClone, func(r *abi.FileCloneRequest) (*abi.Empty, error) {
		if err := inPool(r.Target); err != nil {
			return nil, err
		}
		size, ok := s.files[r.Source]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.Source)
		}
		if _, ok := s.files[r.Target]; ok {
			return nil, abi.Errorf(abi.AlreadyExists, "%s exists", r.Target)
		}
		s.files[r.Target] = size
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileStat, func(r *abi.FileRequest) (*abi.FileStat, error) {
		size, ok := s.files[r.Path]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.Path)
		}
		return &abi.FileStat{SizeBytes: size}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileStatfs, func(r *abi.FileRequest) (*abi.FileStatfs, error) {
		if r.Path != s.pool {
			return nil, abi.Errorf(abi.InvalidArgument, "%s is not a pool folder", r.Path)
		}
		return &abi.FileStatfs{TotalBytes: s.total, AvailableBytes: s.avail, UsedBytes: s.total - s.avail}, nil
	})

	granted := func(nqn string) error {
		if !strings.HasPrefix(nqn, testPrefix) || nqn == testPrefix {
			return abi.Errorf(abi.PermissionDenied, "subsystem %s is outside the granted NQN prefixes", nqn)
		}
		return nil
	}
	moduletest.HandleTyped(f, "nvmet", abi.HostCallNvmetNamespaceCreate, func(r *abi.NvmetNamespaceCreateRequest) (*abi.Empty, error) {
		if err := granted(r.Subsystem); err != nil {
			return nil, err
		}
		if r.NSID != 1 || len(r.Ports) == 0 || r.UUID == "" {
			return nil, abi.Errorf(abi.InvalidArgument, "bad namespace request")
		}
		for _, p := range r.Ports {
			if p != testAddress {
				return nil, abi.Errorf(abi.PermissionDenied, "address %s is not granted", p)
			}
		}
		size, ok := s.files[r.Path]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "backing store %s not found", r.Path)
		}
		if cur, ok := s.subs[r.Subsystem]; ok {
			if cur.path != r.Path || cur.uuid != r.UUID {
				return nil, abi.Errorf(abi.AlreadyExists, "namespace 1 serves %s", cur.path)
			}
			return &abi.Empty{}, nil
		}
		s.subs[r.Subsystem] = &fakeSubsystem{path: r.Path, uuid: r.UUID, size: size, ports: r.Ports}
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "nvmet", abi.HostCallNvmetNamespaceDelete, func(r *abi.NvmetNamespaceRequest) (*abi.Empty, error) {
		if err := granted(r.Subsystem); err != nil {
			return nil, err
		}
		if cur, ok := s.subs[r.Subsystem]; ok && (r.Path == "" || cur.path == r.Path) {
			delete(s.subs, r.Subsystem)
		}
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "nvmet", abi.HostCallNvmetNamespaceResize, func(r *abi.NvmetNamespaceRequest) (*abi.NvmetNamespaceResizeResponse, error) {
		if err := granted(r.Subsystem); err != nil {
			return nil, err
		}
		cur, ok := s.subs[r.Subsystem]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "no namespace")
		}
		cur.size = s.files[cur.path]
		return &abi.NvmetNamespaceResizeResponse{SizeBytes: cur.size}, nil
	})
	moduletest.HandleTyped(f, "nvmet", abi.HostCallNvmetHostAllow, func(r *abi.NvmetHostRequest) (*abi.Empty, error) {
		if err := granted(r.Subsystem); err != nil {
			return nil, err
		}
		cur, ok := s.subs[r.Subsystem]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "subsystem %s does not exist", r.Subsystem)
		}
		if !slices.Contains(cur.hosts, r.Host) {
			cur.hosts = append(cur.hosts, r.Host)
		}
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "nvmet", abi.HostCallNvmetHostDeny, func(r *abi.NvmetHostRequest) (*abi.Empty, error) {
		if err := granted(r.Subsystem); err != nil {
			return nil, err
		}
		cur, ok := s.subs[r.Subsystem]
		if !ok {
			return &abi.Empty{}, nil
		}
		cur.hosts = slices.DeleteFunc(cur.hosts, func(h string) bool { return h == r.Host })
		s.denies++
		// The subsystem's controllers end; the denied host's stays down.
		for k := range s.ctrls {
			if strings.HasSuffix(k, "|"+r.Subsystem) && r.Host == s.hostNQN {
				delete(s.ctrls, k)
			}
		}
		return &abi.Empty{}, nil
	})

	moduletest.HandleTyped(f, "nvme", abi.HostCallNvmeHostNqn, func(*abi.Empty) (*abi.NvmeHostNQN, error) {
		if s.hostNQN == "" {
			return nil, abi.Errorf(abi.FailedPrecondition, "no host NQN")
		}
		return &abi.NvmeHostNQN{NQN: s.hostNQN}, nil
	})
	moduletest.HandleTyped(f, "nvme", abi.HostCallNvmeConnect, func(r *abi.NvmeNamespace) (*abi.NvmeConnectResponse, error) {
		if r.Address != testAddress {
			return nil, abi.Errorf(abi.PermissionDenied, "address %s is not granted", r.Address)
		}
		sub, ok := s.subs[r.Subsystem]
		if !ok || !slices.Contains(sub.hosts, s.hostNQN) {
			return nil, abi.Errorf(abi.PermissionDenied, "the target refuses this host")
		}
		if sub.uuid != r.UUID {
			return nil, abi.Errorf(abi.NotFound, "no namespace %s", r.UUID)
		}
		s.ctrls[r.Address+"|"+r.Subsystem] = true
		return &abi.NvmeConnectResponse{Device: "/dev/nvme1n1", Controller: "nvme1"}, nil
	})
	moduletest.HandleTyped(f, "nvme", abi.HostCallNvmeDisconnect, func(r *abi.NvmeNamespace) (*abi.Empty, error) {
		delete(s.ctrls, r.Address+"|"+r.Subsystem)
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "nvme", abi.HostCallNvmeRescan, func(r *abi.NvmeNamespace) (*abi.NvmeRescanResponse, error) {
		if !s.ctrls[r.Address+"|"+r.Subsystem] {
			return nil, abi.Errorf(abi.NotFound, "no controller")
		}
		return &abi.NvmeRescanResponse{SizeBytes: s.subs[r.Subsystem].size}, nil
	})
}
