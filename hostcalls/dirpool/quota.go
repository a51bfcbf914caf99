package dirpool

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Project quotas limit the blocks charged to a project ID. A directory gets
// an ID with FS_IOC_FSSETXATTR plus FS_XFLAG_PROJINHERIT, so everything
// created below it is charged to the same ID; the limit is set with
// quotactl_fd(2) on the pool's descriptor (Q_XSETQLIM on xfs, Q_SETQUOTA on
// ext4). Both filesystems then report the limit as the directory's size in
// statfs(2).
//
// Choosing project IDs: an ID is per filesystem, and several pools (or other
// tools) may share one. The ID of a directory is its inode number when that
// fits in 32 bits (always on ext4, and on xfs below about 1 TiB of inodes)
// -- unique on the filesystem while the directory lives -- else an FNV hash
// of the pool root and name. Before use the candidate is checked free (no
// inode or block charged to it and no limit set); a taken one moves to the
// next value, up to maxProbe times. A directory that already carries an ID
// of its own keeps it, so SetQuota is idempotent and raising a quota keeps
// the usage. Remove clears the limit of the removed directory's own ID, so
// the inode number's next owner starts clean. Nothing is stored outside the
// filesystem.
//
// Durability: a limit lives in the filesystem's quota records (xfs's dquot
// log items, ext4's journaled quota inode), which reach the disk with the
// next journal commit, seconds later. SetQuota (and Create with a quota)
// therefore ends with a metadata-only journal commit (commitQuota), after
// the project ID is on the tree and the limit set, and before it answers,
// also when the limit was already set (a repeat of a call cut off before
// its commit). It touches the directory's inode and fsyncs it, which
// commits the journal up to and including the quota change and writes back
// no volume's data, unlike syncfs(2). Neither a bare fsync nor Q_SYNC
// would do: on xfs an fsync of a directory whose inode did not change
// forces nothing (TestQuotaDurableBeforeAnswer fails so), and Q_SYNC
// writes ext4's dquots into its journal without committing it and is a
// no-op on xfs. Remove's clearing of a freed ID's limit is not synced: a
// limit a power loss brings back only makes pickProject skip that ID.
//
// Enforcement: xfs enforces project quotas for everyone and answers ENOSPC;
// ext4 answers EDQUOT and, like every filesystem on the generic quota code,
// lets a process with CAP_SYS_RESOURCE exceed hard limits. Workloads
// normally lack that capability.

type quotaKind int

const (
	quotaNone quotaKind = iota
	quotaXFS
	quotaExt4
)

// Kernel constants (linux/quota.h, linux/dqblk_xfs.h, linux/fs.h); x/sys
// does not carry them.
const (
	prjQuota = 2 // PRJQUOTA

	qGetQuota  = 0x800007 // Q_GETQUOTA
	qSetQuota  = 0x800008 // Q_SETQUOTA
	qXGetQuota = 0x5803   // Q_XGETQUOTA, XQM_CMD(3)
	qXSetQLim  = 0x5804   // Q_XSETQLIM, XQM_CMD(4)
	qXGetQStat = 0x5805   // Q_XGETQSTAT, XQM_CMD(5)

	fsQuotaPDQAcct = 1 << 4 // FS_QUOTA_PDQ_ACCT
	fsQuotaPDQEnfd = 1 << 5 // FS_QUOTA_PDQ_ENFD

	fsDquotVersion = 1      // FS_DQUOT_VERSION
	fsProjQuota    = 2      // FS_PROJ_QUOTA (d_flags)
	fsDQBSoft      = 1 << 2 // FS_DQ_BSOFT
	fsDQBHard      = 1 << 3 // FS_DQ_BHARD
	qifBLimits     = 1      // QIF_BLIMITS
	qifDQBlkSize   = 1024   // QIF_DQBLKSIZE: unit of if_dqblk block limits

	fsIocFSGetXattr  = 0x801c581f // FS_IOC_FSGETXATTR
	fsIocFSSetXattr  = 0x401c5820 // FS_IOC_FSSETXATTR
	fsXflagProjInher = 0x200      // FS_XFLAG_PROJINHERIT

	maxProbe = 64
)

// fsxattr is struct fsxattr of linux/fs.h.
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	Pad        [8]byte
}

