package dm

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestParsePoolStatus(t *testing.T) {
	for _, c := range []struct {
		name string
		text string
		want PoolStatus
		bad  bool
	}{
		{
			name: "fresh pool (kernel 6.1)",
			text: "0 10/4096 0/8192 - rw discard_passdown queue_if_no_space - 1024",
			want: PoolStatus{UsedMetaBlocks: 10, TotalMetaBlocks: 4096, TotalDataBlocks: 8192, HeldMetaRoot: "-", DiscardPassdown: true, MetaLowWater: 1024},
		},
		{
			name: "busy read-only pool needing a check",
			text: "7 300/4096 8000/8192 117 ro no_discard_passdown error_if_no_space needs_check 1024",
			want: PoolStatus{TransactionID: 7, UsedMetaBlocks: 300, TotalMetaBlocks: 4096, UsedDataBlocks: 8000, TotalDataBlocks: 8192,
				HeldMetaRoot: "117", ReadOnly: true, ErrorIfNoSpace: true, NeedsCheck: true, MetaLowWater: 1024},
		},
		{
			name: "out of data space, older kernel without low watermark",
			text: "3 20/4096 8192/8192 - out_of_data_space ignore_discard queue_if_no_space -",
			want: PoolStatus{TransactionID: 3, UsedMetaBlocks: 20, TotalMetaBlocks: 4096, UsedDataBlocks: 8192, TotalDataBlocks: 8192, HeldMetaRoot: "-", OutOfDataSpace: true},
		},
		{name: "failed", text: "Fail", want: PoolStatus{Failed: true}},
		{name: "error", text: "Error", bad: true},
		{name: "bad fraction", text: "0 10-4096 0/8192 - rw discard_passdown queue_if_no_space - 1024", bad: true},
		{name: "bad mode", text: "0 10/4096 0/8192 - rx discard_passdown queue_if_no_space - 1024", bad: true},
		{name: "bad policy", text: "0 10/4096 0/8192 - rw discard_passdown maybe - 1024", bad: true},
		{name: "bad check", text: "0 10/4096 0/8192 - rw discard_passdown queue_if_no_space x 1024", bad: true},
		{name: "bad id", text: "x 10/4096 0/8192 - rw discard_passdown queue_if_no_space - 1024", bad: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParsePoolStatus(c.text)
			if c.bad {
				if abi.CodeOf(err) != abi.Internal {
					t.Fatalf("parsed %+v, err %v", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
	s := PoolStatus{UsedDataBlocks: 3, TotalDataBlocks: 10, BlockSectors: 128}
	if used, total := s.DataBytes(); used != 3*64<<10 || total != 10*64<<10 {
		t.Errorf("DataBytes %d/%d", used, total)
	}
}

func TestParseThinStatus(t *testing.T) {
	for _, c := range []struct {
		text string
		want ThinStatus
		bad  bool
	}{
		{"0 -", ThinStatus{HighestMapped: -1}, false},
		{"2048 131071", ThinStatus{MappedSectors: 2048, HighestMapped: 131071}, false},
		{"Fail", ThinStatus{Failed: true, HighestMapped: -1}, false},
		{"2048", ThinStatus{}, true},
		{"x -", ThinStatus{}, true},
		{"1 -5", ThinStatus{}, true},
	} {
		got, err := ParseThinStatus(c.text)
		if (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("ParseThinStatus(%q) = %+v, %v", c.text, got, err)
		}
	}
}

func TestMetadataSize(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		data, block, thins, want uint64
	}{
		{64 << 20, 128, 1, MinMetadataSize},              // tiny pools get the minimum
		{100 * gib, 128, 1, 76 << 20},                    // 1.6M blocks * 48 B = 75 MiB, + 4 KiB -> 76
		{100 * gib, 1024, 1000, 14 << 20},                // 204800 blocks * 48 + 1000 * 4 KiB = 13.3 MiB -> 14
		{1 << 40, 128, 100, 769 << 20},                   // 16M blocks * 48 B = 768 MiB, + 400 KiB
		{1 << 50, 128, 1, MaxMetadataSize},               // capped where the kernel stops
		{100 * gib, 0, 1, MetadataSize(100*gib, 128, 1)}, // 0 means the 64 KiB default
		{1 << 40, 2097152, 0, MinMetadataSize},           // 1 GiB blocks
		{3 * gib, 128, 0, (3*gib/(64<<10)*48 + 1<<20 - 1) &^ (1<<20 - 1)},
	} {
		if got := MetadataSize(c.data, c.block, c.thins); got != c.want {
			t.Errorf("MetadataSize(%d, %d, %d) = %d, want %d", c.data, c.block, c.thins, got, c.want)
		}
	}
}

func TestParseSuperblock(t *testing.T) {
	b := make([]byte, 4096)
	if parseSuperblock(b).valid {
		t.Fatal("zeroed block is a superblock")
	}
	binary.LittleEndian.PutUint64(b[32:], thinMagic)
	binary.LittleEndian.PutUint64(b[48:], 9)
	binary.LittleEndian.PutUint32(b[336:], 256)
	sb := parseSuperblock(b)
	if !sb.valid || sb.transactionID != 9 || sb.blockSectors != 256 {
		t.Errorf("superblock %+v", sb)
	}
	if parseSuperblock(b[:100]).valid {
		t.Error("short block is a superblock")
	}
}

func TestValidBlockSectors(t *testing.T) {
	for n, ok := range map[uint64]bool{0: false, 64: false, 128: true, 192: false, 256: true, 2097152: true, 2097280: false} {
		if (validBlockSectors(n) == nil) != ok {
			t.Errorf("block size %d: ok=%v", n, !ok)
		}
	}
}

func TestUnboundPool(t *testing.T) {
	ctx := context.Background()
	var p Pool
	if _, err := p.CreateThin(ctx, 1, 8); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Errorf("CreateThin on a Pool literal: %v", err)
	}
	if _, err := p.Status(ctx); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Errorf("Status on a Pool literal: %v", err)
	}
	m, _ := New("wasmcsi-")
	bound := &Pool{Name: "wasmcsi-p", m: m, dev: "253:0"}
	if _, err := bound.CreateThin(ctx, MaxThinID+1, 8); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("thin id past 24 bits: %v", err)
	}
	if _, err := bound.ActivateThin(ctx, 1, 0); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("zero size: %v", err)
	}
	if got := bound.ThinName(42); got != "wasmcsi-p-42" {
		t.Errorf("ThinName %q", got)
	}
	if tt := bound.thinTable(42, 2048); tt[0].String() != "0 2048 thin 253:0 42" {
		t.Errorf("thin table %v", tt)
	}
}
