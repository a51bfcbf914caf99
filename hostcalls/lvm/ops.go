package lvm

import (
	"context"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Manager runs the family's operations with a Runner. It holds no lock:
// LVM serializes the commands on one VG with its own VG lock, and every
// operation here is one command or a check followed by one.
type Manager struct {
	Run Runner
}

func reportArgs(cmd string, fields []string) []string {
	return []string{cmd, "--reportformat", "json", "--units", "b", "--nosuffix", "-o", strings.Join(fields, ",")}
}

// VG reports volume group vg.
func (m Manager) VG(ctx context.Context, vg string) (vgRow, error) {
	out, err := m.Run.Run(ctx, append(reportArgs("vgs", vgFields), "--", vg)...)
	if err != nil {
		return vgRow{}, err
	}
	rs, err := rows(out, "vg")
	if err != nil {
		return vgRow{}, err
	}
	for _, r := range rs {
		if r["vg_name"] == vg {
			return parseVG(r)
		}
	}
	return vgRow{}, abi.Errorf(abi.NotFound, "lvm: volume group %s not found", vg)
}

// LVs lists the LVs of vg, tagged or not (no hidden ones).
func (m Manager) LVs(ctx context.Context, vg string) ([]lvRow, error) {
	out, err := m.Run.Run(ctx, append(reportArgs("lvs", lvFields), "--", vg)...)
	if err != nil {
		return nil, err
	}
	return parseLVs(out)
}

func parseLVs(out []byte) ([]lvRow, error) {
	rs, err := rows(out, "lv")
	if err != nil {
		return nil, err
	}
	lvs := make([]lvRow, 0, len(rs))
	for _, r := range rs {
		lv, err := parseLV(r)
		if err != nil {
			return nil, err
		}
		lvs = append(lvs, lv)
	}
	return lvs, nil
}

// lookup finds LV name of vg, tagged or not; ok is false when vg has no LV
// of that name.
func (m Manager) lookup(ctx context.Context, vg, name string) (lvRow, bool, error) {
	out, err := m.Run.Run(ctx, append(reportArgs("lvs", lvFields), "--", vg+"/"+name)...)
	if abi.CodeOf(err) == abi.NotFound {
		return lvRow{}, false, nil
	}
	if err != nil {
		return lvRow{}, false, err
	}
	lvs, err := parseLVs(out)
	if err != nil {
		return lvRow{}, false, err
	}
	for _, lv := range lvs {
		if lv.VG == vg && lv.Name == name {
			return lv, true, nil
		}
	}
	return lvRow{}, false, nil
}

// Owned finds tagged LV name of vg: an LV without the owner tag is
// NOT_FOUND, as a missing one is.
func (m Manager) Owned(ctx context.Context, vg, name string) (lvRow, error) {
	lv, ok, err := m.lookup(ctx, vg, name)
	if err != nil {
		return lvRow{}, err
	}
	if !ok || !lv.owned() {
		return lvRow{}, abi.Errorf(abi.NotFound, "lvm: no logical volume %s/%s of wasmcsi's", vg, name)
	}
	return lv, nil
}

// Pool reports thin pool pool of vg.
func (m Manager) Pool(ctx context.Context, vg, pool string) (lvRow, error) {
	lv, ok, err := m.lookup(ctx, vg, pool)
	if err != nil {
		return lvRow{}, err
	}
	if !ok || !strings.HasPrefix(lv.Segtype, "thin-pool") {
		return lvRow{}, abi.Errorf(abi.NotFound, "lvm: no thin pool %s/%s", vg, pool)
	}
	return lv, nil
}

func bytesArg(n int64) string { return strconv.FormatInt(n, 10) + "b" }

func tagArgs(tags []string) []string {
	args := []string{"--addtag", abi.LvmOwnerTag}
	for _, t := range tags {
		args = append(args, "--addtag", t)
	}
	return args
}

// Create makes the LV req describes (see abi.LvmCreateRequest).
func (m Manager) Create(ctx context.Context, req *abi.LvmCreateRequest) (abi.LvmLv, error) {
	return m.create(ctx, req, nil)
}

// create is Create; an LV of that name found already must also pass
// allowed (the caller's grants; nil: any) and be in the pool asked for,
// or it is ALREADY_EXISTS and left as it is.
func (m Manager) create(ctx context.Context, req *abi.LvmCreateRequest, allowed func(vg, pool string) error) (abi.LvmLv, error) {
	same := func(lv lvRow) error {
		if lv.Pool != req.ThinPool {
			return abi.Errorf(abi.AlreadyExists, "lvm: %s/%s exists in pool %q, not %q: left alone", lv.VG, lv.Name, lv.Pool, req.ThinPool)
		}
		return checkAllowed(allowed, lv)
	}
	if lv, ok, err := m.lookup(ctx, req.VG, req.Name); err != nil {
		return abi.LvmLv{}, err
	} else if ok {
		return m.existing(ctx, lv, req.Activate, same)
	}
	args := []string{"lvcreate", "--yes", "-n", req.Name}
	if req.ThinPool != "" {
		pool, err := m.Pool(ctx, req.VG, req.ThinPool)
		if err != nil {
			return abi.LvmLv{}, err
		}
		if st := pool.poolStatus(); st.Failed || st.ReadOnly || st.OutOfDataSpace {
			return abi.LvmLv{}, abi.Errorf(abi.ResourceExhausted, "lvm: thin pool %s/%s takes no new volume (%s)", req.VG, req.ThinPool, poolTrouble(st))
		}
		args = append(args, "-V", bytesArg(req.SizeBytes), "--thinpool", req.ThinPool)
	} else {
		vg, err := m.VG(ctx, req.VG)
		if err != nil {
			return abi.LvmLv{}, err
		}
		need := roundUp(req.SizeBytes, vg.Extent) * int64(max(1, req.Mirrors+1))
		if need > vg.Free {
			return abi.LvmLv{}, abi.Errorf(abi.ResourceExhausted, "lvm: volume group %s has %d bytes free, %s needs %d", req.VG, vg.Free, req.Name, need)
		}
		args = append(args, "-L", bytesArg(req.SizeBytes), "--zero", "y", "--wipesignatures", "y")
		if req.Stripes > 1 {
			args = append(args, "-i", strconv.Itoa(int(req.Stripes)))
			if req.StripeBytes > 0 {
				args = append(args, "-I", strconv.FormatInt(req.StripeBytes/1024, 10)+"k")
			}
		}
		if req.Mirrors > 0 {
			args = append(args, "--type", "raid1", "-m", strconv.Itoa(int(req.Mirrors)), "--nosync")
		}
	}
	// A thick LV is created active (zeroing and wiping need the device)
	// and deactivated after when asked; a thin LV reads zeros where
	// nothing was written and is created as asked.
	if req.ThinPool != "" && !req.Activate {
		args = append(args, "-a", "n")
	} else {
		args = append(args, "-a", "y")
	}
	args = append(args, tagArgs(req.Tags)...)
	args = append(args, "--", req.VG)
	if _, err := m.Run.Run(ctx, args...); err != nil {
		if abi.CodeOf(err) == abi.AlreadyExists {
			// A concurrent create of the same name won.
			if lv, ok, lerr := m.lookup(ctx, req.VG, req.Name); lerr == nil && ok {
				return m.existing(ctx, lv, req.Activate, same)
			}
		}
		return abi.LvmLv{}, err
	}
	lv, err := m.Owned(ctx, req.VG, req.Name)
	if err != nil {
		return abi.LvmLv{}, err
	}
	return m.settle(ctx, lv, req.Activate, false)
}

// existing answers an LV a create or snapshot found already there.
func (m Manager) existing(ctx context.Context, lv lvRow, activate bool, same func(lvRow) error) (abi.LvmLv, error) {
	if !lv.owned() {
		return abi.LvmLv{}, abi.Errorf(abi.AlreadyExists, "lvm: %s/%s exists and is not wasmcsi's (no tag %s): left alone", lv.VG, lv.Name, abi.LvmOwnerTag)
	}
	if err := same(lv); err != nil {
		return abi.LvmLv{}, err
	}
	return m.settle(ctx, lv, activate, true)
}

// checkAllowed asks allowed (nil: anything goes) about lv's VG and pool.
func checkAllowed(allowed func(vg, pool string) error, lv lvRow) error {
	if allowed == nil {
		return nil
	}
	return allowed(lv.VG, lv.Pool)
}

// settle leaves a tagged LV active or not as asked and answers it.
func (m Manager) settle(ctx context.Context, lv lvRow, activate, existed bool) (abi.LvmLv, error) {
	var out abi.LvmLv
	var err error
	if activate {
		out, err = m.activateRow(ctx, lv)
	} else if existed {
		out = lv.wire() // in use perhaps: left as it is
	} else {
		err = m.deactivateRow(ctx, lv)
		out = lv.wire()
		out.Active, out.Path, out.Major, out.Minor, out.MappedBytes = false, "", 0, 0, 0
	}
	out.Existed = existed
	return out, err
}

func poolTrouble(st abi.LvmPoolStatus) string {
	switch {
	case st.Failed:
		return "failed"
	case st.OutOfDataSpace:
		return "out of data space"
	case st.ReadOnly:
		return "read-only"
	}
	return "healthy"
}

func roundUp(n, unit int64) int64 {
	if unit <= 0 {
		return n
	}
	return (n + unit - 1) / unit * unit
}

// Status answers tagged LV name of vg.
func (m Manager) Status(ctx context.Context, vg, name string) (abi.LvmLv, error) {
	lv, err := m.Owned(ctx, vg, name)
	if err != nil {
		return abi.LvmLv{}, err
	}
	return lv.wire(), nil
}

// Activate activates tagged LV name of vg (skipping its activation-skip
// flag) and answers it with its device.
func (m Manager) Activate(ctx context.Context, vg, name string) (abi.LvmLv, error) {
	lv, err := m.Owned(ctx, vg, name)
	if err != nil {
		return abi.LvmLv{}, err
	}
	return m.activateRow(ctx, lv)
}

func (m Manager) activateRow(ctx context.Context, lv lvRow) (abi.LvmLv, error) {
	if !lv.active() {
		if _, err := m.Run.Run(ctx, "lvchange", "-a", "y", "-K", "--", lv.VG+"/"+lv.Name); err != nil {
			return abi.LvmLv{}, err
		}
		var err error
		if lv, err = m.Owned(ctx, lv.VG, lv.Name); err != nil {
			return abi.LvmLv{}, err
		}
		if !lv.active() {
			return abi.LvmLv{}, abi.Errorf(abi.Internal, "lvm: %s/%s is not active after lvchange -ay", lv.VG, lv.Name)
		}
	}
	return lv.wire(), nil
}

// Deactivate deactivates tagged LV name of vg; inactive is success.
func (m Manager) Deactivate(ctx context.Context, vg, name string) error {
	lv, err := m.Owned(ctx, vg, name)
	if err != nil {
		return err
	}
	return m.deactivateRow(ctx, lv)
}

func (m Manager) deactivateRow(ctx context.Context, lv lvRow) error {
	if !lv.active() {
		return nil
	}
	_, err := m.Run.Run(ctx, "lvchange", "-a", "n", "--", lv.VG+"/"+lv.Name)
	return err
}

// Remove removes tagged LV name of vg.
func (m Manager) Remove(ctx context.Context, vg, name string) error {
	lv, err := m.Owned(ctx, vg, name)
	if err != nil {
		return err
	}
	return m.removeRow(ctx, lv)
}

func (m Manager) removeRow(ctx context.Context, lv lvRow) error {
	_, err := m.Run.Run(ctx, "lvremove", "--yes", "--", lv.VG+"/"+lv.Name)
	return err
}

// Extend grows tagged LV name of vg to size; a smaller or equal size
// changes nothing.
func (m Manager) Extend(ctx context.Context, vg, name string, size int64) (abi.LvmLv, error) {
	lv, err := m.Owned(ctx, vg, name)
	if err != nil {
		return abi.LvmLv{}, err
	}
	return m.extendRow(ctx, lv, size)
}

func (m Manager) extendRow(ctx context.Context, lv lvRow, size int64) (abi.LvmLv, error) {
	if size <= lv.Size {
		return lv.wire(), nil
	}
	if lv.Pool == "" {
		v, err := m.VG(ctx, lv.VG)
		if err != nil {
			return abi.LvmLv{}, err
		}
		if grow := roundUp(size, v.Extent) - lv.Size; grow > v.Free {
			return abi.LvmLv{}, abi.Errorf(abi.ResourceExhausted, "lvm: volume group %s has %d bytes free, growing %s needs %d", lv.VG, v.Free, lv.Name, grow)
		}
	}
	if _, err := m.Run.Run(ctx, "lvextend", "-L", bytesArg(size), "--", lv.VG+"/"+lv.Name); err != nil {
		return abi.LvmLv{}, err
	}
	return m.Status(ctx, lv.VG, lv.Name)
}

// Snapshot makes req.Name a thin snapshot of req.Origin (see
// abi.LvmSnapshotRequest).
func (m Manager) Snapshot(ctx context.Context, req *abi.LvmSnapshotRequest) (abi.LvmLv, error) {
	return m.snapshot(ctx, req, nil)
}

// snapshot is Snapshot; an LV of that name found already must also pass
// allowed (nil: any), be a thin LV and, while its origin lives, a
// snapshot of the origin asked for, or it is ALREADY_EXISTS and left as
// it is.
func (m Manager) snapshot(ctx context.Context, req *abi.LvmSnapshotRequest, allowed func(vg, pool string) error) (abi.LvmLv, error) {
	same := func(lv lvRow) error {
		if lv.Pool == "" || lv.Origin != "" && lv.Origin != req.Origin {
			return abi.Errorf(abi.AlreadyExists, "lvm: %s/%s exists and is no thin snapshot of %s: left alone", lv.VG, lv.Name, req.Origin)
		}
		return checkAllowed(allowed, lv)
	}
	if lv, ok, err := m.lookup(ctx, req.VG, req.Name); err != nil {
		return abi.LvmLv{}, err
	} else if ok {
		out, err := m.existing(ctx, lv, req.Activate && req.Writable, same)
		if err != nil || req.SizeBytes <= out.SizeBytes {
			return out, err
		}
		grown, err := m.Extend(ctx, req.VG, req.Name, req.SizeBytes)
		grown.Existed = true
		return grown, err
	}
	origin, err := m.Owned(ctx, req.VG, req.Origin)
	if err != nil {
		return abi.LvmLv{}, err
	}
	if origin.Pool == "" {
		return abi.LvmLv{}, abi.Errorf(abi.InvalidArgument, "lvm: %s/%s is not a thin LV: only thin LVs have snapshots here", req.VG, req.Origin)
	}
	args := []string{"lvcreate", "--yes", "-s", "-n", req.Name}
	if req.Writable {
		args = append(args, "-p", "rw", "-k", "n")
		if req.Activate {
			args = append(args, "-a", "y")
		} else {
			args = append(args, "-a", "n")
		}
	} else {
		args = append(args, "-p", "r", "-k", "y")
	}
	args = append(args, tagArgs(req.Tags)...)
	args = append(args, "--", req.VG+"/"+req.Origin)
	if _, err := m.Run.Run(ctx, args...); err != nil {
		if abi.CodeOf(err) == abi.AlreadyExists {
			if lv, ok, lerr := m.lookup(ctx, req.VG, req.Name); lerr == nil && ok {
				return m.existing(ctx, lv, req.Activate && req.Writable, same)
			}
		}
		return abi.LvmLv{}, err
	}
	lv, err := m.Owned(ctx, req.VG, req.Name)
	if err != nil {
		return abi.LvmLv{}, err
	}
	out := lv.wire()
	if req.SizeBytes > origin.Size {
		if out, err = m.extendRow(ctx, lv, req.SizeBytes); err != nil {
			return abi.LvmLv{}, err
		}
	}
	return out, nil
}

// List answers the tagged LVs of vg that keep returns true for.
func (m Manager) List(ctx context.Context, vg string, keep func(*lvRow) bool) ([]abi.LvmLv, error) {
	lvs, err := m.LVs(ctx, vg)
	if err != nil {
		return nil, err
	}
	var out []abi.LvmLv
	for i := range lvs {
		if lvs[i].VG == vg && lvs[i].owned() && keep(&lvs[i]) {
			out = append(out, lvs[i].wire())
		}
	}
	return out, nil
}
