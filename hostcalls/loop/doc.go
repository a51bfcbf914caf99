// Package loop attaches regular files (and, for the host's read-only block
// publications, block devices) to Linux loop devices and finds, resizes,
// lists and detaches them, by ioctl on /dev/loop-control and
// /dev/loopN and by reading sysfs. It never runs losetup, never formats or
// mounts anything, never touches a device that is not a loop device, and never
// sets LO_FLAGS_AUTOCLEAR on a device it attaches: a wasmcsi volume stays
// attached until Detach, across daemon restarts, and List lets the daemon
// reconcile what it finds at start-up.
//
// # Identity
//
// A loop device is matched to its file by the device and inode numbers the
// kernel reports (LOOP_GET_STATUS64), never by path alone: a backing file may
// be renamed or deleted while attached, and sysfs then shows a stale path or
// one with a " (deleted)" suffix. BackingFile carries the path sysfs shows,
// without that suffix; BackingDeleted says the suffix was real.
//
// # One description per operation
//
// Describing a device (LOOP_GET_STATUS64, BLKGETSIZE64 and the sysfs
// backing_file) is done once per operation: what Attach, Find or Status
// described goes into the operation's memo (hostcalls.Memo), keyed by the
// device's path, and a later look at the same device in the same operation
// (the host's claim after node_stage, the grant check of loop_detach after
// loop_find) reads only the device's status and disk sequence number, by
// ioctl, and the backing file's path from sysfs (a rename may have moved
// the file, even out of the caller's roots, and the grant goes by the
// path), and reuses the rest when both ioctls say the device is still
// bound as it was. The kernel bumps the disk sequence number on every
// bind and unbind (LOOP_CONFIGURE, LOOP_CLR_FD), and the status names the
// backing file by st_dev and st_ino, so a device detached and bound again
// meanwhile, to another file or to the same one, is described afresh.
// Before Linux 5.15 (no BLKGETDISKSEQ) only the status tells bindings
// apart.
//
// The loop_detach host call checks its grant through a plain open before
// it opens the device O_EXCL, which claims the device while it lasts: a
// caller the device is not granted to never holds it (the owner's mkfs or
// mount would fail with EBUSY meanwhile). Through the exclusive descriptor
// it then confirms, by status and disk sequence number alone, that the
// device is still bound as the grant saw it, and detaches it.
//
// A search for one file (Attach's check that the file is not attached
// yet, Find) walks every bound device, but opens only those bound since
// it last looked: it remembers, per device, the backing file's identity
// with the disk sequence number sysfs showed before it read the status,
// and skips a device whose number is unchanged (the kernel never reuses
// one, and a binding's file never changes).
//
// A device number names a binding only while it lasts: once a device is
// detached, LOOP_CTL_GET_FREE hands the number to the next attacher of any
// process, usually at once. A detach by path of a device seen earlier (a
// cleanup, a sweep after a listing) therefore uses DetachBound, which
// unbinds the device only while the file it was seen with still backs it,
// as the detaching descriptor shows; Detach unbinds whatever backs the
// number now. A stale detach by path once unbound a device another process
// had just attached, between its LOOP_CONFIGURE and its next look.
//
// # Concurrency
//
// Attach takes no process-wide lock. Picking a device is the kernel's job:
// LOOP_CTL_GET_FREE names a free device, LOOP_CONFIGURE binds it atomically
// and fails with EBUSY when another attacher (this process, another process,
// or losetup) won the race, in which case Attach asks for another free device.
// Two attaches of the same file must not yield two devices, so Attach holds
// an exclusive flock(2) on the backing file, taken on a descriptor of its own
// (never the one handed to the kernel, which would keep the lock alive for as
// long as the device exists), from its look-up to the end of the bind. The
// lock is per file: attaches of different files never wait for each other,
// and it also covers other processes that use this package.
//
// # The data path
//
// Options.DirectIO sets LO_FLAGS_DIRECT_IO in LOOP_CONFIGURE, and
// Device.DirectIO is what the kernel applied (the same flag sysfs shows
// as loop/dio). With it, the kernel gives the device the logical block
// size of the backing file's direct-I/O alignment (512 bytes on most
// disks, 4096 on 4096-byte-sector ones), so every request reaches the
// file as direct I/O; Attach leaves the block size to it. A larger block
// size, such as the backing filesystem's 4096, measured no faster for
// 4 KiB-aligned I/O, and it cannot be changed under an existing volume:
// a filesystem made with smaller sectors or blocks refuses to mount on
// it. The driver's one hardware queue of 128 requests (hw_queue_depth)
// and its readahead are left as they are: no queue depth a workload
// reaches waits for a tag, and readahead does not touch direct I/O. What
// remains between a loop device and its file is the driver's hand-off of
// every request to a kernel worker thread (examples/loopfile/README.md
// has the measurements).
//
// # Requirements
//
// Linux 5.8 or later (LOOP_CONFIGURE), CAP_SYS_ADMIN, /dev/loop-control and
// /dev/loopN nodes (devtmpfs), sysfs at /sys and procfs at /proc.
package loop
