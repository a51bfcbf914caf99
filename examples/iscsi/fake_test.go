//go:build !wasip1

package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// fakeSAN is an in-memory pool folder, LIO target and iSCSI initiator
// behind a FakeHost, with the semantics of abi/hc_file.go, abi/hc_lio.go and
// abi/hc_iscsi.go, for native tests of the module's logic and for the
// built module.
type fakeSAN struct {
	host  *moduletest.FakeHost
	pool  string
	files map[string]int64 // path -> size
	total int64
	avail int64

	// LIO: target -> LUN -> its backing.
	luns map[string]map[int32]*fakeLUN
	// acls: target -> initiator -> granted LUNs.
	acls map[string]map[string][]int32
	// chap: target -> initiator -> "user:secret" the target demands.
	chap map[string]map[string]string

	// The node's initiator.
	initiator string
	// sessions: "portal|target" -> LUNs logged in.
	sessions map[string][]int32
	// logins counts session logins (a new session each).
	logins int
}

type fakeLUN struct {
	path       string
	size       int64 // the size LIO reports
	writeCache bool
}

const (
	testPortal    = "192.0.2.5:3260"
	testPrefix    = "iqn.2024-01.dev.wasmcsi:"
	testTarget    = "iqn.2024-01.dev.wasmcsi:pool1"
	testInitiator = "iqn.1993-08.org.debian:01:node1"
)

// testRoots are the grants the tests configure the module with.
var testRoots = []string{"/pool", testPrefix, testPortal}

// newFakeSAN installs a fake host for this test and answers a backend
// configured with testRoots, role "all" and cfg over the defaults
// (portal and target_iqn).
func newFakeSAN(t *testing.T, cfg map[string]string) (*fakeSAN, *Backend) {
	t.Helper()
	s := newSAN()
	hostcall.SetHost(s.host.Native())
	t.Cleanup(func() { hostcall.SetHost(nil) })
	full := map[string]string{configPortal: testPortal, configTargetIQN: testTarget}
	for k, v := range cfg {
		full[k] = v
	}
	b := New()
	if err := b.Configure(&abi.ConfigureRequest{Config: full, Roots: testRoots, NodeID: "n1", Role: "all"}); err != nil {
		t.Fatalf("configure %v: %v", full, err)
	}
	return s, b
}

func newSAN() *fakeSAN {
	s := &fakeSAN{
		host: &moduletest.FakeHost{}, pool: "/pool", files: map[string]int64{},
		total: 100 * sdk.GiB, avail: 50 * sdk.GiB,
		luns: map[string]map[int32]*fakeLUN{}, acls: map[string]map[string][]int32{}, chap: map[string]map[string]string{},
		initiator: testInitiator, sessions: map[string][]int32{},
	}
	s.install()
	return s
}