// fsDiskQuota is struct fs_disk_quota of linux/dqblk_xfs.h. Block values
// are in 512-byte basic blocks.
type fsDiskQuota struct {
	Version      int8
	Flags        int8
	Fieldmask    uint16
	ID           uint32
	BlkHardlimit uint64
	BlkSoftlimit uint64
	InoHardlimit uint64
	InoSoftlimit uint64
	Bcount       uint64
	Icount       uint64
	Itimer       int32
	Btimer       int32
	Iwarns       uint16
	Bwarns       uint16
	ItimerHi     int8
	BtimerHi     int8
	RtbtimerHi   int8
	Padding2     int8
	RtbHardlimit uint64
	RtbSoftlimit uint64
	Rtbcount     uint64
	Rtbtimer     int32
	Rtbwarns     uint16
	Padding3     int16
	Padding4     [8]byte
}

// ifDqblk is struct if_dqblk of linux/quota.h. Limits are in 1 KiB blocks,
// the current space in bytes.
type ifDqblk struct {
	BHardlimit uint64
	BSoftlimit uint64
	CurSpace   uint64
	IHardlimit uint64
	ISoftlimit uint64
	CurInodes  uint64
	BTime      uint64
	ITime      uint64
	Valid      uint32
}

var (
	_ [112]byte = [unsafe.Sizeof(fsDiskQuota{})]byte{}
	_ [72]byte  = [unsafe.Sizeof(ifDqblk{})]byte{}
	_ [28]byte  = [unsafe.Sizeof(fsxattr{})]byte{}
)

func qcmd(cmd, typ uint32) uint32 { return cmd<<8 | typ&0xff }

// quotactlFd is quotactl_fd(2) (Linux 5.14): quotactl on the filesystem of
// fd, with no need to name its block device.
func quotactlFd(fd int, cmd uint32, id uint32, addr unsafe.Pointer) error {
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), uintptr(cmd), uintptr(id), uintptr(addr), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// probeQuota decides once, at Open, whether the pool's filesystem enforces
// project quotas: xfs or ext4, with project accounting and enforcement on
// (xfs mounted with prjquota/pquota, ext4 with the quota+project features
// mounted with prjquota). Quota state cannot change without a new mount.
func (p *Pool) probeQuota() {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(p.fd, &sfs); err != nil {
		p.noQuota = "statfs: " + err.Error()
		return
	}
	var kind quotaKind
	switch sfs.Type {
	case unix.XFS_SUPER_MAGIC:
		kind = quotaXFS
	case unix.EXT4_SUPER_MAGIC:
		kind = quotaExt4
	default:
		p.noQuota = fmt.Sprintf("filesystem type 0x%x is neither xfs nor ext4", sfs.Type)
		return
	}
	var stat [128]byte // struct fs_quota_stat; qs_flags is the u16 at offset 2
	err := quotactlFd(p.fd, qcmd(qXGetQStat, prjQuota), 0, unsafe.Pointer(&stat[0]))
	switch {
	case errors.Is(err, unix.ENOSYS):
		p.noQuota = "the kernel has no quota support"
		return
	case err != nil:
		p.noQuota = "quota state: " + err.Error()
		return
	}
	flags := *(*uint16)(unsafe.Pointer(&stat[2]))
	if flags&fsQuotaPDQAcct == 0 || flags&fsQuotaPDQEnfd == 0 {
		p.noQuota = "project quotas are not enforced (mount with prjquota)"
		return
	}
	var root fsxattr
	if err := getFsxattr(p.fd, &root); err != nil {
		p.noQuota = "FS_IOC_FSGETXATTR on the root: " + err.Error()
		return
	}
	p.rootProj = root.Projid
	p.quota = kind
}

// QuotaSupported reports whether SetQuota can work on this pool.
func (p *Pool) QuotaSupported() bool { return p.quota != quotaNone }

func (p *Pool) unsupported(op string) error {
	return abi.Errorf(abi.FailedPrecondition, "dirpool: %s: project quotas unsupported on %s: %s", op, p.root, p.noQuota)
}

// SetQuota limits the blocks of the directory name to bytes (rounded up to
// the filesystem's quota unit: 512 B on xfs, 1 KiB on ext4); 0 removes the
// limit but keeps the accounting. The directory gets a project ID of its
// own (see the comment at the top of this file) and everything already in
// it is charged to that ID. On a pool without quota support it fails with
// FailedPrecondition.
func (p *Pool) SetQuota(ctx context.Context, name string, bytes int64) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if bytes < 0 {
		return abi.Errorf(abi.InvalidArgument, "dirpool: set quota %q: negative quota %d", name, bytes)
	}
	if p.quota == quotaNone {
		return p.unsupported("set quota " + quoteName(name))
	}
	fd, err := p.openVolume(name)
	if err != nil {
		return wrap("set quota", name, err)
	}
	defer unix.Close(fd)
	return p.setQuota(ctx, name, fd, bytes)
}

