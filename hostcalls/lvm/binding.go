package lvm

import (
	"context"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the LVM host calls.
const Family = "lvm"

// RootPrefix starts every root of the family: "lvm:VG" grants thick LVs of
// VG, "lvm:VG:POOL" thin LVs of its thin pool POOL. No slash, so the
// daemon's configuration never takes one for a path.
const RootPrefix = "lvm:"

// Bindings returns the "lvm" host calls (see abi/hc_lvm.go) over the real
// lvm tool.
func Bindings() []hostcalls.Func { return BindingsWith(Tool{}) }

// BindingsWith returns the host calls over run (tests pass a fake).
func BindingsWith(run Runner) []hostcalls.Func {
	m := Manager{Run: run}
	calls := []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallLvmVgStatus, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmVgRequest) (*abi.LvmVgStatus, error) {
			g := parseGrants(env.Roots)
			if err := g.vgVisible(req.VG); err != nil {
				return nil, err
			}
			vg, err := m.VG(ctx, req.VG)
			if err != nil {
				return nil, err
			}
			return &abi.LvmVgStatus{VG: vg.Name, SizeBytes: vg.Size, FreeBytes: vg.Free, ExtentBytes: vg.Extent, PVCount: int32(vg.PVs), MissingPVs: int32(vg.Mis)}, nil
		}),
		hostcalls.Typed(Family, abi.HostCallLvmPoolStatus, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmPoolRequest) (*abi.LvmPoolStatus, error) {
			if err := parseGrants(env.Roots).lvAllowed(req.VG, req.Pool); err != nil {
				return nil, err
			}
			pool, err := m.Pool(ctx, req.VG, req.Pool)
			if err != nil {
				return nil, err
			}
			st := pool.poolStatus()
			return &st, nil
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvCreate, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmCreateRequest) (*abi.LvmLv, error) {
			if err := checkCreate(req); err != nil {
				return nil, err
			}
			if err := parseGrants(env.Roots).lvAllowed(req.VG, req.ThinPool); err != nil {
				return nil, err
			}
			lv, err := m.create(ctx, req, parseGrants(env.Roots).lvAllowed)
			if err == nil && !lv.Existed && env.Log != nil {
				env.Log.Info("lvm LV created", "vg", req.VG, "lv", req.Name, "pool", req.ThinPool, "bytes", lv.SizeBytes)
			}
			return &lv, err
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvRemove, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmLvRequest) (*abi.Empty, error) {
			lv, err := lvOf(ctx, m, env, req.VG, req.Name)
			if err != nil {
				return nil, err
			}
			if err := m.removeRow(ctx, lv); err != nil {
				return nil, err
			}
			if env.Log != nil {
				env.Log.Info("lvm LV removed", "vg", req.VG, "lv", req.Name)
			}
			return &abi.Empty{}, nil
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvExtend, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmExtendRequest) (*abi.LvmLv, error) {
			if req.SizeBytes <= 0 {
				return nil, abi.Errorf(abi.InvalidArgument, "lvm: size %d bytes", req.SizeBytes)
			}
			row, err := lvOf(ctx, m, env, req.VG, req.Name)
			if err != nil {
				return nil, err
			}
			lv, err := m.extendRow(ctx, row, req.SizeBytes)
			return &lv, err
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvSnapshot, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmSnapshotRequest) (*abi.LvmLv, error) {
			if err := checkName("LV", req.Name); err != nil {
				return nil, err
			}
			if err := checkTags(req.Tags); err != nil {
				return nil, err
			}
			if _, err := lvOf(ctx, m, env, req.VG, req.Origin); err != nil {
				return nil, err
			}
			lv, err := m.snapshot(ctx, req, parseGrants(env.Roots).lvAllowed)
			return &lv, err
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvActivate, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmLvRequest) (*abi.LvmLv, error) {
			row, err := lvOf(ctx, m, env, req.VG, req.Name)
			if err != nil {
				return nil, err
			}
			lv, err := m.activateRow(ctx, row)
			return &lv, err
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvDeactivate, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmLvRequest) (*abi.Empty, error) {
			row, err := lvOf(ctx, m, env, req.VG, req.Name)
			if err != nil {
				return nil, err
			}
			return &abi.Empty{}, m.deactivateRow(ctx, row)
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvStatus, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmLvRequest) (*abi.LvmLv, error) {
			lv, err := lvOf(ctx, m, env, req.VG, req.Name)
			if err != nil {
				return nil, err
			}
			w := lv.wire()
			return &w, nil
		}),
		hostcalls.Typed(Family, abi.HostCallLvmLvList, func(ctx context.Context, env *hostcalls.Env, req *abi.LvmListRequest) (*abi.LvmLvList, error) {
			g := parseGrants(env.Roots)
			if err := g.vgVisible(req.VG); err != nil {
				return nil, err
			}
			if req.ThinPool != "" {
				if err := g.lvAllowed(req.VG, req.ThinPool); err != nil {
					return nil, err
				}
			}
			lvs, err := m.List(ctx, req.VG, func(lv *lvRow) bool {
				return g.lvAllowed(lv.VG, lv.Pool) == nil && (req.ThinPool == "" || lv.Pool == req.ThinPool) &&
					(req.Tag == "" || hasTag(lv.Tags, req.Tag))
			})
			if err != nil {
				return nil, err
			}
			return &abi.LvmLvList{LVs: lvs}, nil
		}),
	}
	for i := range calls {
		calls[i].Available = Available
	}
	return calls
}

