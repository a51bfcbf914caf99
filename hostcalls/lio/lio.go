// Package lio serves block devices and files as iSCSI LUNs through the
// kernel's LIO target, driven directly through configfs
// (/sys/kernel/config/target): backstores (iblock for block devices, fileio
// for files), iSCSI targets with one portal group, network portals, LUNs,
// and per-initiator ACLs with optional CHAP.
//
// Portal groups are created with generate_node_acls=0 and
// demo_mode_discovery=0: an initiator sees and reaches a target's LUNs only
// after Grant, and discovers the target only then. Every operation is
// idempotent, and teardown runs in the order the kernel requires (ACL
// mapped LUNs, ACLs, LUNs, portals, portal group, target, backstore).
//
// It must never touch a target or backstore outside the name prefixes the
// operator granted (Config.IQNPrefix, Config.NamePrefix), never run
// targetcli or a shell, and never load kernel modules or mount configfs:
// the deployment does that (target_core_mod, iscsi_target_mod,
// target_core_iblock, target_core_file).
package lio

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
	"github.com/wasmcsi/wasmcsi/hostcalls/iscsi"
)

// DefaultRoot is where LIO's configfs tree lives.
const DefaultRoot = "/sys/kernel/config/target"

// tpg is the one portal group every target gets.
const tpg = "tpgt_1"

// MaxLUN is the highest LUN a target gets; see iscsi.MaxLUN.
const MaxLUN = iscsi.MaxLUN

// Kind is a backstore type.
type Kind string

const (
	// Block serves a block device (LIO's iblock backend).
	Block Kind = "block"
	// FileIO serves a regular file (LIO's fileio backend).
	FileIO Kind = "fileio"
)

// hba is the configfs folder (LIO "HBA") that holds backstores of a kind.
func (k Kind) hba() (string, error) {
	switch k {
	case Block:
		return "iblock_0", nil
	case FileIO:
		return "fileio_0", nil
	}
	return "", abi.Errorf(abi.InvalidArgument, "backstore kind %q is not block or fileio", string(k))
}

// Config says where LIO lives and which names this instance may touch.
type Config struct {
	// Root is LIO's configfs folder; default DefaultRoot.
	Root string
	// IQNPrefix is granted by the operator: every target IQN must start
	// with it, e.g. "iqn.2024-01.dev.wasmcsi:node1.".
	IQNPrefix string
	// NamePrefix is granted by the operator: every backstore name must
	// start with it, e.g. "wasmcsi-".
	NamePrefix string
}

// Configfs manages LIO objects inside the granted prefixes. It is safe for
// concurrent use; changes are serialized (each is a few configfs writes).
type Configfs struct {
	cfg Config
	mu  *sync.Mutex // shared by the narrowed copies the host calls make
}

// New checks cfg and returns a Configfs. It does not touch the kernel, so
// a daemon can start before LIO is loaded; operations then fail with
// FailedPrecondition.
func New(cfg Config) (*Configfs, error) {
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if !filepath.IsAbs(cfg.Root) {
		return nil, abi.Errorf(abi.InvalidArgument, "lio: root %q is not absolute", cfg.Root)
	}
	cfg.Root = filepath.Clean(cfg.Root)
	if cfg.IQNPrefix == "" || iscsi.ValidateName(cfg.IQNPrefix+"x") != nil {
		return nil, abi.Errorf(abi.InvalidArgument, "lio: IQN prefix %q does not begin an iSCSI name", cfg.IQNPrefix)
	}
	if cfg.NamePrefix == "" || !validName(cfg.NamePrefix) {
		return nil, abi.Errorf(abi.InvalidArgument, "lio: name prefix %q must be letters, digits, '_', '.', '-'", cfg.NamePrefix)
	}
	return &Configfs{cfg: cfg, mu: new(sync.Mutex)}, nil
}