func (s *fakeSAN) install() {
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
		if size, ok := s.files[r.Path]; ok {
			if size == r.SizeBytes {
				return &abi.Empty{}, nil
			}
			return nil, abi.Errorf(abi.AlreadyExists, "%s exists with another size", r.Path)
		}
		s.files[r.Path] = r.SizeBytes
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileResize, func(r *abi.FileResizeRequest) (*abi.Empty, error) {
		size, ok := s.files[r.Path]
		switch {
		case !ok:
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.Path)
		case r.SizeBytes < size:
			return nil, abi.Errorf(abi.InvalidArgument, "cannot shrink %s", r.Path)
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

	granted := func(target string) error {
		if !strings.HasPrefix(target, testPrefix) || target == testPrefix {
			return abi.Errorf(abi.PermissionDenied, "target %s is outside the granted IQN prefixes", target)
		}
		return nil
	}
	moduletest.HandleTyped(f, "lio", abi.HostCallLioLunCreate, func(r *abi.LioLunCreateRequest) (*abi.Empty, error) {
		if err := granted(r.Target); err != nil {
			return nil, err
		}
		if r.Kind != "fileio" || len(r.Portals) == 0 || r.LUN < 0 || r.LUN > 255 {
			return nil, abi.Errorf(abi.InvalidArgument, "bad LUN request")
		}
		for _, p := range r.Portals {
			if p != testPortal {
				return nil, abi.Errorf(abi.PermissionDenied, "portal %s is not granted", p)
			}
		}
		size, ok := s.files[r.Path]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "backing store %s not found", r.Path)
		}
		if cur, ok := s.luns[r.Target][r.LUN]; ok {
			if cur.path != r.Path {
				return nil, abi.Errorf(abi.AlreadyExists, "LUN %d already serves %s", int(r.LUN), cur.path)
			}
			cur.writeCache = r.WriteCache
			return &abi.Empty{}, nil
		}
		if r.SizeBytes != 0 {
			size = r.SizeBytes
		}
		if s.luns[r.Target] == nil {
			s.luns[r.Target] = map[int32]*fakeLUN{}
		}
		s.luns[r.Target][r.LUN] = &fakeLUN{path: r.Path, size: size, writeCache: r.WriteCache}
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "lio", abi.HostCallLioLunDelete, func(r *abi.LioLunRequest) (*abi.Empty, error) {
		if err := granted(r.Target); err != nil {
			return nil, err
		}
		cur, ok := s.luns[r.Target][r.LUN]
		if !ok || (r.Path != "" && cur.path != r.Path) {
			return &abi.Empty{}, nil
		}
		delete(s.luns[r.Target], r.LUN)
		for ini, luns := range s.acls[r.Target] {
			s.acls[r.Target][ini] = slices.DeleteFunc(luns, func(l int32) bool { return l == r.LUN })
		}
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "lio", abi.HostCallLioLunResize, func(r *abi.LioLunResizeRequest) (*abi.Empty, error) {
		if err := granted(r.Target); err != nil {
			return nil, err
		}
		cur, ok := s.luns[r.Target][r.LUN]
		switch {
		case !ok:
			return nil, abi.Errorf(abi.NotFound, "no LUN %d", int(r.LUN))
		case r.SizeBytes%512 != 0:
			return nil, abi.Errorf(abi.InvalidArgument, "odd size")
		case s.files[cur.path] < r.SizeBytes:
			return nil, abi.Errorf(abi.FailedPrecondition, "file smaller than the LUN")
		}
		cur.size = r.SizeBytes
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "lio", abi.HostCallLioGrant, func(r *abi.LioGrantRequest) (*abi.Empty, error) {
		if err := granted(r.Target); err != nil {
			return nil, err
		}
		if _, ok := s.luns[r.Target][r.LUN]; !ok {
			return nil, abi.Errorf(abi.NotFound, "no LUN %d", int(r.LUN))
		}
		if s.acls[r.Target] == nil {
			s.acls[r.Target], s.chap[r.Target] = map[string][]int32{}, map[string]string{}
		}
		if !slices.Contains(s.acls[r.Target][r.Initiator], r.LUN) {
			s.acls[r.Target][r.Initiator] = append(s.acls[r.Target][r.Initiator], r.LUN)
		}
		s.chap[r.Target][r.Initiator] = ""
		if r.ChapUser != "" {
			s.chap[r.Target][r.Initiator] = r.ChapUser + ":" + r.ChapSecret
		}
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "lio", abi.HostCallLioRevoke, func(r *abi.LioGrantRequest) (*abi.Empty, error) {
		if err := granted(r.Target); err != nil {
			return nil, err
		}
		luns := slices.DeleteFunc(s.acls[r.Target][r.Initiator], func(l int32) bool { return l == r.LUN })
		if len(luns) == 0 {
			delete(s.acls[r.Target], r.Initiator)
		} else {
			s.acls[r.Target][r.Initiator] = luns
		}
		return &abi.Empty{}, nil
	})

	moduletest.HandleTyped(f, "iscsi", abi.HostCallIscsiInitiatorName, func(*abi.Empty) (*abi.IscsiInitiatorName, error) {
		if s.initiator == "" {
			return nil, abi.Errorf(abi.FailedPrecondition, "initiator name: /etc/iscsi/initiatorname.iscsi does not exist")
		}
		return &abi.IscsiInitiatorName{Name: s.initiator}, nil
	})
	moduletest.HandleTyped(f, "iscsi", abi.HostCallIscsiLogin, func(r *abi.IscsiTarget) (*abi.IscsiLoginResponse, error) {
		if r.Portal != testPortal {
			return nil, abi.Errorf(abi.PermissionDenied, "portal %s is not granted", r.Portal)
		}
		luns, ok := s.acls[r.IQN][s.initiator]
		if !ok {
			return nil, abi.Errorf(abi.PermissionDenied, "the target refuses this initiator")
		}
		if want := s.chap[r.IQN][s.initiator]; want != "" && want != r.ChapUser+":"+r.ChapSecret {
			return nil, abi.Errorf(abi.PermissionDenied, "CHAP authentication failed")
		}
		if !slices.Contains(luns, r.LUN) {
			return nil, abi.Errorf(abi.NotFound, "target presents no LUN %d", int(r.LUN))
		}
		key := r.Portal + "|" + r.IQN
		users, up := s.sessions[key]
		if !up {
			s.logins++
		}
		if !slices.Contains(users, r.LUN) {
			s.sessions[key] = append(users, r.LUN)
		}
		return &abi.IscsiLoginResponse{Device: "/dev/disk/by-path/ip-" + r.Portal + "-iscsi-" + r.IQN + "-lun-" + strconv.Itoa(int(r.LUN))}, nil
	})
	moduletest.HandleTyped(f, "iscsi", abi.HostCallIscsiLogout, func(r *abi.IscsiTarget) (*abi.Empty, error) {
		key := r.Portal + "|" + r.IQN
		users := slices.DeleteFunc(s.sessions[key], func(l int32) bool { return l == r.LUN })
		if len(users) == 0 {
			delete(s.sessions, key)
		} else {
			s.sessions[key] = users
		}
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "iscsi", abi.HostCallIscsiRescan, func(r *abi.IscsiTarget) (*abi.IscsiRescanResponse, error) {
		if !slices.Contains(s.sessions[r.Portal+"|"+r.IQN], r.LUN) {
			return nil, abi.Errorf(abi.NotFound, "rescan: LUN %d has no device", int(r.LUN))
		}
		return &abi.IscsiRescanResponse{SizeBytes: s.luns[r.IQN][r.LUN].size}, nil
	})
}

// mark returns a function that lists the host calls made since mark was
// called, joined by spaces.
func (s *fakeSAN) mark() func() string {
	n := len(s.host.Calls())
	return func() string { return strings.Join(s.host.Calls()[n:], " ") }
}
