package dm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Thin provisioning (Documentation/admin-guide/device-mapper/thin-provisioning.rst):
// a pool device (target thin-pool) joins a metadata device and a data
// device; thin volumes and their snapshots are numbered inside the pool's
// metadata (24-bit ids) and become block devices only when activated with a
// thin target. The pool's metadata keeps ids, mappings and sharing, and
// survives reboots; it keeps no sizes and no names. A thin volume's size
// lives only in its table, so callers record it and pass it to ActivateThin.

const (
	// MinBlockSectors and MaxBlockSectors bound a pool's data block size
	// (64 KiB to 1 GiB); it must be a multiple of MinBlockSectors.
	MinBlockSectors = 128
	MaxBlockSectors = 2097152
	// MaxThinID is the largest thin device id the metadata format holds.
	MaxThinID = 1<<24 - 1
	// MetadataBlockSize is the size of a metadata block in PoolStatus.
	MetadataBlockSize = 4096
	// MinMetadataSize and MaxMetadataSize bound a metadata device: below
	// 2 MiB a pool has no room to work; above ~15.9 GiB the kernel uses
	// only the first 15.9 GiB.
	MinMetadataSize = 2 << 20
	MaxMetadataSize = 255 * (1 << 14) * MetadataBlockSize

	thinMagic       = 27022010 // THIN_SUPERBLOCK_MAGIC
	sbMagicOff      = 32
	sbTransIDOff    = 48
	sbBlockSizeOff  = 336
	sbWipeSize      = 4096
	metaPerBlock    = 48   // metadata bytes budgeted per data block
	metaPerThinSize = 4096 // and per thin device
)

// MetadataSize returns the metadata device size (bytes) for a pool of
// dataBytes with blocks of blockSectors holding up to maxThins thin devices
// and snapshots: 48 bytes per data block plus 4 KiB per thin device,
// rounded up to 1 MiB, at least MinMetadataSize and at most
// MaxMetadataSize. thin_metadata_size asks ~33 bytes per block for the
// mappings alone; the margin covers snapshots unsharing btree nodes.
func MetadataSize(dataBytes, blockSectors, maxThins uint64) uint64 {
	if blockSectors == 0 {
		blockSectors = MinBlockSectors
	}
	blocks := (dataBytes + blockSectors*SectorSize - 1) / (blockSectors * SectorSize)
	size := blocks*metaPerBlock + maxThins*metaPerThinSize
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	return min(max(size, MinMetadataSize), MaxMetadataSize)
}

// Pool describes a thin pool; CreatePool and OpenPool return one bound to a
// Mapper, whose methods act on the pool and its thin devices. The thin
// device with id N is named <Name>-<N>, so it lies under Name's prefix.
type Pool struct {
	Name         string // dm name of the pool device
	MetaDev      string // metadata block device
	DataDev      string // data block device
	BlockSectors uint64 // data block size; OpenPool reads it from the metadata when 0
	LowWater     uint64 // free data blocks below which the kernel raises an event

	m *Mapper
	// dev is the pool device's major:minor, the thin tables' reference.
	dev string
}