// lvOf finds tagged LV name of vg and checks the grants cover it: its VG
// for a thick LV, its pool for a thin one. A VG no root names is
// PERMISSION_DENIED before lvm runs.
func lvOf(ctx context.Context, m Manager, env *hostcalls.Env, vg, name string) (lvRow, error) {
	if err := checkName("VG", vg); err != nil {
		return lvRow{}, err
	}
	if err := checkName("LV", name); err != nil {
		return lvRow{}, err
	}
	g := parseGrants(env.Roots)
	if err := g.vgVisible(vg); err != nil {
		return lvRow{}, err
	}
	lv, err := m.Owned(ctx, vg, name)
	if err != nil {
		return lvRow{}, err
	}
	if err := g.lvAllowed(vg, lv.Pool); err != nil {
		return lvRow{}, err
	}
	return lv, nil
}

func hasTag(tags []string, t string) bool {
	for _, x := range tags {
		if x == t {
			return true
		}
	}
	return false
}

// grants are a module's "lvm:" roots: VGs granted for thick LVs, and
// thin pools by VG.
type grants struct {
	vgs   map[string]bool
	pools map[string]map[string]bool
}

func parseGrants(roots []string) grants {
	g := grants{vgs: map[string]bool{}, pools: map[string]map[string]bool{}}
	for _, r := range roots {
		rest, ok := strings.CutPrefix(r, RootPrefix)
		if !ok {
			continue
		}
		vg, pool, thin := strings.Cut(rest, ":")
		if checkName("VG", vg) != nil {
			continue
		}
		if !thin {
			g.vgs[vg] = true
			continue
		}
		if checkName("LV", pool) != nil {
			continue
		}
		if g.pools[vg] == nil {
			g.pools[vg] = map[string]bool{}
		}
		g.pools[vg][pool] = true
	}
	return g
}

// vgVisible: some root names vg (as a VG or through one of its pools).
func (g grants) vgVisible(vg string) error {
	if g.vgs[vg] || len(g.pools[vg]) > 0 {
		return nil
	}
	return abi.Errorf(abi.PermissionDenied, "lvm: volume group %q is not granted (grant a root lvm:%s or lvm:%s:POOL)", vg, vg, vg)
}

