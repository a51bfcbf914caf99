// Package lvmfake is a volume group in memory that answers the lvm
// commands hostcalls/lvm runs as lvm does (JSON reports, messages,
// failures), for tests of the family and of modules that use it. It must
// never be imported by non-test code.
package lvmfake

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/lvm"
)

// VG is one volume group with thin pool "pool0"; it logs every command.
type VG struct {
	t        *testing.T
	vg       string
	size     int64
	extent   int64
	LVs      map[string]*LV
	Commands []string
	// PoolData and PoolMetadata are the thin pools' data_percent and
	// metadata_percent as lvs prints them; PoolHealth is the ninth
	// lv_attr letter of the pools ('-', 'D', 'M', 'F').
	PoolData, PoolMetadata string
	PoolHealth             byte
}

// LV is one LV of the fake.
type LV struct {
	Name, Pool, Origin string
	Size               int64
	Tags               []string
	Active, Skip, RO   bool
	ThinPool           bool
}

// New returns VG "vg0" of 1 GiB in 4 MiB extents with a 256 MiB thin pool "pool0".
func New(t *testing.T) *VG {
	f := &VG{t: t, vg: "vg0", size: 1 << 30, extent: 4 << 20, LVs: map[string]*LV{}, PoolData: "12.50", PoolMetadata: "1.00", PoolHealth: '-'}
	f.LVs["pool0"] = &LV{Name: "pool0", Size: 256 << 20, ThinPool: true, Active: true}
	return f
}

// Free is the VG's free space.
func (f *VG) Free() int64 {
	used := int64(0)
	for _, lv := range f.LVs {
		if lv.Pool == "" {
			used += lv.Size
		}
	}
	return f.size - used
}

// Ran counts the commands cmd run.
func (f *VG) Ran(cmd string) int {
	n := 0
	for _, c := range f.Commands {
		if strings.HasPrefix(c, cmd+" ") {
			n++
		}
	}
	return n
}

// Run answers one lvm command.
func (f *VG) Run(_ context.Context, args ...string) ([]byte, error) {
	f.Commands = append(f.Commands, strings.Join(args, " "))
	cmd, rest := args[0], args[1:]
	var pos []string
	opts := map[string][]string{}
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		switch a {
		case "--yes", "-s", "-K", "--nosuffix", "--nosync":
			opts[a] = append(opts[a], "")
		default:
			if strings.HasPrefix(a, "-") && i+1 < len(rest) {
				opts[a] = append(opts[a], rest[i+1])
				i++
			} else {
				pos = append(pos, a)
			}
		}
	}
	fail := func(msg string) ([]byte, error) { return nil, lvm.Classify(cmd, msg) }
	target := func() (*LV, string, bool) {
		vg, name, _ := strings.Cut(pos[0], "/")
		if vg != f.vg {
			return nil, "", false
		}
		lv, ok := f.LVs[name]
		return lv, name, ok
	}
	size := func(s string) int64 {
		n, err := strconv.ParseInt(strings.TrimSuffix(s, "b"), 10, 64)
		if err != nil {
			f.t.Fatalf("size %q", s)
		}
		return (n + f.extent - 1) / f.extent * f.extent
	}
	switch cmd {
	case "vgs":
		if pos[0] != f.vg {
			return fail("  Volume group \"" + pos[0] + "\" not found")
		}
		return f.report("vg", []map[string]string{{"vg_name": f.vg, "vg_size": i64(f.size), "vg_free": i64(f.Free()),
			"vg_extent_size": i64(f.extent), "pv_count": "1", "vg_missing_pv_count": "0"}})
	case "lvs":
		var out []map[string]string
		if strings.Contains(pos[0], "/") {
			lv, name, ok := target()
			if !ok {
				return fail("  Failed to find logical volume \"" + f.vg + "/" + name + "\"")
			}
			out = append(out, f.row(lv))
		} else {
			if pos[0] != f.vg {
				return fail("  Volume group \"" + pos[0] + "\" not found")
			}
			for _, n := range slices.Sorted(maps.Keys(f.LVs)) {
				out = append(out, f.row(f.LVs[n]))
			}
		}
		return f.report("lv", out)
	case "lvcreate":
		name := opts["-n"][0]
		if _, ok := f.LVs[name]; ok {
			return fail("  Logical Volume \"" + name + "\" already exists in volume group \"" + f.vg + "\"")
		}
		lv := &LV{Name: name, Tags: opts["--addtag"], Active: true}
		if _, snap := opts["-s"]; snap {
			origin, _, ok := target()
			if !ok {
				return fail("  Failed to find logical volume")
			}
			lv.Pool, lv.Origin, lv.Size = origin.Pool, origin.Name, origin.Size
			lv.Skip = slices.Contains(opts["-k"], "y")
			lv.RO = slices.Contains(opts["-p"], "r")
		} else if v := opts["-V"]; len(v) > 0 {
			lv.Pool, lv.Size = opts["--thinpool"][0], size(v[0])
		} else {
			lv.Size = size(opts["-L"][0])
			if lv.Size > f.Free() {
				return fail("  Volume group \"" + f.vg + "\" has insufficient free space (1 extents): 100 required.")
			}
		}
		lv.Active = !slices.Contains(opts["-a"], "n") && !lv.Skip
		f.LVs[name] = lv
	case "lvremove":
		lv, name, ok := target()
		if !ok {
			return fail("  Failed to find logical volume \"" + f.vg + "/" + name + "\"")
		}
		delete(f.LVs, lv.Name)
	case "lvchange":
		lv, _, ok := target()
		if !ok {
			return fail("  Failed to find logical volume")
		}
		lv.Active = slices.Contains(opts["-a"], "y")
	case "lvextend":
		lv, _, ok := target()
		if !ok {
			return fail("  Failed to find logical volume")
		}
		lv.Size = size(opts["-L"][0])
	default:
		f.t.Fatalf("unexpected lvm command %v", args)
	}
	return nil, nil
}

func (f *VG) row(lv *LV) map[string]string {
	attr := []byte("-wi------")
	if lv.ThinPool {
		attr = []byte("twi-a-tz-")
	} else if lv.Pool != "" {
		attr = []byte("Vwi---tz-")
	}
	if lv.RO {
		attr[1] = 'r'
	}
	r := map[string]string{"vg_name": f.vg, "lv_name": lv.Name, "lv_uuid": "uuid-" + lv.Name, "lv_size": i64(lv.Size),
		"pool_lv": lv.Pool, "origin": lv.Origin, "lv_tags": strings.Join(lv.Tags, ","), "lv_kernel_major": "-1", "lv_kernel_minor": "-1",
		"segtype": "linear"}
	if lv.ThinPool {
		r["segtype"], r["data_percent"], r["metadata_percent"], r["lv_metadata_size"] = "thin-pool", f.PoolData, f.PoolMetadata, i64(4<<20)
		attr[8] = f.PoolHealth
	}
	if lv.Active {
		attr[4] = 'a'
		r["lv_kernel_major"], r["lv_kernel_minor"] = "253", strconv.Itoa(len(lv.Name))
		r["lv_dm_path"] = "/dev/mapper/" + lvm.DMName(f.vg, lv.Name)
	}
	r["lv_attr"] = string(attr)
	return r
}

func (f *VG) report(kind string, rows []map[string]string) ([]byte, error) {
	if rows == nil {
		rows = []map[string]string{}
	}
	return json.Marshal(map[string]any{"report": []map[string]any{{kind: rows}}})
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }
