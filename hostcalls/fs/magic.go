package fs

import (
	"bytes"
	"encoding/binary"
)

// Fast recognition of the filesystems this package makes. Running blkid
// costs 5–17 ms per call, most of a NodeStage of an already formatted
// volume. The superblocks of ext2/3/4, XFS and btrfs carry fixed magic
// numbers, so the host reads them in process and runs blkid only when none
// matches: that is when the safe-format decision needs blkid's full probe
// (a blank device, or one holding anything else). A match never leads to a
// format, so it cannot destroy data.

const (
	ext4MagicOffset  = 1080 // s_magic, 0xEF53 little-endian, in the superblock at 1024
	xfsMagicOffset   = 0    // "XFSB"
	btrfsMagicOffset = 65600
	// firstBytes holds the ext and xfs superblocks, which Inspect
	// recognizes without reading further. A device that holds one of them
	// and a btrfs superblock at 64 KiB too (a filesystem made over another
	// without wiping it) is taken for the ext or xfs: its first bytes are
	// what the kernel mounts as that type.
	firstBytes = 4 << 10
)

// ext superblock feature bits that tell ext4 from ext3 and ext2.
const (
	extCompatHasJournal = 0x4
	extIncompatExtents  = 0x40
	extIncompat64Bit    = 0x80
	extIncompatFlexBG   = 0x200
)

// knownMagic recognizes a superblock in the first bytes of a device.
func knownMagic(b []byte) string {
	switch {
	case len(b) >= 4 && bytes.Equal(b[xfsMagicOffset:xfsMagicOffset+4], []byte("XFSB")):
		return "xfs"
	case len(b) >= btrfsMagicOffset+8 && bytes.Equal(b[btrfsMagicOffset:btrfsMagicOffset+8], []byte("_BHRfS_M")):
		return "btrfs"
	case len(b) >= 1024+100 && binary.LittleEndian.Uint16(b[ext4MagicOffset:]) == 0xEF53:
		sb := b[1024:]
		compat := binary.LittleEndian.Uint32(sb[92:])
		incompat := binary.LittleEndian.Uint32(sb[96:])
		switch {
		case incompat&(extIncompatExtents|extIncompat64Bit|extIncompatFlexBG) != 0:
			return "ext4"
		case compat&extCompatHasJournal != 0:
			return "ext3"
		default:
			return "ext2"
		}
	}
	return ""
}
