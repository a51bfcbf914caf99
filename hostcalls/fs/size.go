package fs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Size is what a filesystem's superblock says about its extent on its
// device, and what Grow would make of it.
type Size struct {
	// Type is "ext4", "xfs" or "btrfs".
	Type string
	// Bytes is the part of the device the filesystem spans now.
	Bytes int64
	// DeviceBytes is the device's size.
	DeviceBytes int64
	// GrowBytes is what the filesystem would span after Grow on this
	// device: more than Bytes when growing gains something, else Bytes.
	// It follows the tools' own rules, so that a device larger than its
	// filesystem by less than the tools would add (a last ext4 block group
	// too small for its bookkeeping, an xfs allocation group under 64
	// blocks) does not call for a grow that changes nothing.
	GrowBytes int64
}

// minGrowth is the least gain that makes a grow worth its cost: a forced
// check and a resize of an ext4 to add one block that the tools' rules
// happen to allow is not.
const minGrowth = 1 << 20

// Growable reports whether Grow would make the filesystem larger by at
// least 1 MiB.
func (s Size) Growable() bool { return s.GrowBytes-s.Bytes >= minGrowth }

// superblockBytes covers every superblock ReadSize parses: btrfs keeps its
// primary one in the 4 KiB at 64 KiB.
const superblockBytes = 64<<10 + 4<<10

// ReadSize reads the superblock of the ext4, xfs or btrfs filesystem on an
// unmounted device, in process (of a mounted ext4 too: its superblock
// lives in the device's page cache, which the read goes through). ok is false when the device holds none of
// them (or an ext2/ext3 without the features this package grows, or a
// btrfs spanning several devices). Inspect reports the same along with
// its probe, from the same read.
func ReadSize(ctx context.Context, device string) (s Size, ok bool, err error) {
	if err := checkDevice(device); err != nil {
		return Size{}, false, fmt.Errorf("size of filesystem on %s: %w", device, err)
	}
	f, err := os.OpenFile(device, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Size{}, false, fmt.Errorf("size of filesystem on %s: %w", device, err)
	}
	defer f.Close()
	buf := make([]byte, superblockBytes)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Size{}, false, fmt.Errorf("size of filesystem on %s: read: %w", device, err)
	}
	dev, err := DeviceSize(ctx, device)
	if err != nil {
		return Size{}, false, err
	}
	s, ok = sizeOf(buf[:n], dev, int64(os.Getpagesize()))
	return s, ok, nil
}

// sizeOf parses the superblock at the start of b (the device's first
// bytes) for a device of dev bytes.
func sizeOf(b []byte, dev, pageSize int64) (Size, bool) {
	switch knownMagic(b) {
	case Ext4:
		return ext4Size(b[1024:], dev, pageSize)
	case XFS:
		return xfsSize(b, dev)
	case Btrfs:
		return btrfsSize(b, dev)
	}
	return Size{}, false
}

// ext superblock fields (offsets in the superblock at byte 1024).
const (
	extBlocksCountLo    = 4
	extFirstDataBlock   = 20
	extLogBlockSize     = 24
	extLogClusterSize   = 28
	extBlocksPerGroup   = 32
	extInodesPerGroup   = 40
	extInodeSize        = 88
	extFeatureIncompat  = 96
	extFeatureRoCompat  = 100
	extReservedGDT      = 206
	extDescSize         = 254
	extBlocksCountHi    = 336
	extRoCompatBigalloc = 0x200
	extSuperblockBytes  = 1024
)

// ext4Size follows resize2fs: the new block count is the device's,
// rounded down to whole pages and clusters, and a last block group too
// small for its bookkeeping plus 50 blocks is dropped (adjust_fs_info).
// The bookkeeping counted here always includes a superblock and
// descriptor backup, which may overstate it for the last group by a few
// blocks: then a device that could have gained those blocks is left as it
// is, never grown in vain.
func ext4Size(sb []byte, dev, pageSize int64) (Size, bool) {
	if len(sb) < extSuperblockBytes {
		return Size{}, false
	}
	le32 := func(off int) int64 { return int64(binary.LittleEndian.Uint32(sb[off:])) }
	le16 := func(off int) int64 { return int64(binary.LittleEndian.Uint16(sb[off:])) }
	incompat := binary.LittleEndian.Uint32(sb[extFeatureIncompat:])
	logBlock := le32(extLogBlockSize)
	if logBlock > 6 {
		return Size{}, false // above 64 KiB blocks: not a superblock we trust
	}
	bs := int64(1024) << logBlock
	blocks := le32(extBlocksCountLo)
	is64 := incompat&extIncompat64Bit != 0
	if is64 {
		blocks |= le32(extBlocksCountHi) << 32
	}
	perGroup, firstData := le32(extBlocksPerGroup), le32(extFirstDataBlock)
	if perGroup == 0 || blocks <= firstData {
		return Size{}, false
	}
	s := Size{Type: Ext4, Bytes: blocks * bs, DeviceBytes: dev, GrowBytes: blocks * bs}

	nb := dev / bs
	if pageSize > bs {
		nb -= nb % (pageSize / bs)
	}
	if binary.LittleEndian.Uint32(sb[extFeatureRoCompat:])&extRoCompatBigalloc != 0 {
		if ratio := int64(1) << max(le32(extLogClusterSize)-logBlock, 0); ratio > 1 {
			nb -= nb % ratio
		}
	}
	if !is64 {
		nb = min(nb, 1<<32-1)
	}
	descSize := int64(32)
	if is64 && le16(extDescSize) > 0 {
		descSize = le16(extDescSize)
	}
	inodeSize := max(le16(extInodeSize), 128)
	inodeBlocks := (le32(extInodesPerGroup)*inodeSize + bs - 1) / bs
	groups := (nb - firstData + perGroup - 1) / perGroup
	descBlocks := (groups*descSize + bs - 1) / bs
	overhead := 2 + inodeBlocks + 1 + descBlocks + le16(extReservedGDT)
	if rem := (nb - firstData) % perGroup; groups > 1 && rem != 0 && rem < overhead+50 {
		nb -= rem
	}
	if nb > blocks {
		s.GrowBytes = nb * bs
	}
	return s, true
}

// xfsSize follows xfs_growfs: the new data block count is the device's,
// less a last allocation group under XFS_MIN_AG_BLOCKS (64 blocks), which
// the kernel does not add.
func xfsSize(b []byte, dev int64) (Size, bool) {
	if len(b) < 92 {
		return Size{}, false
	}
	bs := int64(binary.BigEndian.Uint32(b[4:]))
	blocks := int64(binary.BigEndian.Uint64(b[8:]))
	agBlocks := int64(binary.BigEndian.Uint32(b[84:]))
	if bs < 512 || bs > 64<<10 || agBlocks == 0 || blocks <= 0 {
		return Size{}, false
	}
	s := Size{Type: XFS, Bytes: blocks * bs, DeviceBytes: dev, GrowBytes: blocks * bs}
	nb := dev / bs
	if rem := nb % agBlocks; rem != 0 && rem < 64 {
		nb -= rem
	}
	if nb > blocks {
		s.GrowBytes = nb * bs
	}
	return s, true
}

// btrfs superblock fields (offsets in the superblock at 64 KiB).
const (
	btrfsSuperblock     = 64 << 10
	btrfsNumDevices     = 0x88
	btrfsSectorSize     = 0x90
	btrfsDevItemTotal   = 0xc9 + 8 // dev_item.total_bytes, after dev_item.devid
	btrfsSuperblockSize = 4 << 10
	btrfsMinResize      = 256 << 20
)

// btrfsSize reads the size this device gives its one-device filesystem
// (dev_item.total_bytes); `btrfs filesystem resize max` makes it the
// device's size rounded down to the sector size, and the kernel refuses
// any resize to less than 256 MiB.
func btrfsSize(b []byte, dev int64) (Size, bool) {
	if len(b) < btrfsSuperblock+btrfsSuperblockSize {
		return Size{}, false
	}
	sb := b[btrfsSuperblock:]
	if binary.LittleEndian.Uint64(sb[btrfsNumDevices:]) != 1 {
		return Size{}, false
	}
	sector := int64(binary.LittleEndian.Uint32(sb[btrfsSectorSize:]))
	total := int64(binary.LittleEndian.Uint64(sb[btrfsDevItemTotal:]))
	if sector < 512 || sector > 64<<10 || total <= 0 {
		return Size{}, false
	}
	s := Size{Type: Btrfs, Bytes: total, DeviceBytes: dev, GrowBytes: total}
	if nb := dev - dev%sector; nb > total && nb >= btrfsMinResize {
		s.GrowBytes = nb
	}
	return s, true
}