// Backstore is a block device or file that LIO serves.
type Backstore struct {
	Kind Kind
	// Name is the backstore's configfs name; it must start with the
	// granted NamePrefix.
	Name string
	// Path is the block device (Block) or regular file (FileIO).
	Path string
	// Size is a FileIO backstore's size in bytes, a multiple of 512; 0
	// means the file's current size. Block backstores follow their device.
	Size int64
	// WriteCache makes a FileIO backstore report a volatile write cache
	// to initiators (attrib/emulate_write_cache); it is applied on every
	// create, also to a backstore that exists. Block backstores report
	// their device's cache and refuse it.
	WriteCache bool
}

// LUN is everything CreateLUN sets up.
type LUN struct {
	// Target is the target's IQN; it must start with the granted IQNPrefix.
	Target string
	// LUN is the LUN number, 0 to MaxLUN.
	LUN int
	// Backstore is what the LUN serves.
	Backstore Backstore
	// Portals are the "ip:port" / "[ipv6]:port" addresses the target
	// listens on; at least one. Existing other portals are kept.
	Portals []string
}

// CreateLUN makes spec's backstore, its target (with its portal group and
// portals) if needed, and maps the backstore as spec.LUN. It is idempotent:
// the same spec again succeeds, and a LUN number or backstore name already
// used for something else is AlreadyExists. No initiator sees the LUN until
// Grant.
func (c *Configfs) CreateLUN(ctx context.Context, spec LUN) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkTarget(spec.Target); err != nil {
		return err
	}
	if err := checkLUN(spec.LUN); err != nil {
		return err
	}
	if len(spec.Portals) == 0 {
		return abi.Errorf(abi.InvalidArgument, "lio: LUN %d of %s: no portals", spec.LUN, spec.Target)
	}
	portals := make([]string, len(spec.Portals))
	for i, p := range spec.Portals {
		np, err := portalName(p)
		if err != nil {
			return err
		}
		portals[i] = np
	}
	if err := c.checkBackstore(&spec.Backstore); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return err
	}
	if err := c.createBackstore(spec.Backstore); err != nil {
		return err
	}
	if err := c.createTarget(spec.Target); err != nil {
		return err
	}
	for _, np := range portals {
		if err := c.addPortal(spec.Target, np); err != nil {
			return err
		}
	}
	return c.mapLUN(spec.Target, spec.LUN, spec.Backstore)
}

// DeleteLUN removes LUN lun of target: its mappings in every ACL (ACLs left
// without LUNs go too, ending those initiators' sessions), the LUN, and its
// backstore when that lies inside the granted name prefix. When the target
// has no LUN left, the target goes too. A LUN or target that does not exist
// is not an error.
func (c *Configfs) DeleteLUN(ctx context.Context, target string, lun int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkTarget(target); err != nil {
		return err
	}
	if err := checkLUN(lun); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return err
	}
	bs, err := c.unmapLUN(target, lun)
	if err != nil {
		return err
	}
	if bs != nil && strings.HasPrefix(bs.Name, c.cfg.NamePrefix) {
		if err := c.deleteBackstore(bs.Kind, bs.Name); err != nil {
			return err
		}
	}
	luns, err := c.tpgLUNs(target)
	if err != nil {
		return err
	}
	if len(luns) == 0 {
		return c.deleteTarget(target)
	}
	return nil
}

// Grant lets initiator reach LUN lun of target: it creates the initiator's
// ACL if needed, maps the LUN into it (as the same LUN number) and sets the
// ACL's authentication: CHAP with chap's credentials, or none when chap is
// nil. CHAP belongs to the ACL, so the last Grant for an initiator decides
// it for all of that initiator's LUNs on the target. NotFound when the LUN
// does not exist.
func (c *Configfs) Grant(ctx context.Context, target string, lun int, initiator string, chap *iscsi.CHAP) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkTarget(target); err != nil {
		return err
	}
	if err := checkLUN(lun); err != nil {
		return err
	}
	if err := iscsi.ValidateName(initiator); err != nil {
		return err
	}
	if chap != nil {
		if err := chap.Validate(); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return err
	}
	lunDir := c.tpgPath(target, "lun", lunName(lun))
	if _, err := os.Stat(lunDir); errors.Is(err, fs.ErrNotExist) {
		return abi.Errorf(abi.NotFound, "lio: grant: %s has no LUN %d", target, lun)
	}
	acl := c.tpgPath(target, "acls", initiator)
	if err := mkdir(acl); err != nil {
		return fmt.Errorf("lio: grant %s: ACL for %s: %w", target, initiator, err)
	}
	if err := setAuth(acl, chap); err != nil {
		return fmt.Errorf("lio: grant %s to %s: %w", target, initiator, err)
	}
	mapped := filepath.Join(acl, lunName(lun))
	if err := mkdir(mapped); err != nil {
		return fmt.Errorf("lio: grant %s LUN %d to %s: %w", target, lun, initiator, err)
	}
	if err := ensureLink(lunDir, filepath.Join(mapped, lunName(lun))); err != nil {
		return fmt.Errorf("lio: grant %s LUN %d to %s: %w", target, lun, initiator, err)
	}
	return nil
}

// setAuth sets an ACL's CHAP credentials, or turns authentication off.
// Credentials are written without a newline: LIO stores them verbatim.
func setAuth(acl string, chap *iscsi.CHAP) error {
	if chap == nil {
		return sysattr.Write(filepath.Join(acl, "attrib", "authentication"), "0")
	}
	if err := sysattr.Write(filepath.Join(acl, "auth", "userid"), chap.User); err != nil {
		return fmt.Errorf("CHAP user: %w", err)
	}
	if err := sysattr.Write(filepath.Join(acl, "auth", "password"), chap.Secret); err != nil {
		return fmt.Errorf("CHAP secret: %w", err) // names the attribute, never the value
	}
	return sysattr.Write(filepath.Join(acl, "attrib", "authentication"), "1")
}

// Revoke takes LUN lun of target away from initiator. When the initiator
// has no LUN left on the target its ACL is deleted, which also ends its
// session. Revoking what was never granted is not an error.
func (c *Configfs) Revoke(ctx context.Context, target string, lun int, initiator string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkTarget(target); err != nil {
		return err
	}
	if err := checkLUN(lun); err != nil {
		return err
	}
	if err := iscsi.ValidateName(initiator); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return err
	}
	return c.revoke(target, lun, initiator)
}

func (c *Configfs) revoke(target string, lun int, initiator string) error {
	acl := c.tpgPath(target, "acls", initiator)
	if err := removeMapped(filepath.Join(acl, lunName(lun))); err != nil {
		return fmt.Errorf("lio: revoke %s LUN %d from %s: %w", target, lun, initiator, err)
	}
	left, err := mappedLUNs(acl)
	if err != nil {
		return fmt.Errorf("lio: revoke %s from %s: %w", target, initiator, err)
	}
	if len(left) == 0 {
		if err := rmdir(acl); err != nil {
			return fmt.Errorf("lio: revoke %s from %s: ACL: %w", target, initiator, err)
		}
	}
	return nil
}

// DeleteBackstore deletes a backstore. FailedPrecondition while a LUN still
// serves it; a missing backstore is not an error.
func (c *Configfs) DeleteBackstore(ctx context.Context, kind Kind, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := kind.hba(); err != nil {
		return err
	}
	if err := c.checkName(name); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return err
	}
	return c.deleteBackstore(kind, name)
}