func (p *Pool) setQuota(ctx context.Context, name string, fd int, bytes int64) error {
	if err := p.setQuotaLocked(ctx, name, fd, bytes); err != nil {
		return err
	}
	// Outside the lock: a slow commit holds back no other volume's quota.
	if err := commitQuota(fd); err != nil {
		return wrap("set quota", name, err)
	}
	return nil
}

// commitQuota makes the limit just set durable without writing back any
// file's data: it changes the directory's inode (FS_IOC_FSSETXATTR again
// with the values it has, which updates its ctime in a journal transaction)
// and fsyncs it. The fsync commits the journal up to that change -- ext4
// commits the running jbd2 transaction, xfs forces the log up to the
// inode's sequence -- and both commit in order, so the quota transaction
// before it goes too. Without the change the fsync commits nothing.
func commitQuota(fd int) error {
	var fa fsxattr
	if err := getFsxattr(fd, &fa); err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFSSetXattr, uintptr(unsafe.Pointer(&fa))); e != 0 {
		return fmt.Errorf("FS_IOC_FSSETXATTR: %w", e)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	return nil
}

func (p *Pool) setQuotaLocked(ctx context.Context, name string, fd int, bytes int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	proj, own := p.projectOf(fd)
	if !own {
		var err error
		if proj, err = p.pickProject(fd, name); err != nil {
			return wrap("set quota", name, err)
		}
		if err := labelTree(ctx, fd, proj); err != nil {
			return wrap("set quota", name, err)
		}
	}
	if err := p.setLimit(proj, bytes); err != nil {
		return wrap("set quota", name, err)
	}
	return nil
}

// projectOf returns the project ID of the directory at fd and whether it is
// one of its own (neither 0 nor inherited from the pool root).
func (p *Pool) projectOf(fd int) (uint32, bool) {
	var fa fsxattr
	if err := getFsxattr(fd, &fa); err != nil {
		return 0, false
	}
	return fa.Projid, fa.Projid != 0 && fa.Projid != p.rootProj
}

// ownProject is projectOf by name, for Remove.
func (p *Pool) ownProject(name string) (uint32, bool) {
	if p.quota == quotaNone {
		return 0, false
	}
	fd, err := p.openVolume(name)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	return p.projectOf(fd)
}

func (p *Pool) pickProject(fd int, name string) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	cand := uint32(st.Ino)
	if st.Ino > 0xfffffffe || cand == 0 {
		cand = hashProject(p.root, name)
	}
	for i := 0; i < maxProbe; i++ {
		if cand != 0 && cand != 0xffffffff && cand != p.rootProj {
			u, err := p.getQuota(cand)
			if err != nil {
				return 0, err
			}
			if u.free() {
				return cand, nil
			}
		}
		cand++
	}
	return 0, abi.Errorf(abi.ResourceExhausted, "no free project ID near %d after %d tries", cand-maxProbe, maxProbe)
}

// hashProject is FNV-1a of root and name, folded into 2^30..2^31-1 to stay
// clear of the IDs small inode numbers produce.
func hashProject(root, name string) uint32 {
	h := uint32(2166136261)
	for _, s := range []string{root, "\x00", name} {
		for i := 0; i < len(s); i++ {
			h ^= uint32(s[i])
			h *= 16777619
		}
	}
	return h&0x7fffffff | 1<<30
}

// labelTree gives the directory at fd and everything below it the project
// ID proj; directories also get PROJINHERIT. Only directories and regular
// files are relabeled: opening a device or FIFO could have side effects,
// and symlinks cannot be opened for the ioctl. Their few bytes stay charged
// to the old ID.
func labelTree(ctx context.Context, fd int, proj uint32) error {
	if err := setProject(fd, proj, true); err != nil {
		return err
	}
	return eachName(ctx, fd, func(name string) error {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("stat %s: %w", name, err)
		}
		var flags int
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			flags = unix.O_RDONLY | unix.O_DIRECTORY
		case unix.S_IFREG:
			flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY
		default:
			return nil
		}
		child, err := openBeneath(fd, name, flags, 0)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EXDEV) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", name, err)
		}
		defer unix.Close(child)
		if flags&unix.O_DIRECTORY != 0 {
			err = labelTree(ctx, child, proj)
		} else {
			err = setProject(child, proj, false)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

func setProject(fd int, proj uint32, dir bool) error {
	var fa fsxattr
	if err := getFsxattr(fd, &fa); err != nil {
		return err
	}
	want := fa.Xflags
	if dir {
		want |= fsXflagProjInher
	}
	if fa.Projid == proj && fa.Xflags == want {
		return nil
	}
	fa.Projid, fa.Xflags = proj, want
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFSSetXattr, uintptr(unsafe.Pointer(&fa))); e != 0 {
		return fmt.Errorf("FS_IOC_FSSETXATTR: %w", e)
	}
	return nil
}

