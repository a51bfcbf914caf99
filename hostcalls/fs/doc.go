// Package fs puts filesystems on block devices and looks after them: it
// probes a device for any signature, makes ext4, xfs and btrfs, reads from
// their superblocks how much of the device they span and what a grow would
// make of it (ReadSize, in process), grows a filesystem to fill its grown
// device, and reports usage. The host's
// generic node steps compose these with mounting; modules never call this
// package directly.
//
// It must never format a device that holds anything it can recognise (a
// filesystem, a partition table, an LVM or RAID member, ...): Make probes
// first and refuses. It never mounts, never wipes signatures, and runs its
// programs with arguments built only from validated values, never through a
// shell.
//
// # Why programs and not syscalls
//
// Probe runs blkid(8) in low-level mode (`blkid -p -o export`), which reads
// the device itself (no cache) and knows several hundred superblock and
// partition-table formats, including ones at the end of a device (md 0.90,
// some RAID metadata). Reading superblocks here would know a handful and
// miss the rest, and the one mistake this package must not make is calling a
// device blank that is not. Data without any signature (a raw database,
// random bytes) is blank to blkid too; every CSI driver shares that limit.
// Make runs the filesystem's own tools (mkfs.*), because no library does
// that job. Grow of a mounted filesystem is the resize ioctl its tool calls
// (resize2fs, xfs_growfs, btrfs filesystem resize); an unmounted ext4 grows
// with e2fsck and resize2fs. Stats and DeviceSize are a statfs(2) and an
// ioctl.
//
// # Programs needed
//
// util-linux (blkid), e2fsprogs, xfsprogs and btrfs-progs, found in PATH or
// in /usr/sbin, /sbin, /usr/bin, /bin.
package fs
