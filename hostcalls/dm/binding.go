package dm

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

// Family is the grant that allows the device-mapper host calls.
const Family = "dm"

// Bindings returns the "dm" host calls (see abi/hc_dm.go). The caller's
// roots hold two kinds of grant: device-mapper name prefixes (no leading
// slash), which every pool name must start with, and absolute paths of the
// block devices (or folders of them) a pool may be built on.
func Bindings() []hostcalls.Func {
	calls := []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallDmPoolOpen, poolOpen),
		hostcalls.Typed(Family, abi.HostCallDmPoolStatus, poolStatus),
		hostcalls.Typed(Family, abi.HostCallDmThinCreate, thinCall(func(ctx context.Context, p *Pool, id uint32, size uint64) (string, error) {
			return p.CreateThin(ctx, id, size)
		})),
		hostcalls.Typed(Family, abi.HostCallDmThinActivate, thinCall(func(ctx context.Context, p *Pool, id uint32, size uint64) (string, error) {
			return p.ActivateThin(ctx, id, size)
		})),
		hostcalls.Typed(Family, abi.HostCallDmThinResize, thinResize),
		hostcalls.Typed(Family, abi.HostCallDmThinDeactivate, thinIDCall((*Pool).DeactivateThin)),
		hostcalls.Typed(Family, abi.HostCallDmThinDelete, thinIDCall((*Pool).DeleteThin)),
		hostcalls.Typed(Family, abi.HostCallDmThinSnapshot, thinSnapshot),
		hostcalls.Typed(Family, abi.HostCallDmThinStatus, thinStatus),
	}
	for i := range calls {
		calls[i].Available = Available
	}
	return calls
}

// grants splits env.Roots into a Mapper for the granted name prefixes and
// the granted device roots.
func grants(env *hostcalls.Env) (*Mapper, []string, error) {
	var prefixes, devices []string
	for _, r := range env.Roots {
		if strings.HasPrefix(r, "/") {
			devices = append(devices, r)
		} else {
			prefixes = append(prefixes, r)
		}
	}
	if len(prefixes) == 0 {
		return nil, nil, abi.Errorf(abi.PermissionDenied, "dm: no device-mapper name prefix granted")
	}
	m, err := New(prefixes...)
	return m, devices, err
}

func poolOpen(ctx context.Context, env *hostcalls.Env, req *abi.DmPoolOpenRequest) (*abi.DmPoolOpenResponse, error) {
	m, devices, err := grants(env)
	if err != nil {
		return nil, err
	}
	if err := m.confine(req.Pool); err != nil {
		return nil, err
	}
	meta, err := poolDevice(ctx, devices, req.MetaDev)
	if err != nil {
		return nil, fmt.Errorf("dm pool %s metadata device: %w", req.Pool, err)
	}
	data, err := poolDevice(ctx, devices, req.DataDev)
	if err != nil {
		return nil, fmt.Errorf("dm pool %s data device: %w", req.Pool, err)
	}
	cfg := Pool{Name: req.Pool, MetaDev: meta, DataDev: data, BlockSectors: req.BlockSectors, LowWater: req.LowWaterBlocks}
	formatted := false
	var p *Pool
	if req.Format {
		info, err := m.Info(ctx, req.Pool)
		if err != nil {
			return nil, err
		}
		has, err := HasPoolMetadata(meta)
		if err != nil {
			return nil, fmt.Errorf("dm pool %s: %w", req.Pool, err)
		}
		if !has && !info.Exists {
			if p, err = m.CreatePool(ctx, cfg); err != nil {
				return nil, err
			}
			formatted = true
			if env.Log != nil {
				env.Log.Info("dm pool formatted", "pool", req.Pool, "metadata", meta, "data", data)
			}
		}
	}
	if p == nil {
		if p, err = m.OpenPool(ctx, cfg); err != nil {
			return nil, err
		}
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, err
	}
	return &abi.DmPoolOpenResponse{Path: p.Path(), Formatted: formatted, BlockSectors: p.BlockSectors, Status: wireStatus(st)}, nil
}

// poolDevice confines a pool's device to the granted device roots, or, for
// a loop device, to a backing file inside them: a module that keeps its
// pool in files attaches them with loop_attach and cannot know the device
// numbers the operator would otherwise have to grant.
func poolDevice(ctx context.Context, roots []string, dev string) (string, error) {
	clean, err := hostcalls.Confine(roots, dev, true)
	if err == nil {
		return clean, nil
	}
	if !strings.HasPrefix(filepath.Base(dev), "loop") {
		return "", err
	}
	if d, bound, lerr := loop.Status(ctx, dev); lerr == nil && bound {
		if _, ferr := hostcalls.Confine(roots, d.BackingFile, false); ferr == nil {
			return dev, nil
		}
	}
	return "", err
}

