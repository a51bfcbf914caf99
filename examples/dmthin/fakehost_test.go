//go:build !wasip1

package main

import (
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// fakeSystem models what dmthin asks of the host — record files, loop
// devices and one thin pool — with the semantics abi/hc_*.go document, so
// that tests check the module's decisions without a kernel. The same fake
// answers native calls and a built module's imports.
type fakeSystem struct {
	mu     sync.Mutex
	host   *moduletest.FakeHost
	files  map[string]int64 // record files and backing files: path -> size
	loops  map[string]string
	pool   *fakePool
	status abi.DmPoolStatus // the pool's usage, as tests set it
	// fail makes the next call of a host call fail with this error.
	fail map[string]error
	// opens records every dm_pool_open request.
	opens []abi.DmPoolOpenRequest
}

type fakePool struct {
	name, data, meta string
	blockSectors     uint64
	thins            map[uint32]*fakeThin
}

type fakeThin struct {
	active bool
	size   int64 // of the active table
	origin uint32
}

func newFakeSystem() *fakeSystem {
	f := &fakeSystem{
		host:  &moduletest.FakeHost{},
		files: map[string]int64{},
		loops: map[string]string{},
		fail:  map[string]error{},
		status: abi.DmPoolStatus{
			TotalDataBlocks: 4096, UsedDataBlocks: 0, TotalMetaBlocks: 2048, UsedMetaBlocks: 10,
		},
	}
	h := f.host
	moduletest.HandleTyped(h, "file", abi.HostCallFileCreate, guard(f, abi.HostCallFileCreate, f.fileCreate))
	moduletest.HandleTyped(h, "file", abi.HostCallFileResize, guard(f, abi.HostCallFileResize, f.fileResize))
	moduletest.HandleTyped(h, "file", abi.HostCallFileRemove, guard(f, abi.HostCallFileRemove, f.fileRemove))
	moduletest.HandleTyped(h, "file", abi.HostCallFileStat, guard(f, abi.HostCallFileStat, f.fileStat))
	moduletest.HandleTyped(h, "loop", abi.HostCallLoopAttach, guard(f, abi.HostCallLoopAttach, f.loopAttach))
	moduletest.HandleTyped(h, "loop", abi.HostCallLoopDetach, guard(f, abi.HostCallLoopDetach, f.loopDetach))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmPoolOpen, guard(f, abi.HostCallDmPoolOpen, f.poolOpen))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmPoolStatus, guard(f, abi.HostCallDmPoolStatus, f.poolStatus))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmThinCreate, guard(f, abi.HostCallDmThinCreate, f.thinCreate))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmThinActivate, guard(f, abi.HostCallDmThinActivate, f.thinActivate))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmThinDeactivate, guard(f, abi.HostCallDmThinDeactivate, f.thinDeactivate))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmThinDelete, guard(f, abi.HostCallDmThinDelete, f.thinDelete))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmThinResize, guard(f, abi.HostCallDmThinResize, f.thinResize))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmThinSnapshot, guard(f, abi.HostCallDmThinSnapshot, f.thinSnapshot))
	moduletest.HandleTyped(h, "dm", abi.HostCallDmThinStatus, guard(f, abi.HostCallDmThinStatus, f.thinStatus))
	return f
}

// guard serializes the fake and injects the failures tests ask for.
func guard[Req, Resp any](f *fakeSystem, name string, fn func(*Req) (*Resp, error)) func(*Req) (*Resp, error) {
	return func(r *Req) (*Resp, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if err, ok := f.fail[name]; ok {
			delete(f.fail, name)
			return nil, err
		}
		return fn(r)
	}
}

// install makes the fake answer native host calls for the test's duration.
func (f *fakeSystem) install(t *testing.T) {
	t.Helper()
	hostcall.SetHost(f.host.Native())
	t.Cleanup(func() { hostcall.SetHost(nil) })
}

func errf(code abi.Code, msg string) error { return &abi.Error{Code: code, Message: msg} }