// lvAllowed: a thick LV (pool "") needs its VG granted, a thin LV its pool.
func (g grants) lvAllowed(vg, pool string) error {
	if pool == "" {
		if g.vgs[vg] {
			return nil
		}
		return abi.Errorf(abi.PermissionDenied, "lvm: thick LVs of volume group %q are not granted (root lvm:%s)", vg, vg)
	}
	if g.pools[vg][pool] {
		return nil
	}
	return abi.Errorf(abi.PermissionDenied, "lvm: thin pool %s/%s is not granted (root lvm:%s:%s)", vg, pool, vg, pool)
}

// LVM's own limits on names (lvm(8), "VALID NAMES"): A-Z a-z 0-9 + _ . -,
// not starting with "-", not "." or "..", and for LVs none of the
// suffixes LVM uses for hidden sub-LVs nor the prefixes "snapshot" and
// "pvmove".
var reservedLV = []string{"_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_imeta", "_iorig", "_mimage", "_mlog",
	"_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig"}

func checkName(what, name string) error {
	bad := func(why string) error {
		return abi.Errorf(abi.InvalidArgument, "lvm: %s name %q: %s", what, name, why)
	}
	if name == "" || name == "." || name == ".." || name[0] == '-' || len(name) > 127 {
		return bad("want 1 to 127 bytes, not starting with - and not . or ..")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '_' || c == '.' || c == '-') {
			return bad("only A-Z a-z 0-9 + _ . - are allowed")
		}
	}
	if what == "LV" {
		if strings.HasPrefix(name, "snapshot") || strings.HasPrefix(name, "pvmove") {
			return bad("LVM reserves names starting with snapshot or pvmove")
		}
		for _, r := range reservedLV {
			if strings.Contains(name, r) {
				return bad("LVM reserves " + r + " for its hidden LVs")
			}
		}
	}
	return nil
}

// checkTags allows LVM's tag characters (A-Z a-z 0-9 _ + . - / = ! : & #),
// at most 1024 bytes, not starting with "-".
func checkTags(tags []string) error {
	for _, t := range tags {
		if t == "" || len(t) > 1024 || t[0] == '-' {
			return abi.Errorf(abi.InvalidArgument, "lvm: tag %q: want 1 to 1024 bytes, not starting with -", t)
		}
		for i := 0; i < len(t); i++ {
			c := t[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_+.-/=!:&#", c) >= 0) {
				return abi.Errorf(abi.InvalidArgument, "lvm: tag %q: only A-Z a-z 0-9 _ + . - / = ! : & # are allowed", t)
			}
		}
	}
	return nil
}

func checkCreate(req *abi.LvmCreateRequest) error {
	if err := checkName("VG", req.VG); err != nil {
		return err
	}
	if err := checkName("LV", req.Name); err != nil {
		return err
	}
	if req.ThinPool != "" {
		if err := checkName("LV", req.ThinPool); err != nil {
			return err
		}
		if req.Stripes > 1 || req.Mirrors > 0 {
			return abi.Errorf(abi.InvalidArgument, "lvm: stripes and mirrors are the thin pool's, not a thin LV's")
		}
	}
	if req.SizeBytes <= 0 || req.SizeBytes%512 != 0 {
		return abi.Errorf(abi.InvalidArgument, "lvm: size %d bytes is not a positive multiple of 512", req.SizeBytes)
	}
	if req.Stripes < 0 || req.Stripes > 128 || req.Mirrors < 0 || req.Mirrors > 9 || req.StripeBytes < 0 ||
		req.StripeBytes != 0 && (req.StripeBytes < 4096 || req.StripeBytes&(req.StripeBytes-1) != 0) {
		return abi.Errorf(abi.InvalidArgument, "lvm: stripes %d (stripe size %d bytes), mirrors %d: want 0-128 stripes of a power of two from 4 KiB, 0-9 mirrors",
			req.Stripes, req.StripeBytes, req.Mirrors)
	}
	return checkTags(req.Tags)
}
