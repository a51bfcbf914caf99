package host_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

// The SnapshotMetadata service against a real daemon serving the loopfile
// module: data is written through the volume's real loop device (published
// as a raw block device), snapshots are cut while it is in use, and the
// allocated and changed ranges the service streams are checked exactly.

const (
	mdVolumeSize = 4 << 20
	mdBlock      = 4096
)

type mdRange struct{ off, len int64 }

// mdData is 4 KiB blocks tagged with what and where, so that two writes of
// one tag at one offset are identical and any other pair differs.
func mdData(tag string, off, n int64) []byte {
	out := make([]byte, 0, n)
	for b := off; b < off+n; b += mdBlock {
		out = append(out, bytes.Repeat([]byte(tag+":"+strings.Repeat("#", int(b/mdBlock%7))+";"), mdBlock)[:mdBlock]...)
	}
	return out
}

func mdWrite(t *testing.T, dev string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("write %s at %d: %v", dev, off, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync %s: %v", dev, err)
	}
}

// mdMessage is one streamed response, whichever RPC sent it.
type mdMessage struct {
	typ      csi.BlockMetadataType
	capacity int64
	ranges   []mdRange
}

func mdRanges(bm []*csi.BlockMetadata) []mdRange {
	out := []mdRange{}
	for _, b := range bm {
		out = append(out, mdRange{b.GetByteOffset(), b.GetSizeBytes()})
	}
	return out
}

// allocated reads a whole GetMetadataAllocated stream; the error is the
// stream's status.
func mdAllocated(ctx context.Context, c csi.SnapshotMetadataClient, req *csi.GetMetadataAllocatedRequest) ([]mdMessage, error) {
	s, err := c.GetMetadataAllocated(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []mdMessage
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, mdMessage{m.GetBlockMetadataType(), m.GetVolumeCapacityBytes(), mdRanges(m.GetBlockMetadata())})
	}
}

func mdDelta(ctx context.Context, c csi.SnapshotMetadataClient, req *csi.GetMetadataDeltaRequest) ([]mdMessage, error) {
	s, err := c.GetMetadataDelta(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []mdMessage
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, mdMessage{m.GetBlockMetadataType(), m.GetVolumeCapacityBytes(), mdRanges(m.GetBlockMetadata())})
	}
}

// flatten checks every message's type and capacity and joins their ranges.
func mdFlatten(t *testing.T, what string, msgs []mdMessage) []mdRange {
	t.Helper()
	out := []mdRange{}
	for _, m := range msgs {
		if m.typ != csi.BlockMetadataType_VARIABLE_LENGTH || m.capacity != mdVolumeSize {
			t.Errorf("%s: message type %v capacity %d, want VARIABLE_LENGTH and %d", what, m.typ, m.capacity, mdVolumeSize)
		}
		out = append(out, m.ranges...)
	}
	return out
}

