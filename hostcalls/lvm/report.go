package lvm

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// The report fields read from lvs and vgs, in bytes (--units b --nosuffix).
var (
	lvFields = []string{"vg_name", "lv_name", "lv_uuid", "lv_size", "pool_lv", "origin", "lv_tags", "lv_attr",
		"lv_kernel_major", "lv_kernel_minor", "data_percent", "metadata_percent", "lv_metadata_size",
		"lv_dm_path", "lv_health_status", "segtype", "chunk_size", "thin_id"}
	vgFields = []string{"vg_name", "vg_size", "vg_free", "vg_extent_size", "pv_count", "vg_missing_pv_count"}
)

// report is lvm's JSON report: one section per report, each holding rows
// of string values keyed by field name.
type report struct {
	Report []map[string][]map[string]string `json:"report"`
}

// rows returns the rows of section kind ("lv", "vg") of a JSON report.
func rows(out []byte, kind string) ([]map[string]string, error) {
	var r report
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("lvm report: %w", err)
	}
	var all []map[string]string
	for _, sec := range r.Report {
		all = append(all, sec[kind]...)
	}
	return all, nil
}

// lvRow is one row of lvs.
type lvRow struct {
	VG, Name, UUID, Pool, Origin, Attr, DMPath, Health, Segtype string
	Tags                                                        []string
	Size, MetadataSize, Chunk                                   int64
	Major, Minor                                                int64 // -1 when inactive
	ThinID                                                      int64
	DataPercent, MetaPercent                                    float64
}

func parseLV(m map[string]string) (lvRow, error) {
	r := lvRow{VG: m["vg_name"], Name: m["lv_name"], UUID: m["lv_uuid"], Pool: m["pool_lv"], Origin: m["origin"],
		Attr: m["lv_attr"], DMPath: m["lv_dm_path"], Health: m["lv_health_status"], Segtype: m["segtype"]}
	if t := m["lv_tags"]; t != "" {
		r.Tags = strings.Split(t, ",")
	}
	var err error
	num := func(key string, dst *int64, empty int64) {
		if err != nil {
			return
		}
		s := strings.TrimSpace(m[key])
		if s == "" {
			*dst = empty
			return
		}
		*dst, err = strconv.ParseInt(s, 10, 64)
		if err != nil {
			err = fmt.Errorf("lvm report: %s = %q of LV %s/%s", key, s, r.VG, r.Name)
		}
	}
	num("lv_size", &r.Size, 0)
	num("lv_metadata_size", &r.MetadataSize, 0)
	num("chunk_size", &r.Chunk, 0)
	num("lv_kernel_major", &r.Major, -1)
	num("lv_kernel_minor", &r.Minor, -1)
	num("thin_id", &r.ThinID, 0)
	pct := func(key string, dst *float64) {
		if err != nil {
			return
		}
		s := strings.TrimSpace(m[key])
		if s == "" {
			return
		}
		*dst, err = strconv.ParseFloat(s, 64)
		if err != nil || *dst < 0 || *dst > 100 || math.IsNaN(*dst) {
			err = fmt.Errorf("lvm report: %s = %q of LV %s/%s", key, s, r.VG, r.Name)
		}
	}
	pct("data_percent", &r.DataPercent)
	pct("metadata_percent", &r.MetaPercent)
	return r, err
}

// owned reports whether the row carries the owner tag.
func (r *lvRow) owned() bool {
	for _, t := range r.Tags {
		if t == abi.LvmOwnerTag {
			return true
		}
	}
	return false
}

// active reports whether the kernel has the LV's device.
func (r *lvRow) active() bool {
	return r.Major >= 0 && r.Minor >= 0 && len(r.Attr) > 4 && r.Attr[4] == 'a'
}

// health is the attr's health letter (the ninth), for thin pools:
// F failed, D out of data space, M metadata read-only; p partial.
func (r *lvRow) health() byte {
	if len(r.Attr) > 8 {
		return r.Attr[8]
	}
	return '-'
}

// wire converts the row to the family's answer.
func (r *lvRow) wire() abi.LvmLv {
	out := abi.LvmLv{VG: r.VG, Name: r.Name, UUID: r.UUID, SizeBytes: r.Size, ThinPool: r.Pool, Origin: r.Origin,
		ReadOnly: len(r.Attr) > 1 && r.Attr[1] == 'r', Health: r.Health, ThinID: uint32(r.ThinID)}
	for _, t := range r.Tags {
		if t != abi.LvmOwnerTag {
			out.Tags = append(out.Tags, t)
		}
	}
	if r.active() {
		out.Active, out.Major, out.Minor = true, uint32(r.Major), uint32(r.Minor)
		out.Path = r.DMPath
		if out.Path == "" {
			out.Path = "/dev/mapper/" + DMName(r.VG, r.Name)
		}
		if r.Pool != "" {
			out.MappedBytes = int64(float64(r.Size) * r.DataPercent / 100)
		}
	}
	return out
}

// poolStatus converts a thin pool's row.
func (r *lvRow) poolStatus() abi.LvmPoolStatus {
	st := abi.LvmPoolStatus{VG: r.VG, Pool: r.Name, SizeBytes: r.Size, MetadataBytes: r.MetadataSize, ChunkBytes: r.Chunk,
		Active: r.active(), Health: r.Health}
	if st.Active {
		st.DataPercent = int32(math.Round(r.DataPercent * 100))
		st.MetadataPercent = int32(math.Round(r.MetaPercent * 100))
		st.DataUsedBytes = int64(float64(r.Size) * r.DataPercent / 100)
		st.MetadataUsedBytes = int64(float64(r.MetadataSize) * r.MetaPercent / 100)
	}
	switch r.health() {
	case 'F':
		st.Failed = true
	case 'D':
		st.OutOfDataSpace = true
	case 'M':
		st.ReadOnly = true
	}
	if len(r.Attr) > 1 && r.Attr[1] == 'r' {
		st.ReadOnly = true
	}
	return st
}

// DMName is the device-mapper name LVM gives LV lv of VG vg: both with
// every "-" doubled, joined by "-".
func DMName(vg, lv string) string {
	return strings.ReplaceAll(vg, "-", "--") + "-" + strings.ReplaceAll(lv, "-", "--")
}

// vgRow is one row of vgs.
type vgRow struct {
	Name                         string
	Size, Free, Extent, PVs, Mis int64
}

func parseVG(m map[string]string) (vgRow, error) {
	r := vgRow{Name: m["vg_name"]}
	for _, f := range []struct {
		key string
		dst *int64
	}{{"vg_size", &r.Size}, {"vg_free", &r.Free}, {"vg_extent_size", &r.Extent}, {"pv_count", &r.PVs}, {"vg_missing_pv_count", &r.Mis}} {
		s := strings.TrimSpace(m[f.key])
		if s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return r, fmt.Errorf("lvm report: %s = %q of VG %s", f.key, s, r.Name)
		}
		*f.dst = n
	}
	return r, nil
}