func (f *fakeSystem) fileCreate(r *abi.FileCreateRequest) (*abi.Empty, error) {
	if r.SizeBytes <= 0 {
		return nil, errf(abi.InvalidArgument, "size must be positive")
	}
	if have, ok := f.files[r.Path]; ok {
		if have != r.SizeBytes {
			return nil, errf(abi.AlreadyExists, "exists with size "+strconv.FormatInt(have, 10))
		}
		return &abi.Empty{}, nil
	}
	f.files[r.Path] = r.SizeBytes
	return &abi.Empty{}, nil
}

func (f *fakeSystem) fileResize(r *abi.FileResizeRequest) (*abi.Empty, error) {
	have, ok := f.files[r.Path]
	switch {
	case !ok:
		return nil, errf(abi.NotFound, r.Path)
	case r.SizeBytes < have:
		return nil, errf(abi.InvalidArgument, "shrink")
	}
	f.files[r.Path] = r.SizeBytes
	return &abi.Empty{}, nil
}

func (f *fakeSystem) fileRemove(r *abi.FileRequest) (*abi.Empty, error) {
	delete(f.files, r.Path)
	return &abi.Empty{}, nil
}

func (f *fakeSystem) fileStat(r *abi.FileRequest) (*abi.FileStat, error) {
	have, ok := f.files[r.Path]
	if !ok {
		return nil, errf(abi.NotFound, r.Path)
	}
	return &abi.FileStat{SizeBytes: have}, nil
}

func (f *fakeSystem) loopAttach(r *abi.LoopAttachRequest) (*abi.LoopDevice, error) {
	if _, ok := f.files[r.File]; !ok {
		return nil, errf(abi.NotFound, "no file "+r.File)
	}
	dev, ok := f.loops[r.File]
	if !ok {
		dev = "/dev/loop" + strconv.Itoa(len(f.loops))
		f.loops[r.File] = dev
	}
	return &abi.LoopDevice{Path: dev, File: r.File, SizeBytes: f.files[r.File]}, nil
}

func (f *fakeSystem) loopDetach(r *abi.LoopDeviceRequest) (*abi.Empty, error) {
	for file, dev := range f.loops {
		if dev == r.Device {
			delete(f.loops, file)
		}
	}
	return &abi.Empty{}, nil
}

func (f *fakeSystem) poolOpen(r *abi.DmPoolOpenRequest) (*abi.DmPoolOpenResponse, error) {
	f.opens = append(f.opens, *r)
	formatted := false
	switch {
	case f.pool != nil && (f.pool.name != r.Pool || f.pool.data != r.DataDev || f.pool.meta != r.MetaDev):
		return nil, errf(abi.AlreadyExists, "another pool")
	case f.pool != nil && r.BlockSectors != 0 && r.BlockSectors != f.pool.blockSectors:
		return nil, errf(abi.InvalidArgument, "block size disagrees with the metadata")
	case f.pool == nil && !r.Format:
		return nil, errf(abi.FailedPrecondition, "metadata holds no pool")
	case f.pool == nil && r.BlockSectors == 0:
		return nil, errf(abi.InvalidArgument, "BlockSectors required with Format")
	case f.pool == nil:
		f.pool = &fakePool{name: r.Pool, data: r.DataDev, meta: r.MetaDev, blockSectors: r.BlockSectors, thins: map[uint32]*fakeThin{}}
		formatted = true
	}
	st, _ := f.poolStatus(&abi.DmPoolRequest{Pool: r.Pool})
	return &abi.DmPoolOpenResponse{Path: "/dev/mapper/" + r.Pool, Formatted: formatted, BlockSectors: f.pool.blockSectors, Status: *st}, nil
}

func (f *fakeSystem) poolFor(name string) (*fakePool, error) {
	if f.pool == nil || f.pool.name != name {
		return nil, errf(abi.FailedPrecondition, "dm pool "+name+" is not active; open it first")
	}
	return f.pool, nil
}

func (f *fakeSystem) poolStatus(r *abi.DmPoolRequest) (*abi.DmPoolStatus, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	st := f.status
	st.BlockSectors = p.blockSectors
	return &st, nil
}

func thinPath(pool string, id uint32) string {
	return "/dev/mapper/" + pool + "-" + strconv.FormatUint(uint64(id), 10)
}

func (f *fakeSystem) thinCreate(r *abi.DmThinRequest) (*abi.DmThinResponse, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	if _, ok := p.thins[r.ID]; ok {
		return nil, errf(abi.AlreadyExists, "thin id in use")
	}
	if r.SizeBytes <= 0 || r.SizeBytes%512 != 0 {
		return nil, errf(abi.InvalidArgument, "size")
	}
	p.thins[r.ID] = &fakeThin{active: true, size: r.SizeBytes}
	return &abi.DmThinResponse{Path: thinPath(r.Pool, r.ID)}, nil
}

func (f *fakeSystem) thinActivate(r *abi.DmThinRequest) (*abi.DmThinResponse, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	th, ok := p.thins[r.ID]
	switch {
	case !ok:
		return nil, errf(abi.NotFound, "no thin")
	case r.SizeBytes <= 0 || r.SizeBytes%512 != 0:
		return nil, errf(abi.InvalidArgument, "size")
	case th.active && th.size != r.SizeBytes:
		return nil, errf(abi.AlreadyExists, "active with another size")
	}
	th.active, th.size = true, r.SizeBytes
	return &abi.DmThinResponse{Path: thinPath(r.Pool, r.ID)}, nil
}

func (f *fakeSystem) thinDeactivate(r *abi.DmThinRequest) (*abi.Empty, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	if th, ok := p.thins[r.ID]; ok {
		th.active = false
	}
	return &abi.Empty{}, nil
}

func (f *fakeSystem) thinDelete(r *abi.DmThinRequest) (*abi.Empty, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	if _, ok := p.thins[r.ID]; !ok {
		return nil, errf(abi.NotFound, "no thin")
	}
	delete(p.thins, r.ID)
	return &abi.Empty{}, nil
}

func (f *fakeSystem) thinResize(r *abi.DmThinRequest) (*abi.Empty, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	th, ok := p.thins[r.ID]
	if !ok || !th.active {
		return &abi.Empty{}, nil // the caller's record is the size
	}
	if r.SizeBytes < th.size {
		return nil, errf(abi.InvalidArgument, "shrink")
	}
	th.size = r.SizeBytes
	return &abi.Empty{}, nil
}

func (f *fakeSystem) thinSnapshot(r *abi.DmThinSnapshotRequest) (*abi.Empty, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	if _, ok := p.thins[r.SnapshotID]; ok {
		return nil, errf(abi.AlreadyExists, "snapshot id in use")
	}
	if _, ok := p.thins[r.OriginID]; !ok {
		return nil, errf(abi.NotFound, "no origin")
	}
	p.thins[r.SnapshotID] = &fakeThin{origin: r.OriginID}
	return &abi.Empty{}, nil
}

func (f *fakeSystem) thinStatus(r *abi.DmThinRequest) (*abi.DmThinStatus, error) {
	p, err := f.poolFor(r.Pool)
	if err != nil {
		return nil, err
	}
	th, ok := p.thins[r.ID]
	switch {
	case !ok:
		return &abi.DmThinStatus{}, nil
	case !th.active:
		return &abi.DmThinStatus{Exists: true}, nil
	}
	return &abi.DmThinStatus{Exists: true, Active: true, Path: thinPath(r.Pool, r.ID), SizeBytes: th.size, Failed: f.status.Failed}, nil
}

// thin returns thin id of the pool, or nil.
func (f *fakeSystem) thin(id uint32) *fakeThin {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pool == nil {
		return nil
	}
	return f.pool.thins[id]
}

// file returns a file's size and whether it exists.
func (f *fakeSystem) file(path string) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.files[path]
	return n, ok
}

// records lists the record files of the state folder.
func (f *fakeSystem) records() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for p := range f.files {
		if strings.HasPrefix(p, testState+"/") {
			out = append(out, p)
		}
	}
	return out
}

func (f *fakeSystem) failNext(name string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[name] = err
}