func getFsxattr(fd int, fa *fsxattr) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFSGetXattr, uintptr(unsafe.Pointer(fa))); e != 0 {
		return fmt.Errorf("FS_IOC_FSGETXATTR: %w", e)
	}
	return nil
}

// quotaUsage is one project's accounting and limits in bytes.
type quotaUsage struct {
	bytes, inodes        int64
	hardBytes, softBytes int64
	hardInodes           int64
}

func (u quotaUsage) free() bool {
	return u.bytes == 0 && u.inodes == 0 && u.hardBytes == 0 && u.softBytes == 0 && u.hardInodes == 0
}

func (p *Pool) getQuota(proj uint32) (quotaUsage, error) {
	switch p.quota {
	case quotaXFS:
		var d fsDiskQuota
		err := quotactlFd(p.fd, qcmd(qXGetQuota, prjQuota), proj, unsafe.Pointer(&d))
		if errors.Is(err, unix.ENOENT) {
			return quotaUsage{}, nil // no dquot: never used
		}
		if err != nil {
			return quotaUsage{}, fmt.Errorf("Q_XGETQUOTA project %d: %w", proj, err)
		}
		return quotaUsage{
			bytes:      int64(d.Bcount) * 512,
			inodes:     int64(d.Icount),
			hardBytes:  int64(d.BlkHardlimit) * 512,
			softBytes:  int64(d.BlkSoftlimit) * 512,
			hardInodes: int64(d.InoHardlimit),
		}, nil
	case quotaExt4:
		var d ifDqblk
		if err := quotactlFd(p.fd, qcmd(qGetQuota, prjQuota), proj, unsafe.Pointer(&d)); err != nil {
			return quotaUsage{}, fmt.Errorf("Q_GETQUOTA project %d: %w", proj, err)
		}
		return quotaUsage{
			bytes:      int64(d.CurSpace),
			inodes:     int64(d.CurInodes),
			hardBytes:  int64(d.BHardlimit) * qifDQBlkSize,
			softBytes:  int64(d.BSoftlimit) * qifDQBlkSize,
			hardInodes: int64(d.IHardlimit),
		}, nil
	}
	return quotaUsage{}, p.unsupported("get quota")
}

// setLimit sets the hard block limit of proj to bytes (0: none) and clears
// the soft limit.
func (p *Pool) setLimit(proj uint32, bytes int64) error {
	switch p.quota {
	case quotaXFS:
		d := fsDiskQuota{
			Version:      fsDquotVersion,
			Flags:        fsProjQuota,
			Fieldmask:    fsDQBHard | fsDQBSoft,
			ID:           proj,
			BlkHardlimit: uint64((bytes + 511) / 512),
		}
		if err := quotactlFd(p.fd, qcmd(qXSetQLim, prjQuota), proj, unsafe.Pointer(&d)); err != nil {
			return fmt.Errorf("Q_XSETQLIM project %d: %w", proj, err)
		}
		return nil
	case quotaExt4:
		d := ifDqblk{
			BHardlimit: uint64((bytes + qifDQBlkSize - 1) / qifDQBlkSize),
			Valid:      qifBLimits,
		}
		if err := quotactlFd(p.fd, qcmd(qSetQuota, prjQuota), proj, unsafe.Pointer(&d)); err != nil {
			return fmt.Errorf("Q_SETQUOTA project %d: %w", proj, err)
		}
		return nil
	}
	return p.unsupported("set quota")
}

// releaseProject clears the limits of proj, the own project of a directory
// just removed. Usage may linger for a moment (xfs frees inodes in the
// background), so the limit is cleared without waiting for it.
func (p *Pool) releaseProject(proj uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setLimit(proj, 0)
}