func poolStatus(ctx context.Context, env *hostcalls.Env, req *abi.DmPoolRequest) (*abi.DmPoolStatus, error) {
	m, _, err := grants(env)
	if err != nil {
		return nil, err
	}
	p, err := m.AttachPool(ctx, req.Pool)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, err
	}
	s := wireStatus(st)
	return &s, nil
}

func wireStatus(s PoolStatus) abi.DmPoolStatus {
	return abi.DmPoolStatus{
		TransactionID: s.TransactionID, UsedMetaBlocks: s.UsedMetaBlocks, TotalMetaBlocks: s.TotalMetaBlocks,
		UsedDataBlocks: s.UsedDataBlocks, TotalDataBlocks: s.TotalDataBlocks, BlockSectors: s.BlockSectors,
		ReadOnly: s.ReadOnly, OutOfDataSpace: s.OutOfDataSpace, NeedsCheck: s.NeedsCheck, Failed: s.Failed,
	}
}

// thinCall adapts a thin operation that answers a node.
func thinCall(op func(context.Context, *Pool, uint32, uint64) (string, error)) func(context.Context, *hostcalls.Env, *abi.DmThinRequest) (*abi.DmThinResponse, error) {
	return func(ctx context.Context, env *hostcalls.Env, req *abi.DmThinRequest) (*abi.DmThinResponse, error) {
		sectors, err := sizeSectors(req)
		if err != nil {
			return nil, err
		}
		p, err := attach(ctx, env, req.Pool)
		if err != nil {
			return nil, err
		}
		path, err := op(ctx, p, req.ID, sectors)
		if err != nil {
			return nil, err
		}
		return &abi.DmThinResponse{Path: path}, nil
	}
}

func thinResize(ctx context.Context, env *hostcalls.Env, req *abi.DmThinRequest) (*abi.Empty, error) {
	sectors, err := sizeSectors(req)
	if err != nil {
		return nil, err
	}
	p, err := attach(ctx, env, req.Pool)
	if err != nil {
		return nil, err
	}
	return &abi.Empty{}, p.ResizeThin(ctx, req.ID, sectors)
}

// sizeSectors converts a request's size: a positive multiple of 512 bytes.
func sizeSectors(req *abi.DmThinRequest) (uint64, error) {
	if req.SizeBytes <= 0 || req.SizeBytes%SectorSize != 0 {
		return 0, abi.Errorf(abi.InvalidArgument, "dm thin %d: size %d bytes is not a positive multiple of %d", req.ID, req.SizeBytes, SectorSize)
	}
	return uint64(req.SizeBytes) / SectorSize, nil
}

func thinIDCall(op func(*Pool, context.Context, uint32) error) func(context.Context, *hostcalls.Env, *abi.DmThinRequest) (*abi.Empty, error) {
	return func(ctx context.Context, env *hostcalls.Env, req *abi.DmThinRequest) (*abi.Empty, error) {
		p, err := attach(ctx, env, req.Pool)
		if err != nil {
			return nil, err
		}
		return &abi.Empty{}, op(p, ctx, req.ID)
	}
}

func thinSnapshot(ctx context.Context, env *hostcalls.Env, req *abi.DmThinSnapshotRequest) (*abi.Empty, error) {
	p, err := attach(ctx, env, req.Pool)
	if err != nil {
		return nil, err
	}
	return &abi.Empty{}, p.Snapshot(ctx, req.OriginID, req.SnapshotID)
}

func thinStatus(ctx context.Context, env *hostcalls.Env, req *abi.DmThinRequest) (*abi.DmThinStatus, error) {
	p, err := attach(ctx, env, req.Pool)
	if err != nil {
		return nil, err
	}
	st, err := p.ThinState(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return &abi.DmThinStatus{Exists: st.Exists, Active: st.Active, Path: st.Path, SizeBytes: int64(st.Sectors * SectorSize),
		MappedBytes: int64(st.MappedSectors * SectorSize), Failed: st.Failed}, nil
}

func attach(ctx context.Context, env *hostcalls.Env, pool string) (*Pool, error) {
	m, _, err := grants(env)
	if err != nil {
		return nil, err
	}
	return m.AttachPool(ctx, pool)
}