func TestSnapshotMetadataLoopfile(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
	d := startDaemon(t, daemonOptions{backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go), hostcalls: []string{"file", "loop"}})
	t.Cleanup(func() { mdDetachUnder(t, d.pool) }) // last resort, after the unstage below
	ctx := context.Background()
	work := t.TempDir()
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol, err := d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "metadata-source", CapacityRange: &csi.CapacityRange{RequiredBytes: mdVolumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{block},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	staging, target := filepath.Join(work, "staging"), filepath.Join(work, "target")
	if _, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: block, VolumeContext: vol.GetVolume().GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	unstage := func() error {
		if _, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			return err
		}
		_, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	}
	t.Cleanup(func() {
		if err := unstage(); err != nil {
			t.Errorf("unstage: %v", err)
		}
	})
	if _, err := d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: block, VolumeContext: vol.GetVolume().GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}

	// Generation 1: three ranges, one of two blocks.
	mdWrite(t, target, 0, mdData("one", 0, mdBlock))
	mdWrite(t, target, 1<<20, mdData("one", 1<<20, 2*mdBlock))
	mdWrite(t, target, 3<<20+mdBlock, mdData("one", 3<<20+mdBlock, mdBlock))
	snap := func(name string) string {
		t.Helper()
		r, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetSnapshot().GetSnapshotId()
	}
	first := snap("metadata-1")
	// Generation 2: block 0 rewritten, a new block at 2 MiB, and the
	// 1 MiB range rewritten with identical bytes (not a change).
	mdWrite(t, target, 0, mdData("two", 0, mdBlock))
	mdWrite(t, target, 2<<20, mdData("two", 2<<20, mdBlock))
	mdWrite(t, target, 1<<20, mdData("one", 1<<20, 2*mdBlock))
	second := snap("metadata-2")
	// A snapshot of another volume, cut after both.
	other, err := d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "metadata-other", CapacityRange: &csi.CapacityRange{RequiredBytes: mdVolumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{block},
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "metadata-other-1", SourceVolumeId: other.GetVolume().GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	unrelated := r.GetSnapshot().GetSnapshotId()
	if err := unstage(); err != nil {
		t.Fatal(err)
	}

	c := csi.NewSnapshotMetadataClient(d.conn)
	gen1 := []mdRange{{0, mdBlock}, {1 << 20, 2 * mdBlock}, {3<<20 + mdBlock, mdBlock}}
	gen2 := []mdRange{{0, mdBlock}, {1 << 20, 2 * mdBlock}, {2 << 20, mdBlock}, {3<<20 + mdBlock, mdBlock}}
	changed := []mdRange{{0, mdBlock}, {2 << 20, mdBlock}}

	t.Run("allocated", func(t *testing.T) {
		tests := []struct {
			name     string
			snapshot string
			start    int64
			max      int32
			want     []mdRange
			messages int // 0: any
		}{
			{name: "first snapshot", snapshot: first, want: gen1, messages: 1},
			{name: "second snapshot", snapshot: second, want: gen2, messages: 1},
			{name: "one per message", snapshot: first, max: 1, want: gen1, messages: 3},
			{name: "two per message", snapshot: second, max: 2, want: gen2, messages: 2},
			{name: "start inside a range", snapshot: first, start: 1<<20 + mdBlock, want: []mdRange{{1<<20 + mdBlock, mdBlock}, {3<<20 + mdBlock, mdBlock}}},
			{name: "start in a hole", snapshot: first, start: 2 << 20, want: []mdRange{{3<<20 + mdBlock, mdBlock}}},
			{name: "start at the end", snapshot: first, start: mdVolumeSize, want: []mdRange{}},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				msgs, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: tc.snapshot, StartingOffset: tc.start, MaxResults: tc.max})
				if err != nil {
					t.Fatal(err)
				}
				if got := mdFlatten(t, tc.name, msgs); !slices.Equal(got, tc.want) {
					t.Errorf("ranges %v, want %v", got, tc.want)
				}
				if tc.messages > 0 && len(msgs) != tc.messages {
					t.Errorf("%d messages, want %d", len(msgs), tc.messages)
				}
				for _, m := range msgs {
					if tc.max > 0 && len(m.ranges) > int(tc.max) {
						t.Errorf("message of %d ranges, max_results %d", len(m.ranges), tc.max)
					}
				}
			})
		}
	})

	t.Run("delta", func(t *testing.T) {
		tests := []struct {
			name         string
			base, target string
			start        int64
			max          int32
			want         []mdRange
			messages     int
		}{
			{name: "first to second", base: first, target: second, want: changed, messages: 1},
			{name: "one per message", base: first, target: second, max: 1, want: changed, messages: 2},
			{name: "from 4 KiB", base: first, target: second, start: mdBlock, want: []mdRange{{2 << 20, mdBlock}}},
			{name: "unaligned start", base: first, target: second, start: 100, want: changed},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				msgs, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: tc.base, TargetSnapshotId: tc.target, StartingOffset: tc.start, MaxResults: tc.max})
				if err != nil {
					t.Fatal(err)
				}
				if got := mdFlatten(t, tc.name, msgs); !slices.Equal(got, tc.want) {
					t.Errorf("ranges %v, want %v", got, tc.want)
				}
				if tc.messages > 0 && len(msgs) != tc.messages {
					t.Errorf("%d messages, want %d", len(msgs), tc.messages)
				}
			})
		}
	})

	t.Run("errors", func(t *testing.T) {
		missing := "loopfile:missing-0123456789abcdef"
		tests := []struct {
			name string
			call func() error
			code codes.Code
		}{
			{"allocated without snapshot", func() error {
				_, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{})
				return err
			}, codes.InvalidArgument},
			{"allocated with negative max_results", func() error {
				_, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: first, MaxResults: -1})
				return err
			}, codes.InvalidArgument},
			{"allocated of an unknown snapshot", func() error {
				_, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: missing})
				return err
			}, codes.NotFound},
			{"allocated of a foreign ID", func() error {
				_, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: "not-a-wasmcsi-id"})
				return err
			}, codes.NotFound},
			{"allocated past the end", func() error {
				_, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: first, StartingOffset: mdVolumeSize + 1})
				return err
			}, codes.OutOfRange},
			{"allocated from a negative offset", func() error {
				_, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: first, StartingOffset: -1})
				return err
			}, codes.OutOfRange},
			{"delta without base", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{TargetSnapshotId: second})
				return err
			}, codes.InvalidArgument},
			{"delta without target", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: first})
				return err
			}, codes.InvalidArgument},
			{"delta with negative max_results", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: first, TargetSnapshotId: second, MaxResults: -1})
				return err
			}, codes.InvalidArgument},
			{"delta from an unknown base", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: missing, TargetSnapshotId: second})
				return err
			}, codes.NotFound},
			{"delta to an unknown target", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: first, TargetSnapshotId: missing})
				return err
			}, codes.NotFound},
			{"delta backwards, from the newer snapshot", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: second, TargetSnapshotId: first})
				return err
			}, codes.InvalidArgument},
			{"delta of a snapshot with itself", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: first, TargetSnapshotId: first})
				return err
			}, codes.InvalidArgument},
			{"delta across volumes", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: first, TargetSnapshotId: unrelated})
				return err
			}, codes.InvalidArgument},
			{"delta past the end", func() error {
				_, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: first, TargetSnapshotId: second, StartingOffset: 2 * mdVolumeSize})
				return err
			}, codes.OutOfRange},
		}
		for _, tc := range tests {
			if got := status.Code(tc.call()); got != tc.code {
				t.Errorf("%s: code %v, want %v", tc.name, got, tc.code)
			}
		}
	})

	// A deleted snapshot is NOT_FOUND, and so is a delta from it.
	if _, err := d.controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: first}); err != nil {
		t.Fatal(err)
	}
	if _, err := mdAllocated(ctx, c, &csi.GetMetadataAllocatedRequest{SnapshotId: first}); status.Code(err) != codes.NotFound {
		t.Errorf("allocated of a deleted snapshot: %v, want NOT_FOUND", err)
	}
	if _, err := mdDelta(ctx, c, &csi.GetMetadataDeltaRequest{BaseSnapshotId: first, TargetSnapshotId: second}); status.Code(err) != codes.NotFound {
		t.Errorf("delta from a deleted snapshot: %v, want NOT_FOUND", err)
	}
}

