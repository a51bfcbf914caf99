//go:build !wasip1

package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
	"github.com/wasmcsi/wasmcsi/sdk"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// fakePool is an in-memory pool folder and loop driver behind a FakeHost,
// with the semantics of abi/hc_file.go and abi/hc_loop.go, for native tests
// of the module's logic.
type fakePool struct {
	host     *moduletest.FakeHost
	root     string
	files    map[string]int64  // path -> size
	alloc    map[string]int64  // path -> bytes allocated to it alone
	attached map[string]string // path -> device
	readOnly map[string]bool   // path -> attached read-only
	directIO map[string]bool   // path -> attached with direct I/O
	devSize  map[string]int64  // device -> size it shows
	total    int64
	avail    int64
	// failResize makes file_resize fail with this code.
	failResize abi.Code
}

// newFakePool installs a fake host for this test and a backend configured
// with the pool "/pool", node "n1" and cfg.
func newFakePool(t *testing.T, cfg map[string]string) (*fakePool, *Backend) {
	t.Helper()
	p := &fakePool{
		host: &moduletest.FakeHost{}, root: "/pool",
		files: map[string]int64{}, alloc: map[string]int64{}, attached: map[string]string{}, readOnly: map[string]bool{},
		directIO: map[string]bool{}, devSize: map[string]int64{},
		total: 100 * sdk.GiB, avail: 50 * sdk.GiB,
	}
	p.install()
	hostcall.SetHost(p.host.Native())
	t.Cleanup(func() { hostcall.SetHost(nil) })
	b := New()
	if err := b.Configure(&abi.ConfigureRequest{Config: cfg, Roots: []string{p.root}, NodeID: "n1", Role: "all"}); err != nil {
		t.Fatalf("configure %v: %v", cfg, err)
	}
	return p, b
}

func (p *fakePool) inPool(path string) error {
	if dirOf(path) != p.root {
		return abi.Errorf(abi.PermissionDenied, "%s is outside the granted roots", path)
	}
	if strings.HasPrefix(baseOf(path), ".") {
		return abi.Errorf(abi.InvalidArgument, "bad name %s", path)
	}
	return nil
}

func (p *fakePool) install() {
	f := p.host
	moduletest.HandleTyped(f, "file", abi.HostCallFileCreate, func(r *abi.FileCreateRequest) (*abi.Empty, error) {
		if err := p.inPool(r.Path); err != nil {
			return nil, err
		}
		if size, ok := p.files[r.Path]; ok {
			if size == r.SizeBytes {
				return &abi.Empty{}, nil
			}
			return nil, abi.Errorf(abi.AlreadyExists, "%s exists with another size", r.Path)
		}
		if r.Prealloc {
			if r.SizeBytes > p.avail {
				return nil, abi.Errorf(abi.ResourceExhausted, "no room for %s", r.Path)
			}
			p.avail -= r.SizeBytes
			p.alloc[r.Path] = r.SizeBytes
		}
		p.files[r.Path] = r.SizeBytes
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileResize, func(r *abi.FileResizeRequest) (*abi.Empty, error) {
		size, ok := p.files[r.Path]
		switch {
		case !ok:
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.Path)
		case p.failResize != abi.OK:
			return nil, abi.Errorf(p.failResize, "injected resize failure")
		case r.SizeBytes < size:
			return nil, abi.Errorf(abi.InvalidArgument, "cannot shrink %s", r.Path)
		case r.Prealloc && r.SizeBytes-p.alloc[r.Path] > p.avail:
			return nil, abi.Errorf(abi.ResourceExhausted, "no room to grow %s", r.Path)
		}
		if r.Prealloc {
			// Every block of the file, its old holes too.
			p.avail -= r.SizeBytes - p.alloc[r.Path]
			p.alloc[r.Path] = r.SizeBytes
		}
		p.files[r.Path] = r.SizeBytes
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileRemove, func(r *abi.FileRequest) (*abi.Empty, error) {
		if _, ok := p.attached[r.Path]; ok {
			return nil, abi.Errorf(abi.FailedPrecondition, "%s is attached", r.Path)
		}
		p.avail += p.alloc[r.Path]
		delete(p.files, r.Path)
		delete(p.alloc, r.Path)
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileClone, func(r *abi.FileCloneRequest) (*abi.Empty, error) {
		if err := p.inPool(r.Target); err != nil {
			return nil, err
		}
		size, ok := p.files[r.Source]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.Source)
		}
		if _, ok := p.files[r.Target]; ok {
			return nil, abi.Errorf(abi.AlreadyExists, "%s exists", r.Target)
		}
		p.files[r.Target] = size
		return &abi.Empty{}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileStat, func(r *abi.FileRequest) (*abi.FileStat, error) {
		size, ok := p.files[r.Path]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.Path)
		}
		return &abi.FileStat{SizeBytes: size, AllocatedBytes: p.alloc[r.Path]}, nil
	})
	moduletest.HandleTyped(f, "file", abi.HostCallFileStatfs, func(r *abi.FileRequest) (*abi.FileStatfs, error) {
		if r.Path != p.root {
			return nil, abi.Errorf(abi.InvalidArgument, "%s is not a pool folder", r.Path)
		}
		return &abi.FileStatfs{TotalBytes: p.total, AvailableBytes: p.avail, UsedBytes: p.total - p.avail}, nil
	})
	moduletest.HandleTyped(f, "loop", abi.HostCallLoopAttach, func(r *abi.LoopAttachRequest) (*abi.LoopDevice, error) {
		size, ok := p.files[r.File]
		if !ok {
			return nil, abi.Errorf(abi.NotFound, "%s not found", r.File)
		}
		if dev, ok := p.attached[r.File]; ok {
			if p.readOnly[r.File] != r.ReadOnly {
				return nil, abi.Errorf(abi.FailedPrecondition, "%s is attached with the other read-only mode", r.File)
			}
			return &abi.LoopDevice{Path: dev, File: r.File, SizeBytes: p.devSize[dev], ReadOnly: r.ReadOnly}, nil
		}
		dev := "/dev/loop" + strconv.Itoa(len(p.devSize))
		p.attached[r.File], p.readOnly[r.File], p.directIO[r.File], p.devSize[dev] = dev, r.ReadOnly, r.DirectIO, size
		return &abi.LoopDevice{Path: dev, File: r.File, SizeBytes: size, ReadOnly: r.ReadOnly, DirectIO: r.DirectIO}, nil
	})
	moduletest.HandleTyped(f, "loop", abi.HostCallLoopFind, func(r *abi.LoopFileRequest) (*abi.LoopFindResponse, error) {
		dev, ok := p.attached[r.File]
		if !ok {
			return &abi.LoopFindResponse{}, nil
		}
		return &abi.LoopFindResponse{Found: true, Device: abi.LoopDevice{Path: dev, File: r.File, SizeBytes: p.devSize[dev]}}, nil
	})
	moduletest.HandleTyped(f, "loop", abi.HostCallLoopResize, func(r *abi.LoopDeviceRequest) (*abi.LoopResizeResponse, error) {
		for file, dev := range p.attached {
			if dev == r.Device {
				p.devSize[dev] = p.files[file]
				return &abi.LoopResizeResponse{SizeBytes: p.devSize[dev]}, nil
			}
		}
		return nil, abi.Errorf(abi.NotFound, "%s is not attached", r.Device)
	})
	moduletest.HandleTyped(f, "loop", abi.HostCallLoopDetach, func(r *abi.LoopDeviceRequest) (*abi.Empty, error) {
		for file, dev := range p.attached {
			if dev == r.Device {
				delete(p.attached, file)
			}
		}
		return &abi.Empty{}, nil
	})
}

// mark returns a function that lists the host calls made since mark was
// called, joined by spaces.
func (p *fakePool) mark() func() string {
	n := len(p.host.Calls())
	return func() string { return strings.Join(p.host.Calls()[n:], " ") }
}

// codeOf is abi.CodeOf, named for readability in test tables.
func codeOf(err error) abi.Code { return abi.CodeOf(err) }