// ResizeFileIO sets the size a FileIO backstore reports to initiators; the
// caller grows the file first. Initiators see the new size after a rescan
// of the LUN. (A Block backstore follows its device's size by itself.)
func (c *Configfs) ResizeFileIO(ctx context.Context, name string, size int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkName(name); err != nil {
		return err
	}
	if size <= 0 || size%512 != 0 {
		return abi.Errorf(abi.InvalidArgument, "lio: size %d is not a positive multiple of 512", size)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return err
	}
	dir := filepath.Join(c.cfg.Root, "core", "fileio_0", name)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return abi.Errorf(abi.NotFound, "lio: no fileio backstore %s", name)
	}
	if err := sysattr.Write(filepath.Join(dir, "control"), "fd_dev_size="+strconv.FormatInt(size, 10)); err != nil {
		return fmt.Errorf("lio: resize %s: %w", name, err)
	}
	return nil
}

// DeleteTarget removes a target and everything in it (ACLs, LUN mappings,
// portals, portal group), but not the backstores. A missing target is not
// an error.
func (c *Configfs) DeleteTarget(ctx context.Context, target string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.checkTarget(target); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return err
	}
	return c.deleteTarget(target)
}

// BackstoreRef names a backstore.
type BackstoreRef struct {
	Kind Kind
	Name string
}

// TargetInfo is what configfs shows of one target.
type TargetInfo struct {
	IQN     string
	Enabled bool
	Portals []string             // "ip:port" / "[ipv6]:port"
	LUNs    map[int]BackstoreRef // LUN -> backstore
	ACLs    map[string][]int     // initiator IQN -> mapped LUNs
	CHAP    map[string]bool      // initiator IQN -> CHAP required
}

