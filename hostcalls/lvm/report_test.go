package lvm

import (
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestClassify(t *testing.T) {
	for msg, code := range map[string]abi.Code{
		`  Volume group "vg0" has insufficient free space (3 extents): 25 required.`:           abi.ResourceExhausted,
		`  Cannot create new thin volume, free space in thin pool vg0/pool reached threshold.`: abi.ResourceExhausted,
		`  Failed to find logical volume "vg0/x"`:                                              abi.NotFound,
		`  Volume group "vgx" not found` + "\n" + `  Cannot process volume group vgx`:          abi.FailedPrecondition,
		`  Logical Volume "a" already exists in volume group "vg0"`:                            abi.AlreadyExists,
		`  Logical volume vg0/a contains a filesystem in use.`:                                 abi.FailedPrecondition,
		`  Logical volume vg0/a in use.`:                                                       abi.FailedPrecondition,
		`  Something else went wrong.`:                                                         abi.Internal,
	} {
		if got := abi.CodeOf(Classify("lvcreate", msg)); got != code {
			t.Errorf("%q: %v, want %v", msg, got, code)
		}
	}
}

// The report as lvm 2.03 prints it.
func TestParseReport(t *testing.T) {
	out := []byte(`  {
      "report": [
          {
              "lv": [
                  {"vg_name":"vg0", "lv_name":"pool", "lv_uuid":"u1", "lv_size":"41943040", "pool_lv":"", "origin":"", "lv_tags":"", "lv_attr":"twi-aotz--", "lv_kernel_major":"253", "lv_kernel_minor":"2", "data_percent":"10.00", "metadata_percent":"11.23", "lv_metadata_size":"4194304", "lv_dm_path":"/dev/mapper/vg0-pool-tpool", "lv_health_status":"", "segtype":"thin-pool", "chunk_size":"65536"},
                  {"vg_name":"vg0", "lv_name":"t1", "lv_uuid":"u2", "lv_size":"104857600", "pool_lv":"pool", "origin":"", "lv_tags":"wasmcsi.dev,k=v", "lv_attr":"Vwi-a-tz--", "lv_kernel_major":"253", "lv_kernel_minor":"4", "data_percent":"4.00", "metadata_percent":"", "lv_metadata_size":"", "lv_dm_path":"/dev/mapper/vg0-t1", "lv_health_status":"", "segtype":"thin", "chunk_size":"0"},
                  {"vg_name":"vg0", "lv_name":"thick", "lv_uuid":"u3", "lv_size":"12582912", "pool_lv":"", "origin":"", "lv_tags":"", "lv_attr":"-wi-------", "lv_kernel_major":"-1", "lv_kernel_minor":"-1", "data_percent":"", "metadata_percent":"", "lv_metadata_size":"", "lv_dm_path":"", "lv_health_status":"", "segtype":"linear", "chunk_size":"0"}
              ]
          }
      ]
  }
`)
	lvs, err := parseLVs(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(lvs) != 3 {
		t.Fatalf("%d rows", len(lvs))
	}
	p := lvs[0].poolStatus()
	if !p.Active || p.DataPercent != 1000 || p.MetadataPercent != 1123 || p.DataUsedBytes != 4194304 || p.ChunkBytes != 65536 {
		t.Errorf("pool %+v", p)
	}
	w := lvs[1].wire()
	if !lvs[1].owned() || !w.Active || w.Major != 253 || w.Minor != 4 || w.MappedBytes != 4194304 || len(w.Tags) != 1 || w.ThinPool != "pool" {
		t.Errorf("thin %+v", w)
	}
	if lvs[2].owned() || lvs[2].active() || lvs[2].wire().Path != "" {
		t.Errorf("thick %+v", lvs[2])
	}
}