// detachUnder detaches every loop device whose backing file lies under dir.
func mdDetachUnder(t *testing.T, dir string) {
	devs, err := loop.List(context.Background())
	if err != nil {
		t.Errorf("list loop devices: %v", err)
		return
	}
	for _, dv := range devs {
		if strings.HasPrefix(dv.BackingFile, dir+"/") {
			if err := loop.DetachBound(context.Background(), dv); err != nil {
				t.Errorf("detach %s: %v", dv.Path, err)
			}
		}
	}
}

// TestSnapshotMetadataMaxResultsClamped: a max_results far above what one
// message should carry still streams messages of at most 1024 entries
// (the server's bound), every allocated range once: one message of all
// ranges would be built whole in memory and outgrow what a client
// accepts.
func TestSnapshotMetadataMaxResultsClamped(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
	const ranges, bound = 1100, 1024
	size := int64(2*ranges) * mdBlock
	d := startDaemon(t, daemonOptions{backend: "loopfile", wasm: moduletest.Build(t, "../examples/loopfile", moduletest.Go), hostcalls: []string{"file", "loop"}})
	t.Cleanup(func() { mdDetachUnder(t, d.pool) })
	ctx := context.Background()
	work := t.TempDir()
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol, err := d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "metadata-many", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{block},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	staging, target := filepath.Join(work, "staging"), filepath.Join(work, "target")
	if _, err := d.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: block, VolumeContext: vol.GetVolume().GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	staged := true
	unstage := func() {
		if !staged {
			return
		}
		staged = false
		if _, err := d.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Errorf("unpublish: %v", err)
		}
		if _, err := d.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Errorf("unstage: %v", err)
		}
	}
	t.Cleanup(unstage)
	if _, err := d.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: block, VolumeContext: vol.GetVolume().GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(ranges) {
		if _, err := f.WriteAt(mdData("many", 2*i*mdBlock, mdBlock), 2*i*mdBlock); err != nil {
			f.Close()
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r, err := d.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "metadata-many-1", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	unstage()
	msgs, err := mdAllocated(ctx, csi.NewSnapshotMetadataClient(d.conn), &csi.GetMetadataAllocatedRequest{SnapshotId: r.GetSnapshot().GetSnapshotId(), MaxResults: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, m := range msgs {
		if len(m.ranges) > bound {
			t.Errorf("a message of %d ranges, want at most %d", len(m.ranges), bound)
		}
		total += len(m.ranges)
	}
	if total != ranges {
		t.Errorf("%d ranges in %d messages, want %d", total, len(msgs), ranges)
	}
}
