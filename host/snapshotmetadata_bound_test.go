package host

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestThinRangesBounded: a thin device's ranges are all read (the pool's
// metadata snapshot released) before the first message goes out, so a
// slow client never holds the pool's metadata; and a max_results far
// above maxMaxResults still sends messages of at most maxMaxResults
// entries, every range once, in order.
func TestThinRangesBounded(t *testing.T) {
	const n = 3*maxMaxResults + 7
	listing := false
	var msgs [][]*csi.BlockMetadata
	out := &rangeSender{max: batch(1 << 30), send: func(bm []*csi.BlockMetadata) error {
		if listing {
			t.Fatal("a message was sent while the metadata was still being read")
		}
		msgs = append(msgs, bm)
		return nil
	}}
	err := thinRanges(4096, int64(n+1)*8192, out, func(emit func(start, end int64) error) error {
		listing = true
		defer func() { listing = false }()
		for i := range int64(n + 1) {
			if err := emit(i*8192, i*8192+4096); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []*csi.BlockMetadata
	for _, m := range msgs {
		if len(m) > maxMaxResults {
			t.Errorf("a message of %d entries, want at most %d", len(m), maxMaxResults)
		}
		got = append(got, m...)
	}
	if len(got) != n {
		t.Fatalf("%d ranges sent, want %d", len(got), n)
	}
	for i, b := range got {
		if want := int64(i+1) * 8192; b.GetByteOffset() != want || b.GetSizeBytes() != 4096 {
			t.Fatalf("range %d: %d+%d, want %d+4096", i, b.GetByteOffset(), b.GetSizeBytes(), want)
		}
	}
	for _, max := range []int32{1 << 30, maxMaxResults + 1} {
		if b := batch(max); b != maxMaxResults {
			t.Errorf("max_results %d: batches of %d, want %d", max, b, maxMaxResults)
		}
	}
	if b := batch(5); b != 5 {
		t.Errorf("max_results 5: batches of %d", b)
	}
}
