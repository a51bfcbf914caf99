package fs

import (
	"context"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// The in-process recognition must agree with blkid on every filesystem this
// package makes, and must not claim a blank device.
func TestKnownFSAgreesWithBlkid(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	for _, tc := range []struct {
		fstype string
		size   int64
		mkfs   []string
	}{
		{"ext4", 64 << 20, nil},
		{"ext3", 64 << 20, nil},
		{"ext2", 64 << 20, nil},
		{"xfs", 320 << 20, nil},
		{"btrfs", 128 << 20, nil},
	} {
		t.Run(tc.fstype, func(t *testing.T) {
			dev, _ := looptest.Device(t, tc.size)
			if got, err := knownFS(dev); err != nil || got != "" {
				t.Fatalf("blank device recognized as %q (%v)", got, err)
			}
			mounttest.Mkfs(t, tc.fstype, dev, tc.mkfs...)
			got, err := knownFS(dev)
			if err != nil {
				t.Fatal(err)
			}
			out, err := run(ctx, "blkid", "-p", "-s", "TYPE", "-o", "value", dev)
			if err != nil {
				t.Fatalf("blkid: %v", err)
			}
			if want := string(trimNL(out)); got != want {
				t.Fatalf("recognized %q, blkid says %q", got, want)
			}
		})
	}
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

func TestKnownMagicShortInput(t *testing.T) {
	for _, n := range []int{0, 3, 1000, 1100, 65000} {
		if got := knownMagic(make([]byte, n)); got != "" {
			t.Errorf("%d zero bytes recognized as %q", n, got)
		}
	}
}