// Target reports a target's portals, LUNs and ACLs; NotFound if absent.
func (c *Configfs) Target(ctx context.Context, target string) (TargetInfo, error) {
	if err := ctx.Err(); err != nil {
		return TargetInfo{}, err
	}
	if err := c.checkTarget(target); err != nil {
		return TargetInfo{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return TargetInfo{}, err
	}
	ti := TargetInfo{IQN: target, LUNs: map[int]BackstoreRef{}, ACLs: map[string][]int{}, CHAP: map[string]bool{}}
	if _, err := os.Stat(c.tpgPath(target)); errors.Is(err, fs.ErrNotExist) {
		return ti, abi.Errorf(abi.NotFound, "lio: no target %s", target)
	}
	en, _ := sysattr.Read(c.tpgPath(target, "enable"))
	ti.Enabled = en == "1"
	nps, err := listDirs(c.tpgPath(target, "np"))
	if err != nil {
		return ti, err
	}
	ti.Portals = nps
	luns, err := c.tpgLUNs(target)
	if err != nil {
		return ti, err
	}
	for _, l := range luns {
		bs, err := c.lunBackstore(target, l)
		if err != nil {
			return ti, err
		}
		if bs != nil {
			ti.LUNs[l] = *bs
		}
	}
	acls, err := listDirs(c.tpgPath(target, "acls"))
	if err != nil {
		return ti, err
	}
	for _, a := range acls {
		m, err := mappedLUNs(c.tpgPath(target, "acls", a))
		if err != nil {
			return ti, err
		}
		ti.ACLs[a] = m
		auth, _ := sysattr.Read(c.tpgPath(target, "acls", a, "attrib", "authentication"))
		ti.CHAP[a] = auth == "1"
	}
	return ti, nil
}

// ---------------------------------------------------------------- internals

func (c *Configfs) tpgPath(target string, p ...string) string {
	return filepath.Join(append([]string{c.cfg.Root, "iscsi", target, tpg}, p...)...)
}

// available reports FailedPrecondition when LIO's configfs tree is absent.
func (c *Configfs) available() error {
	if _, err := os.Stat(filepath.Join(c.cfg.Root, "core")); err != nil {
		return abi.Errorf(abi.FailedPrecondition, "lio: %s is not available (load target_core_mod and mount configfs): %v", c.cfg.Root, err)
	}
	return nil
}

func (c *Configfs) checkTarget(iqn string) error {
	if err := iscsi.ValidateName(iqn); err != nil {
		return err
	}
	if !strings.HasPrefix(iqn, c.cfg.IQNPrefix) || iqn == c.cfg.IQNPrefix {
		return abi.Errorf(abi.PermissionDenied, "lio: target %s is outside the granted prefix %s", iqn, c.cfg.IQNPrefix)
	}
	return nil
}

func (c *Configfs) checkName(name string) error {
	if !validName(name) || len(name) > 128 {
		return abi.Errorf(abi.InvalidArgument, "lio: backstore name %q must be 1-128 letters, digits, '_', '.', '-'", name)
	}
	if !strings.HasPrefix(name, c.cfg.NamePrefix) || name == c.cfg.NamePrefix {
		return abi.Errorf(abi.PermissionDenied, "lio: backstore %s is outside the granted prefix %s", name, c.cfg.NamePrefix)
	}
	return nil
}

// checkBackstore validates b and fills in a FileIO size of 0.
func (c *Configfs) checkBackstore(b *Backstore) error {
	if _, err := b.Kind.hba(); err != nil {
		return err
	}
	if err := c.checkName(b.Name); err != nil {
		return err
	}
	if !filepath.IsAbs(b.Path) || filepath.Clean(b.Path) != b.Path || !validPath(b.Path) {
		return abi.Errorf(abi.InvalidArgument, "lio: backstore path %q must be clean, absolute, and free of ',', spaces and control characters", b.Path)
	}
	st, err := os.Stat(b.Path)
	if err != nil {
		return abi.Errorf(abi.NotFound, "lio: backstore path: %v", err)
	}
	switch b.Kind {
	case Block:
		if st.Mode()&fs.ModeDevice == 0 || st.Mode()&fs.ModeCharDevice != 0 {
			return abi.Errorf(abi.InvalidArgument, "lio: %s is not a block device", b.Path)
		}
		if b.Size != 0 {
			return abi.Errorf(abi.InvalidArgument, "lio: a block backstore takes its device's size; leave Size 0")
		}
		if b.WriteCache {
			return abi.Errorf(abi.InvalidArgument, "lio: a block backstore reports its device's write cache; leave WriteCache false")
		}
	case FileIO:
		if !st.Mode().IsRegular() {
			return abi.Errorf(abi.InvalidArgument, "lio: %s is not a regular file", b.Path)
		}
		if b.Size == 0 {
			b.Size = st.Size()
		}
		if b.Size <= 0 || b.Size%512 != 0 {
			return abi.Errorf(abi.InvalidArgument, "lio: fileio size %d is not a positive multiple of 512", b.Size)
		}
	}
	return nil
}

func (c *Configfs) createBackstore(b Backstore) error {
	hba, _ := b.Kind.hba()
	dir := filepath.Join(c.cfg.Root, "core", hba, b.Name)
	if _, err := os.Stat(dir); err == nil {
		if cur, _ := sysattr.Read(filepath.Join(dir, "udev_path")); cur != "" && cur != b.Path {
			return abi.Errorf(abi.AlreadyExists, "lio: backstore %s already serves %s", b.Name, cur)
		}
		if on, _ := sysattr.Read(filepath.Join(dir, "enable")); on == "1" {
			return setWriteCache(dir, b)
		}
		// Left half-made by a crash: configure it below.
	}
	if err := mkdirAll(dir); err != nil {
		return fmt.Errorf("lio: backstore %s: %w (is target_core_%s loaded?)", b.Name, err, map[Kind]string{Block: "iblock", FileIO: "file"}[b.Kind])
	}
	control := "udev_path=" + b.Path
	if b.Kind == FileIO {
		control = "fd_dev_name=" + b.Path + ",fd_dev_size=" + strconv.FormatInt(b.Size, 10)
	}
	if err := sysattr.Write(filepath.Join(dir, "control"), control); err != nil {
		return fmt.Errorf("lio: backstore %s: configure: %w", b.Name, err)
	}
	// udev_path is only informational for LIO; it records the path so an
	// idempotent re-create can compare.
	if err := sysattr.Write(filepath.Join(dir, "udev_path"), b.Path); err != nil {
		return fmt.Errorf("lio: backstore %s: udev_path: %w", b.Name, err)
	}
	if err := sysattr.Write(filepath.Join(dir, "enable"), "1"); err != nil {
		return fmt.Errorf("lio: backstore %s: enable: %w", b.Name, err)
	}
	if err := setWriteCache(dir, b); err != nil {
		return err
	}
	// Advertise UNMAP when the backing store can discard, so initiators'
	// discards reach thin pools and sparse files.
	if n, _ := sysattr.Read(filepath.Join(dir, "attrib", "max_unmap_lba_count")); n != "" && n != "0" {
		if err := sysattr.Write(filepath.Join(dir, "attrib", "emulate_tpu"), "1"); err != nil {
			return fmt.Errorf("lio: backstore %s: emulate_tpu: %w", b.Name, err)
		}
	}
	return nil
}

// setWriteCache sets a FileIO backstore's emulate_write_cache when it
// differs; LIO lets it change while the LUN is exported.
func setWriteCache(dir string, b Backstore) error {
	if b.Kind != FileIO {
		return nil
	}
	want := map[bool]string{false: "0", true: "1"}[b.WriteCache]
	path := filepath.Join(dir, "attrib", "emulate_write_cache")
	if cur, _ := sysattr.Read(path); cur == want {
		return nil
	}
	if err := sysattr.Write(path, want); err != nil {
		return fmt.Errorf("lio: backstore %s: emulate_write_cache: %w", b.Name, err)
	}
	return nil
}

func (c *Configfs) deleteBackstore(kind Kind, name string) error {
	hba, _ := kind.hba()
	err := rmdir(filepath.Join(c.cfg.Root, "core", hba, name))
	if errors.Is(err, unix.EBUSY) {
		return abi.Errorf(abi.FailedPrecondition, "lio: backstore %s is still served by a LUN", name)
	}
	if err != nil {
		return fmt.Errorf("lio: delete backstore %s: %w", name, err)
	}
	return nil
}

// createTarget makes the target and its portal group with this package's
// access rules, and enables the group.
func (c *Configfs) createTarget(target string) error {
	if err := mkdirAll(c.tpgPath(target)); err != nil {
		return fmt.Errorf("lio: target %s: %w (is iscsi_target_mod loaded?)", target, err)
	}
	for _, a := range [][2]string{
		{"generate_node_acls", "0"},  // only initiators with an ACL log in
		{"demo_mode_discovery", "0"}, // and only they discover the target
		{"cache_dynamic_acls", "0"},
		{"authentication", "0"}, // each ACL sets its own (attrib/authentication)
	} {
		if err := sysattr.Write(c.tpgPath(target, "attrib", a[0]), a[1]); err != nil {
			return fmt.Errorf("lio: target %s: %s: %w", target, a[0], err)
		}
	}
	if on, _ := sysattr.Read(c.tpgPath(target, "enable")); on != "1" {
		if err := sysattr.Write(c.tpgPath(target, "enable"), "1"); err != nil {
			return fmt.Errorf("lio: target %s: enable: %w", target, err)
		}
	}
	return nil
}

func (c *Configfs) addPortal(target, np string) error {
	err := mkdir(c.tpgPath(target, "np", np))
	if errors.Is(err, unix.EADDRINUSE) {
		return abi.Errorf(abi.FailedPrecondition, "lio: portal %s is in use by another program", np)
	}
	if errors.Is(err, unix.EADDRNOTAVAIL) {
		return abi.Errorf(abi.FailedPrecondition, "lio: portal %s: no such local address", np)
	}
	if err != nil {
		return fmt.Errorf("lio: target %s: portal %s: %w", target, np, err)
	}
	return nil
}

// mapLUN makes LUN lun of target serve b.
func (c *Configfs) mapLUN(target string, lun int, b Backstore) error {
	hba, _ := b.Kind.hba()
	dir := c.tpgPath(target, "lun", lunName(lun))
	cur, err := c.lunBackstore(target, lun)
	if err != nil {
		return err
	}
	if cur != nil {
		if *cur != (BackstoreRef{Kind: b.Kind, Name: b.Name}) {
			return abi.Errorf(abi.AlreadyExists, "lio: %s LUN %d already serves %s", target, lun, cur.Name)
		}
		return nil
	}
	if err := mkdir(dir); err != nil {
		return fmt.Errorf("lio: %s LUN %d: %w", target, lun, err)
	}
	if err := ensureLink(filepath.Join(c.cfg.Root, "core", hba, b.Name), filepath.Join(dir, b.Name)); err != nil {
		return fmt.Errorf("lio: %s LUN %d: link %s: %w", target, lun, b.Name, err)
	}
	return nil
}

// unmapLUN removes a LUN and its ACL mappings and returns the backstore it
// served (nil if there was no LUN).
func (c *Configfs) unmapLUN(target string, lun int) (*BackstoreRef, error) {
	acls, err := listDirs(c.tpgPath(target, "acls"))
	if err != nil {
		return nil, err
	}
	for _, a := range acls {
		if err := c.revoke(target, lun, a); err != nil {
			return nil, err
		}
	}
	bs, err := c.lunBackstore(target, lun)
	if err != nil {
		return nil, err
	}
	dir := c.tpgPath(target, "lun", lunName(lun))
	if bs != nil {
		if err := removeLink(filepath.Join(dir, bs.Name)); err != nil {
			return nil, fmt.Errorf("lio: %s LUN %d: unlink: %w", target, lun, err)
		}
	}
	if err := rmdir(dir); err != nil {
		return nil, fmt.Errorf("lio: %s LUN %d: %w", target, lun, err)
	}
	return bs, nil
}

// lunBackstore reads which backstore a LUN serves from its symlink; nil
// when the LUN (or its link) does not exist.
func (c *Configfs) lunBackstore(target string, lun int) (*BackstoreRef, error) {
	dir := c.tpgPath(target, "lun", lunName(lun))
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lio: %s LUN %d: %w", target, lun, err)
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		dest, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("lio: %s LUN %d: %w", target, lun, err)
		}
		hba := filepath.Base(filepath.Dir(dest))
		kind := Kind("")
		switch {
		case strings.HasPrefix(hba, "iblock_"):
			kind = Block
		case strings.HasPrefix(hba, "fileio_"):
			kind = FileIO
		default:
			kind = Kind(hba)
		}
		return &BackstoreRef{Kind: kind, Name: filepath.Base(dest)}, nil
	}
	return nil, nil
}