// CreatePool formats a new pool on MetaDev and DataDev and activates it.
// The metadata device must hold no pool (AlreadyExists otherwise, so a
// mistake cannot wipe volumes); its first 4 KiB are zeroed, which makes the
// kernel write fresh metadata. Both devices must be unused (opened
// exclusively here).
func (m *Mapper) CreatePool(ctx context.Context, p Pool) (*Pool, error) {
	if err := m.confine(p.Name); err != nil {
		return nil, err
	}
	if err := validBlockSectors(p.BlockSectors); err != nil {
		return nil, fmt.Errorf("dm create pool %s: %w", p.Name, err)
	}
	info, err := m.Info(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	if info.Exists {
		return nil, abi.Errorf(abi.AlreadyExists, "dm create pool %s: device exists", p.Name)
	}
	if err := wipeMetadata(p.MetaDev); err != nil {
		return nil, fmt.Errorf("dm create pool %s: %w", p.Name, err)
	}
	return m.activatePool(ctx, p)
}

// OpenPool activates an existing pool without touching its metadata, e.g.
// after a reboot. It answers FailedPrecondition when MetaDev holds no pool
// and InvalidArgument when BlockSectors disagrees with the metadata. When
// the pool device is already active with the same devices it returns it.
func (m *Mapper) OpenPool(ctx context.Context, p Pool) (*Pool, error) {
	if err := m.confine(p.Name); err != nil {
		return nil, err
	}
	sb, err := readSuperblock(p.MetaDev)
	if err != nil {
		return nil, fmt.Errorf("dm open pool %s: %w", p.Name, err)
	}
	if !sb.valid {
		return nil, abi.Errorf(abi.FailedPrecondition, "dm open pool %s: %s holds no thin-pool metadata", p.Name, p.MetaDev)
	}
	switch {
	case p.BlockSectors == 0:
		p.BlockSectors = uint64(sb.blockSectors)
	case p.BlockSectors != uint64(sb.blockSectors):
		return nil, abi.Errorf(abi.InvalidArgument, "dm open pool %s: block size %d sectors, but the metadata says %d", p.Name, p.BlockSectors, sb.blockSectors)
	}
	info, err := m.Info(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	if !info.Exists {
		return m.activatePool(ctx, p)
	}
	meta, data, err := devNumbers(p.MetaDev, p.DataDev)
	if err != nil {
		return nil, fmt.Errorf("dm open pool %s: %w", p.Name, err)
	}
	table, err := m.Table(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	if len(table) != 1 || table[0].Type != "thin-pool" || !strings.HasPrefix(table[0].Params, meta+" "+data+" ") {
		return nil, abi.Errorf(abi.AlreadyExists, "dm open pool %s: the name is active with another table %q", p.Name, table)
	}
	p.m, p.dev = m, fmt.Sprintf("%d:%d", info.Major, info.Minor)
	return &p, nil
}

// AttachPool returns the active pool name as its live table describes it
// (devices as major:minor), for callers that know only the name. A missing
// device answers FailedPrecondition: the pool must be opened first.
func (m *Mapper) AttachPool(ctx context.Context, name string) (*Pool, error) {
	info, err := m.Info(ctx, name)
	if err != nil {
		return nil, err
	}
	if !info.Exists {
		return nil, abi.Errorf(abi.FailedPrecondition, "dm pool %s is not active; open it first", name)
	}
	table, err := m.Table(ctx, name)
	if err != nil {
		return nil, err
	}
	var f []string
	if len(table) == 1 && table[0].Type == "thin-pool" {
		f = strings.Fields(table[0].Params)
	}
	if len(f) < 4 {
		return nil, abi.Errorf(abi.FailedPrecondition, "dm pool %s: not a thin pool: %v", name, table)
	}
	block, err1 := strconv.ParseUint(f[2], 10, 64)
	low, err2 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil {
		return nil, abi.Errorf(abi.Internal, "dm pool %s: unreadable table %v", name, table)
	}
	return &Pool{Name: name, MetaDev: f[0], DataDev: f[1], BlockSectors: block, LowWater: low,
		m: m, dev: fmt.Sprintf("%d:%d", info.Major, info.Minor)}, nil
}

func (m *Mapper) activatePool(ctx context.Context, p Pool) (*Pool, error) {
	meta, data, err := devNumbers(p.MetaDev, p.DataDev)
	if err != nil {
		return nil, fmt.Errorf("dm pool %s: %w", p.Name, err)
	}
	metaSize, err := deviceSize(p.MetaDev)
	if err != nil {
		return nil, fmt.Errorf("dm pool %s: %w", p.Name, err)
	}
	if metaSize < MinMetadataSize {
		return nil, abi.Errorf(abi.InvalidArgument, "dm pool %s: metadata device %s has %d bytes, want at least %d", p.Name, p.MetaDev, metaSize, MinMetadataSize)
	}
	dataSize, err := deviceSize(p.DataDev)
	if err != nil {
		return nil, fmt.Errorf("dm pool %s: %w", p.Name, err)
	}
	sectors := dataSize / SectorSize / p.BlockSectors * p.BlockSectors
	if sectors == 0 {
		return nil, abi.Errorf(abi.InvalidArgument, "dm pool %s: data device %s is smaller than one block", p.Name, p.DataDev)
	}
	table := []Target{{Start: 0, Length: sectors, Type: "thin-pool",
		Params: fmt.Sprintf("%s %s %d %d 0", meta, data, p.BlockSectors, p.LowWater)}}
	if _, err := m.Create(ctx, p.Name, table); err != nil {
		return nil, err
	}
	info, err := m.Info(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	p.m, p.dev = m, fmt.Sprintf("%d:%d", info.Major, info.Minor)
	return &p, nil
}

// Path returns the pool device's node.
func (p *Pool) Path() string { return p.m.Path(p.Name) }

// ThinName returns the dm name of thin device id.
func (p *Pool) ThinName(id uint32) string { return p.Name + "-" + strconv.FormatUint(uint64(id), 10) }

// CreateThin creates thin device id of sizeSectors in the pool and
// activates it, returning its node. An id in use answers AlreadyExists;
// when activation fails the new id is deleted again.
func (p *Pool) CreateThin(ctx context.Context, id uint32, sizeSectors uint64) (string, error) {
	if err := p.checkThin(id, sizeSectors); err != nil {
		return "", err
	}
	if err := p.message(ctx, "create_thin "+itoa(id)); err != nil {
		return "", err
	}
	path, err := p.ActivateThin(ctx, id, sizeSectors)
	if err != nil {
		if derr := p.message(context.WithoutCancel(ctx), "delete "+itoa(id)); derr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", derr))
		}
		return "", err
	}
	return path, nil
}

// ActivateThin makes thin device id (a volume or snapshot) a block device
// of sizeSectors and returns its node. Already active with that size is
// success; active with another size answers AlreadyExists (use ResizeThin).
// An id the pool does not hold answers NotFound.
func (p *Pool) ActivateThin(ctx context.Context, id uint32, sizeSectors uint64) (string, error) {
	if err := p.checkThin(id, sizeSectors); err != nil {
		return "", err
	}
	name := p.ThinName(id)
	want := p.thinTable(id, sizeSectors)
	info, err := p.m.Info(ctx, name)
	if err != nil {
		return "", err
	}
	if info.Exists {
		have, err := p.m.Table(ctx, name)
		if err != nil {
			return "", err
		}
		if len(have) == 1 && have[0] == want[0] {
			return p.m.Path(name), nil
		}
		return "", abi.Errorf(abi.AlreadyExists, "dm activate thin %s: active with table %q, want %q", name, have, want)
	}
	// The kernel refuses a thin table whose id the metadata lacks
	// (ENODATA, NotFound), so Create needs no lookup first.
	return p.m.Create(ctx, name, want)
}

// DeactivateThin removes thin device id's block device; the volume stays in
// the pool. Inactive is success.
func (p *Pool) DeactivateThin(ctx context.Context, id uint32) error {
	if err := p.checkThin(id, 1); err != nil {
		return err
	}
	return p.m.Remove(ctx, p.ThinName(id))
}

// DeleteThin deactivates thin device id and deletes it from the pool,
// freeing the blocks no snapshot shares. An id the pool does not hold
// answers NotFound, so callers can tell "already gone".
func (p *Pool) DeleteThin(ctx context.Context, id uint32) error {
	if err := p.DeactivateThin(ctx, id); err != nil {
		return err
	}
	return p.message(ctx, "delete "+itoa(id))
}

// Snapshot creates thin device snapID as a snapshot of originID, sharing
// all its blocks. An active origin is suspended for the moment of the
// snapshot (flushing its writes) and resumed even when the snapshot fails.
// The snapshot is left inactive; its size is the origin's. Nothing is
// copied: the kernel records the snapshot in the pool's metadata and
// commits that before the message returns, so a snapshot exists whole or
// not at all, also after a crash, and a repeat finds it (AlreadyExists).
func (p *Pool) Snapshot(ctx context.Context, originID, snapID uint32) (err error) {
	if err := p.checkThin(originID, 1); err != nil {
		return err
	}
	if err := p.checkThin(snapID, 1); err != nil {
		return err
	}
	origin := p.ThinName(originID)
	info, err := p.m.Info(ctx, origin)
	if err != nil {
		return err
	}
	if info.Exists && !info.Suspended {
		if err := p.m.Suspend(ctx, origin); err != nil {
			return err
		}
		defer func() {
			if rerr := p.m.Resume(context.WithoutCancel(ctx), origin); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}()
	}
	return p.message(ctx, "create_snap "+itoa(snapID)+" "+itoa(originID))
}

// ResizeThin grows active thin device id to sizeSectors. Thin sizes live
// only in tables, so for an inactive device there is nothing to change and
// the caller's record is the resize. Shrinking answers InvalidArgument:
// the blocks past the end would stay allocated and a filesystem on the
// device would break.
func (p *Pool) ResizeThin(ctx context.Context, id uint32, sizeSectors uint64) error {
	if err := p.checkThin(id, sizeSectors); err != nil {
		return err
	}
	name := p.ThinName(id)
	info, err := p.m.Info(ctx, name)
	if err != nil || !info.Exists {
		return err
	}
	have, err := p.m.Table(ctx, name)
	if err != nil {
		return err
	}
	current := Size(have)
	switch {
	case sizeSectors == current:
		return nil
	case sizeSectors < current:
		return abi.Errorf(abi.InvalidArgument, "dm resize thin %s: %d sectors is smaller than %d", name, sizeSectors, current)
	}
	if err := p.m.Reload(ctx, name, p.thinTable(id, sizeSectors)); err != nil {
		return err
	}
	return p.m.Resume(ctx, name)
}

// PoolStatus is a thin pool's status line. Failed means the pool failed
// and reports nothing else.
type PoolStatus struct {
	TransactionID   uint64
	UsedMetaBlocks  uint64 // MetadataBlockSize each
	TotalMetaBlocks uint64
	UsedDataBlocks  uint64 // BlockSectors each
	TotalDataBlocks uint64
	BlockSectors    uint64
	HeldMetaRoot    string // "-" or the held root's block
	ReadOnly        bool
	OutOfDataSpace  bool
	NeedsCheck      bool
	Failed          bool
	DiscardPassdown bool
	ErrorIfNoSpace  bool
	MetaLowWater    uint64 // blocks; 0 when the kernel does not say
}

// DataBytes returns the used and total data space in bytes.
func (s PoolStatus) DataBytes() (used, total uint64) {
	b := s.BlockSectors * SectorSize
	return s.UsedDataBlocks * b, s.TotalDataBlocks * b
}

// Status returns the pool's status; asking commits the metadata, so the
// numbers include every completed write.
func (p *Pool) Status(ctx context.Context) (PoolStatus, error) {
	if err := p.bound(); err != nil {
		return PoolStatus{}, err
	}
	st, err := p.m.Status(ctx, p.Name)
	if err != nil {
		return PoolStatus{}, err
	}
	if len(st) != 1 || st[0].Type != "thin-pool" {
		return PoolStatus{}, abi.Errorf(abi.FailedPrecondition, "dm pool status %s: not a thin pool: %v", p.Name, st)
	}
	ps, err := ParsePoolStatus(st[0].Status)
	if err != nil {
		return PoolStatus{}, fmt.Errorf("dm pool status %s: %w", p.Name, err)
	}
	ps.BlockSectors = p.BlockSectors
	return ps, nil
}

// ParsePoolStatus reads a thin-pool status line:
//
//	<transaction id> <used>/<total metadata blocks> <used>/<total data blocks>
//	<held metadata root> rw|ro|out_of_data_space [no_]discard_passdown|ignore_discard
//	error_if_no_space|queue_if_no_space needs_check|- [<metadata low watermark>]
//
// or "Fail" (Failed) or "Error" (an error: the kernel could not read its
// metadata).
func ParsePoolStatus(text string) (PoolStatus, error) {
	f := strings.Fields(text)
	if len(f) == 1 && f[0] == "Fail" {
		return PoolStatus{Failed: true}, nil
	}
	if len(f) < 8 {
		return PoolStatus{}, abi.Errorf(abi.Internal, "thin-pool status %q: want at least 8 fields", text)
	}
	var s PoolStatus
	var err error
	bad := func(what string) (PoolStatus, error) {
		return PoolStatus{}, abi.Errorf(abi.Internal, "thin-pool status %q: bad %s", text, what)
	}
	if s.TransactionID, err = strconv.ParseUint(f[0], 10, 64); err != nil {
		return bad("transaction id")
	}
	if s.UsedMetaBlocks, s.TotalMetaBlocks, err = fraction(f[1]); err != nil {
		return bad("metadata blocks")
	}
	if s.UsedDataBlocks, s.TotalDataBlocks, err = fraction(f[2]); err != nil {
		return bad("data blocks")
	}
	s.HeldMetaRoot = f[3]
	switch f[4] {
	case "rw":
	case "ro":
		s.ReadOnly = true
	case "out_of_data_space":
		s.OutOfDataSpace = true
	default:
		return bad("mode")
	}
	s.DiscardPassdown = f[5] == "discard_passdown"
	switch f[6] {
	case "error_if_no_space":
		s.ErrorIfNoSpace = true
	case "queue_if_no_space":
	default:
		return bad("no-space policy")
	}
	switch f[7] {
	case "needs_check":
		s.NeedsCheck = true
	case "-":
	default:
		return bad("needs_check field")
	}
	if len(f) > 8 {
		if s.MetaLowWater, err = strconv.ParseUint(f[8], 10, 64); err != nil {
			return bad("metadata low watermark")
		}
	}
	return s, nil
}

// ThinStatus is a thin device's status line.
type ThinStatus struct {
	MappedSectors uint64 // sectors with data blocks behind them
	// HighestMapped is the last mapped sector; -1 when nothing is mapped.
	HighestMapped int64
	Failed        bool
}

// ThinStatus returns active thin device id's status (NotFound if inactive).
func (p *Pool) ThinStatus(ctx context.Context, id uint32) (ThinStatus, error) {
	if err := p.checkThin(id, 1); err != nil {
		return ThinStatus{}, err
	}
	st, err := p.m.Status(ctx, p.ThinName(id))
	if err != nil {
		return ThinStatus{}, err
	}
	if len(st) != 1 || st[0].Type != "thin" {
		return ThinStatus{}, abi.Errorf(abi.FailedPrecondition, "dm thin status %s: not a thin device: %v", p.ThinName(id), st)
	}
	return ParseThinStatus(st[0].Status)
}

// ParseThinStatus reads a thin status line: "<mapped sectors> <highest
// mapped sector>|-" or "Fail".
func ParseThinStatus(text string) (ThinStatus, error) {
	f := strings.Fields(text)
	if len(f) == 1 && f[0] == "Fail" {
		return ThinStatus{Failed: true, HighestMapped: -1}, nil
	}
	if len(f) != 2 {
		return ThinStatus{}, abi.Errorf(abi.Internal, "thin status %q: want 2 fields", text)
	}
	mapped, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return ThinStatus{}, abi.Errorf(abi.Internal, "thin status %q: bad mapped sectors", text)
	}
	s := ThinStatus{MappedSectors: mapped, HighestMapped: -1}
	if f[1] != "-" {
		h, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || h < 0 {
			return ThinStatus{}, abi.Errorf(abi.Internal, "thin status %q: bad highest mapped sector", text)
		}
		s.HighestMapped = h
	}
	return s, nil
}

// ThinState is what the kernel knows of one thin id of a pool.
type ThinState struct {
	// Exists: the pool's metadata holds the id.
	Exists bool
	// Active: a thin device serves the id as <pool>-<id>; Path, Sectors,
	// MappedSectors and Failed describe it.
	Active        bool
	Path          string
	Sectors       uint64
	MappedSectors uint64
	Failed        bool
}

// probeTries bounds how often ThinState retries a probe whose device name
// another probe of the same id holds at that moment.
const probeTries = 5

// ThinState reports whether thin id exists and whether it is active,
// changing nothing. An active device answers from its table and status;
// for an inactive id the kernel is asked to load a thin table for it into
// a device that is never activated (Mapper.Accepts): it refuses an id the
// metadata lacks (ENODATA), without the id ever serving I/O.
func (p *Pool) ThinState(ctx context.Context, id uint32) (ThinState, error) {
	if err := p.checkThin(id, 1); err != nil {
		return ThinState{}, err
	}
	name := p.ThinName(id)
	info, err := p.m.Info(ctx, name)
	if err != nil {
		return ThinState{}, err
	}
	if info.Exists && info.LiveTable {
		table, err := p.m.Table(ctx, name)
		if err != nil {
			return ThinState{}, err
		}
		if len(table) == 1 && table[0].Type == "thin" && table[0].Params == p.dev+" "+itoa(id) {
			st, err := p.ThinStatus(ctx, id)
			if err != nil {
				return ThinState{}, err
			}
			return ThinState{Exists: true, Active: true, Path: p.m.Path(name), Sectors: Size(table),
				MappedSectors: st.MappedSectors, Failed: st.Failed}, nil
		}
	}
	probe := name + "-probe"
	for try := 1; ; try++ {
		err := p.m.Accepts(ctx, probe, p.thinTable(id, p.BlockSectors))
		switch {
		case err == nil:
			return ThinState{Exists: true}, nil
		case abi.CodeOf(err) == abi.NotFound:
			return ThinState{}, nil
		case abi.CodeOf(err) == abi.AlreadyExists && try < probeTries:
			select {
			case <-ctx.Done():
				return ThinState{}, ctx.Err()
			case <-time.After(time.Duration(try) * 5 * time.Millisecond):
			}
		default:
			return ThinState{}, fmt.Errorf("dm thin state %s: %w", name, err)
		}
	}
}

func fraction(s string) (uint64, uint64, error) {
	a, b, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, errors.New("no /")
	}
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, err
	}
	return x, y, nil
}

