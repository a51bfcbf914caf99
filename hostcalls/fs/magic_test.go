package fs

import (
	"context"
	"io"
	"os"
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
			if got, err := Probe(ctx, dev); err != nil || got != "" {
				t.Fatalf("blank device probed as %q (%v)", got, err)
			}
			mounttest.Mkfs(t, tc.fstype, dev, tc.mkfs...)
			in, err := Inspect(ctx, dev)
			if err != nil {
				t.Fatal(err)
			}
			in.Close()
			got := in.Type
			if got != knownMagicOf(t, dev) {
				t.Fatalf("Inspect says %q, the magic alone %q", got, knownMagicOf(t, dev))
			}
			// The size Inspect read along is ReadSize's.
			size, ok, err := ReadSize(ctx, dev)
			if err != nil {
				t.Fatal(err)
			}
			if ok != in.SizeOK || size != in.Size {
				t.Fatalf("Inspect size %+v (%v), ReadSize %+v (%v)", in.Size, in.SizeOK, size, ok)
			}
			if want := tc.fstype == "ext4" || tc.fstype == "xfs" || tc.fstype == "btrfs"; ok != want {
				t.Fatalf("size read: %v, want %v", ok, want)
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

// knownMagicOf reads the first bytes of dev and recognizes them.
func knownMagicOf(t *testing.T, dev string) string {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, superblockBytes)
	n, err := io.ReadFull(f, b)
	if err != nil && n == 0 {
		t.Fatal(err)
	}
	return knownMagic(b[:n])
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

// An ext4 over a btrfs that was not wiped still carries btrfs's magic at
// 64 KiB; Inspect reads the first 4 KiB only and takes the ext4, whose
// superblock is what a mount of the device finds.
func TestInspectFirstBytesWin(t *testing.T) {
	looptest.Require(t)
	ctx := context.Background()
	dev, _ := looptest.Device(t, 64<<20)
	mounttest.Mkfs(t, "ext4", dev)
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("_BHRfS_M"), btrfsMagicOffset)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	in, err := Inspect(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	in.Close()
	if in.Type != Ext4 || !in.SizeOK || in.Size.Type != Ext4 {
		t.Fatalf("Inspect: %q, size %+v (%v); want ext4 with its size", in.Type, in.Size, in.SizeOK)
	}
}