// tpgLUNs lists the LUN numbers of a target's portal group.
func (c *Configfs) tpgLUNs(target string) ([]int, error) {
	names, err := listDirs(c.tpgPath(target, "lun"))
	if err != nil {
		return nil, err
	}
	var luns []int
	for _, n := range names {
		if l, ok := parseLUNName(n); ok {
			luns = append(luns, l)
		}
	}
	slices.Sort(luns)
	return luns, nil
}

// deleteTarget tears a target down in the order the kernel requires.
func (c *Configfs) deleteTarget(target string) error {
	tdir := filepath.Join(c.cfg.Root, "iscsi", target)
	if _, err := os.Stat(tdir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	acls, err := listDirs(c.tpgPath(target, "acls"))
	if err != nil {
		return err
	}
	for _, a := range acls {
		acl := c.tpgPath(target, "acls", a)
		m, err := mappedLUNs(acl)
		if err != nil {
			return err
		}
		for _, l := range m {
			if err := removeMapped(filepath.Join(acl, lunName(l))); err != nil {
				return fmt.Errorf("lio: delete %s: ACL %s: %w", target, a, err)
			}
		}
		if err := rmdir(acl); err != nil {
			return fmt.Errorf("lio: delete %s: ACL %s: %w", target, a, err)
		}
	}
	luns, err := c.tpgLUNs(target)
	if err != nil {
		return err
	}
	for _, l := range luns {
		if _, err := c.unmapLUN(target, l); err != nil {
			return err
		}
	}
	nps, err := listDirs(c.tpgPath(target, "np"))
	if err != nil {
		return err
	}
	for _, np := range nps {
		if err := rmdir(c.tpgPath(target, "np", np)); err != nil {
			return fmt.Errorf("lio: delete %s: portal %s: %w", target, np, err)
		}
	}
	if err := rmdir(c.tpgPath(target)); err != nil {
		return fmt.Errorf("lio: delete %s: portal group: %w", target, err)
	}
	if err := rmdir(tdir); err != nil {
		return fmt.Errorf("lio: delete %s: %w", target, err)
	}
	return nil
}

// ---------------------------------------------------------------- helpers

func checkLUN(lun int) error {
	if lun < 0 || lun > MaxLUN {
		return abi.Errorf(abi.InvalidArgument, "lio: LUN %d out of range 0-%d", lun, MaxLUN)
	}
	return nil
}

func lunName(lun int) string { return "lun_" + strconv.Itoa(lun) }

func parseLUNName(n string) (int, bool) {
	s, ok := strings.CutPrefix(n, "lun_")
	if !ok || s == "" {
		return 0, false
	}
	l, err := strconv.Atoi(s)
	return l, err == nil && l >= 0
}

// portalName turns a portal into LIO's np folder name: "ip:port" or
// "[ipv6]:port", the port defaulting to 3260.
func portalName(p string) (string, error) {
	// A target may listen on every address, which an initiator's portal
	// may not name.
	if ap, err := netip.ParseAddrPort(p); err == nil && ap.Addr().IsUnspecified() && ap.Port() != 0 {
		return ap.String(), nil
	}
	ap, err := iscsi.ParsePortal(p)
	if err != nil {
		return "", err
	}
	return ap.String(), nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// validPath refuses what LIO's control parser would split on or mangle.
func validPath(p string) bool {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == ',' || c == 0x7f {
			return false
		}
	}
	return true
}

// mappedLUNs lists the mapped LUN numbers of an ACL (none if it is absent).
func mappedLUNs(acl string) ([]int, error) {
	names, err := listDirs(acl)
	if err != nil {
		return nil, err
	}
	var luns []int
	for _, n := range names {
		if l, ok := parseLUNName(n); ok {
			luns = append(luns, l)
		}
	}
	slices.Sort(luns)
	return luns, nil
}

// removeMapped removes an ACL's mapped LUN: its link, then its folder.
func removeMapped(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			if err := removeLink(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return rmdir(dir)
}

// listDirs lists the sub-folders of dir (none if dir is absent).
func listDirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func mkdir(dir string) error {
	if err := unix.Mkdir(dir, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	return nil
}

// mkdirAll creates dir and missing parents (configfs makes the attributes).
func mkdirAll(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := mkdirAll(filepath.Dir(dir)); err != nil {
		return err
	}
	return mkdir(dir)
}

// rmdir removes a configfs folder; a missing one is fine.
func rmdir(dir string) error {
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

func ensureLink(dest, link string) error {
	if cur, err := os.Readlink(link); err == nil {
		if filepath.Base(cur) == filepath.Base(dest) {
			return nil
		}
		return abi.Errorf(abi.AlreadyExists, "%s points to %s", link, cur)
	}
	if err := unix.Symlink(dest, link); err != nil && !errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "symlink", Path: link, Err: err}
	}
	return nil
}

func removeLink(link string) error {
	if err := unix.Unlink(link); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "unlink", Path: link, Err: err}
	}
	return nil
}