func (p *Pool) thinTable(id uint32, sizeSectors uint64) []Target {
	return []Target{{Start: 0, Length: sizeSectors, Type: "thin", Params: p.dev + " " + itoa(id)}}
}

func (p *Pool) message(ctx context.Context, msg string) error {
	if err := p.bound(); err != nil {
		return err
	}
	_, err := p.m.Message(ctx, p.Name, 0, msg)
	return err
}

func (p *Pool) bound() error {
	if p == nil || p.m == nil {
		return abi.Errorf(abi.FailedPrecondition, "dm pool: not opened (use Mapper.CreatePool or Mapper.OpenPool)")
	}
	return nil
}

func (p *Pool) checkThin(id uint32, sizeSectors uint64) error {
	if err := p.bound(); err != nil {
		return err
	}
	if id > MaxThinID {
		return abi.Errorf(abi.InvalidArgument, "dm pool %s: thin id %d exceeds %d", p.Name, id, MaxThinID)
	}
	if sizeSectors == 0 {
		return abi.Errorf(abi.InvalidArgument, "dm pool %s: thin %d size is 0", p.Name, id)
	}
	return p.m.confine(p.ThinName(id))
}

func validBlockSectors(n uint64) error {
	if n < MinBlockSectors || n > MaxBlockSectors || n%MinBlockSectors != 0 {
		return abi.Errorf(abi.InvalidArgument, "block size %d sectors: want a multiple of %d from %d to %d", n, MinBlockSectors, MinBlockSectors, MaxBlockSectors)
	}
	return nil
}

// HasPoolMetadata reports whether dev holds thin-pool metadata (the
// superblock's magic number), i.e. whether OpenPool can open it and
// CreatePool would refuse it.
func HasPoolMetadata(dev string) (bool, error) {
	sb, err := readSuperblock(dev)
	return sb.valid, err
}

// superblock is what OpenPool needs from the metadata's first block.
type superblock struct {
	valid         bool
	transactionID uint64
	blockSectors  uint32
}

func parseSuperblock(b []byte) superblock {
	le := binary.LittleEndian
	if len(b) < sbBlockSizeOff+4 || le.Uint64(b[sbMagicOff:]) != thinMagic {
		return superblock{}
	}
	return superblock{valid: true, transactionID: le.Uint64(b[sbTransIDOff:]), blockSectors: le.Uint32(b[sbBlockSizeOff:])}
}

func readSuperblock(dev string) (superblock, error) {
	fd, err := openBlock(dev, unix.O_RDONLY)
	if err != nil {
		return superblock{}, err
	}
	defer unix.Close(fd)
	buf := make([]byte, sbWipeSize)
	if _, err := unix.Pread(fd, buf, 0); err != nil {
		return superblock{}, fmt.Errorf("read %s: %w", dev, err)
	}
	return parseSuperblock(buf), nil
}

