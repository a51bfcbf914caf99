package lvm

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fakeLVM is a volume group in memory that answers the lvm commands this
// package runs, as lvm does (JSON reports, messages, exit failures), and
// logs every command.
type fakeLVM struct {
	t        *testing.T
	vg       string
	size     int64
	extent   int64
	lvs      map[string]*fakeLV
	commands []string
}

type fakeLV struct {
	name, pool, origin string
	size               int64
	tags               []string
	active, skip, ro   bool
	thinPool           bool
	major, minor       int
}

func newFake(t *testing.T) *fakeLVM {
	f := &fakeLVM{t: t, vg: "vg0", size: 1 << 30, extent: 4 << 20, lvs: map[string]*fakeLV{}}
	f.lvs["pool0"] = &fakeLV{name: "pool0", size: 256 << 20, thinPool: true, active: true}
	return f
}

func (f *fakeLVM) free() int64 {
	used := int64(0)
	for _, lv := range f.lvs {
		if lv.pool == "" {
			used += lv.size
		}
	}
	return f.size - used
}

func (f *fakeLVM) ran(cmd string) int {
	n := 0
	for _, c := range f.commands {
		if strings.HasPrefix(c, cmd+" ") {
			n++
		}
	}
	return n
}

func (f *fakeLVM) Run(_ context.Context, args ...string) ([]byte, error) {
	f.commands = append(f.commands, strings.Join(args, " "))
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
	fail := func(msg string) ([]byte, error) { return nil, classify(cmd, msg) }
	target := func() (*fakeLV, string, bool) {
		vg, name, _ := strings.Cut(pos[0], "/")
		if vg != f.vg {
			return nil, "", false
		}
		lv, ok := f.lvs[name]
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
		return f.report("vg", []map[string]string{{"vg_name": f.vg, "vg_size": i64(f.size), "vg_free": i64(f.free()),
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
			for _, n := range slices.Sorted(maps.Keys(f.lvs)) {
				out = append(out, f.row(f.lvs[n]))
			}
		}
		return f.report("lv", out)
	case "lvcreate":
		name := opts["-n"][0]
		if _, ok := f.lvs[name]; ok {
			return fail("  Logical Volume \"" + name + "\" already exists in volume group \"" + f.vg + "\"")
		}
		lv := &fakeLV{name: name, tags: opts["--addtag"], active: true}
		if _, snap := opts["-s"]; snap {
			origin, _, ok := target()
			if !ok {
				return fail("  Failed to find logical volume")
			}
			lv.pool, lv.origin, lv.size = origin.pool, origin.name, origin.size
			lv.skip = slices.Contains(opts["-k"], "y")
			lv.ro = slices.Contains(opts["-p"], "r")
		} else if v := opts["-V"]; len(v) > 0 {
			lv.pool, lv.size = opts["--thinpool"][0], size(v[0])
		} else {
			lv.size = size(opts["-L"][0])
			if lv.size > f.free() {
				return fail("  Volume group \"" + f.vg + "\" has insufficient free space (1 extents): 100 required.")
			}
		}
		lv.active = !slices.Contains(opts["-a"], "n") && !lv.skip
		f.lvs[name] = lv
	case "lvremove":
		lv, name, ok := target()
		if !ok {
			return fail("  Failed to find logical volume \"" + f.vg + "/" + name + "\"")
		}
		delete(f.lvs, lv.name)
	case "lvchange":
		lv, _, ok := target()
		if !ok {
			return fail("  Failed to find logical volume")
		}
		lv.active = slices.Contains(opts["-a"], "y")
	case "lvextend":
		lv, _, ok := target()
		if !ok {
			return fail("  Failed to find logical volume")
		}
		lv.size = size(opts["-L"][0])
	default:
		f.t.Fatalf("unexpected lvm command %v", args)
	}
	return nil, nil
}

func (f *fakeLVM) row(lv *fakeLV) map[string]string {
	attr := []byte("-wi------")
	if lv.thinPool {
		attr = []byte("twi-a-tz-")
	} else if lv.pool != "" {
		attr = []byte("Vwi---tz-")
	}
	if lv.ro {
		attr[1] = 'r'
	}
	r := map[string]string{"vg_name": f.vg, "lv_name": lv.name, "lv_uuid": "uuid-" + lv.name, "lv_size": i64(lv.size),
		"pool_lv": lv.pool, "origin": lv.origin, "lv_tags": strings.Join(lv.tags, ","), "lv_kernel_major": "-1", "lv_kernel_minor": "-1",
		"segtype": "linear"}
	if lv.thinPool {
		r["segtype"], r["data_percent"], r["metadata_percent"], r["lv_metadata_size"] = "thin-pool", "12.50", "1.00", i64(4<<20)
	}
	if lv.active {
		attr[4] = 'a'
		r["lv_kernel_major"], r["lv_kernel_minor"] = "253", strconv.Itoa(len(lv.name))
		r["lv_dm_path"] = "/dev/mapper/" + DMName(f.vg, lv.name)
	}
	r["lv_attr"] = string(attr)
	return r
}

func (f *fakeLVM) report(kind string, rows []map[string]string) ([]byte, error) {
	if rows == nil {
		rows = []map[string]string{}
	}
	return json.Marshal(map[string]any{"report": []map[string]any{{kind: rows}}})
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }
