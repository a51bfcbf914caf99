package dm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Thin metadata written by thin_restore into a file and read back by the
// real thin_dump and thin_delta (the VM tier reads a live pool's held
// snapshot the same way): device 1 maps blocks 0-3 and 10-11; device 2, a
// snapshot of it, shares 0-1, 3 and 10, rewrote 2, dropped 11 and wrote 12.
const testMetadataXML = `<superblock uuid="" time="2" transaction="3" flags="0" version="2" data_block_size="128" nr_data_blocks="1024">
  <device dev_id="1" mapped_blocks="6" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="4" time="0"/>
    <single_mapping origin_block="10" data_block="20" time="0"/>
    <single_mapping origin_block="11" data_block="30" time="0"/>
  </device>
  <device dev_id="2" mapped_blocks="6" transaction="0" creation_time="1" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="2" time="0"/>
    <single_mapping origin_block="2" data_block="40" time="1"/>
    <single_mapping origin_block="3" data_block="3" time="0"/>
    <single_mapping origin_block="10" data_block="20" time="0"/>
    <single_mapping origin_block="12" data_block="41" time="1"/>
  </device>
</superblock>
`

// testMetadata restores testMetadataXML into a metadata file.
func testMetadata(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"thin_restore", "thin_dump", "thin_delta"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (thin-provisioning-tools): %v", tool, err)
		}
	}
	dir := t.TempDir()
	xmlPath, meta := filepath.Join(dir, "m.xml"), filepath.Join(dir, "meta.bin")
	if err := os.WriteFile(xmlPath, []byte(testMetadataXML), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meta, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(meta, 8<<20); err != nil {
		t.Fatal(err)
	}
	// thin_restore opens its output with O_DIRECT, which tmpfs (the VM
	// guest's /tmp) refuses; there the thin VM tests read a live pool.
	if fd, err := unix.Open(meta, unix.O_RDWR|unix.O_DIRECT, 0); errors.Is(err, unix.EINVAL) {
		t.Skipf("the temporary folder refuses O_DIRECT, which thin_restore needs: %v", err)
	} else if err == nil {
		unix.Close(fd)
	}
	if out, err := exec.Command("thin_restore", "-i", xmlPath, "-o", meta).CombinedOutput(); err != nil {
		t.Fatalf("thin_restore: %v: %s", err, out)
	}
	return meta
}

func collect(t *testing.T, run func(emit func(BlockRange) error) error) ([]BlockRange, error) {
	t.Helper()
	var out []BlockRange
	err := run(func(r BlockRange) error { out = append(out, r); return nil })
	return out, err
}

func TestDumpMappings(t *testing.T) {
	meta := testMetadata(t)
	ctx := context.Background()
	for _, tc := range []struct {
		id   uint32
		want []BlockRange
	}{
		{1, []BlockRange{{0, 4}, {10, 2}}},
		{2, []BlockRange{{0, 4}, {10, 1}, {12, 1}}},
	} {
		got, err := collect(t, func(emit func(BlockRange) error) error { return dumpMappings(ctx, meta, false, tc.id, emit) })
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("mappings of %d: %v, %v; want %v", tc.id, got, err, tc.want)
		}
	}
	if _, err := collect(t, func(emit func(BlockRange) error) error { return dumpMappings(ctx, meta, false, 9, emit) }); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("mappings of a missing id: %v, want NOT_FOUND", err)
	}
	stop := errors.New("enough")
	if err := dumpMappings(ctx, meta, false, 2, func(BlockRange) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("an emit error: %v, want it returned", err)
	}
}

func TestDumpDelta(t *testing.T) {
	meta := testMetadata(t)
	ctx := context.Background()
	got, err := collect(t, func(emit func(BlockRange) error) error { return dumpDelta(ctx, meta, false, 1, 2, emit) })
	// Block 2 rewritten, 11 dropped, 12 new: 11 and 12 merge.
	if want := []BlockRange{{2, 1}, {11, 2}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("delta 1 -> 2: %v, %v; want %v", got, err, want)
	}
	got, err = collect(t, func(emit func(BlockRange) error) error { return dumpDelta(ctx, meta, false, 2, 2, emit) })
	if err != nil || len(got) != 0 {
		t.Errorf("delta 2 -> 2: %v, %v; want nothing", got, err)
	}
	if _, err := collect(t, func(emit func(BlockRange) error) error { return dumpDelta(ctx, meta, false, 1, 9, emit) }); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("delta to a missing id: %v, want NOT_FOUND", err)
	}
}

func TestMergerRefusesDisorder(t *testing.T) {
	var got []BlockRange
	m := merger{emit: func(r BlockRange) error { got = append(got, r); return nil }}
	for _, r := range []BlockRange{{0, 2}, {2, 3}, {0, 0}, {9, 1}} {
		if err := m.add(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.add(BlockRange{5, 1}); abi.CodeOf(err) != abi.Internal {
		t.Fatalf("a range before the last: %v, want INTERNAL", err)
	}
	if err := m.flush(); err != nil || !slices.Equal(got, []BlockRange{{0, 5}, {9, 1}}) {
		t.Fatalf("merged %v, %v", got, err)
	}
}