// wipeMetadata zeroes the first 4 KiB of dev after checking, with dev
// opened exclusively, that it is unused and holds no pool.
func wipeMetadata(dev string) error {
	fd, err := openBlock(dev, unix.O_RDWR|unix.O_EXCL)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf := make([]byte, sbWipeSize)
	if _, err := unix.Pread(fd, buf, 0); err != nil {
		return fmt.Errorf("read %s: %w", dev, err)
	}
	if parseSuperblock(buf).valid {
		return abi.Errorf(abi.AlreadyExists, "%s holds thin-pool metadata; use OpenPool, or wipe it deliberately", dev)
	}
	clear(buf)
	if _, err := unix.Pwrite(fd, buf, 0); err != nil {
		return fmt.Errorf("zero %s: %w", dev, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync %s: %w", dev, err)
	}
	return nil
}

// openBlock opens a block device, answering FailedPrecondition when it is
// in use (O_EXCL) and InvalidArgument when it is not a block device.
func openBlock(dev string, flags int) (int, error) {
	fd, err := unix.Open(dev, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		code := abi.Internal
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENXIO):
			code = abi.NotFound
		case errors.Is(err, unix.EBUSY):
			code = abi.FailedPrecondition
		case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			code = abi.PermissionDenied
		}
		return -1, abi.Errorf(code, "open %s: %v", dev, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		unix.Close(fd)
		return -1, abi.Errorf(abi.InvalidArgument, "%s is not a block device", dev)
	}
	return fd, nil
}

func deviceSize(dev string) (uint64, error) {
	fd, err := openBlock(dev, unix.O_RDONLY)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
		return 0, fmt.Errorf("BLKGETSIZE64 %s: %w", dev, e)
	}
	return size, nil
}

// devNumbers returns the major:minor of the metadata and data devices, as
// tables name them, and refuses the same device twice.
func devNumbers(metaDev, dataDev string) (meta, data string, err error) {
	num := func(dev string) (uint64, error) {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return 0, abi.Errorf(abi.NotFound, "stat %s: %v", dev, err)
			}
			return 0, fmt.Errorf("stat %s: %w", dev, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return 0, abi.Errorf(abi.InvalidArgument, "%s is not a block device", dev)
		}
		return st.Rdev, nil
	}
	m, err := num(metaDev)
	if err != nil {
		return "", "", err
	}
	d, err := num(dataDev)
	if err != nil {
		return "", "", err
	}
	if m == d {
		return "", "", abi.Errorf(abi.InvalidArgument, "metadata and data device are both %s", metaDev)
	}
	return fmt.Sprintf("%d:%d", unix.Major(m), unix.Minor(m)), fmt.Sprintf("%d:%d", unix.Major(d), unix.Minor(d)), nil
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
