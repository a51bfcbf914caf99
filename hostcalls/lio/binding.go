package lio

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
	"github.com/wasmcsi/wasmcsi/hostcalls/iscsi"
)

// Family is the grant that allows the lio host calls.
const Family = "lio"

// BindingNamePrefix starts the name of every backstore the host calls
// create: "wcsi-<16 hex digits of the target IQN's SHA-256>-<LUN>", so a
// module never names backstores and two targets never collide.
const BindingNamePrefix = "wcsi-"

// Bindings returns the "lio" host calls (see abi/hc_lio.go) on the LIO tree
// at DefaultRoot. The caller's roots are told apart by form:
//
//   - "iqn." / "eui." / "naa." prefixes: the targets it may manage;
//   - absolute paths: folders or device paths its backing stores must lie
//     in (as written; a file's resolved path too, while a block device's
//     resolved node must be under /dev, since /dev/mapper names are links);
//   - portals ("0.0.0.0:3260", "[::]:3260", "192.0.2.5:3260"): the
//     addresses its targets may listen on.
//
// The calls of every module share one lock, as LIO's tree is one.
func Bindings() []hostcalls.Func { return bindingsAt(DefaultRoot) }

func bindingsAt(root string) []hostcalls.Func {
	b := &binder{root: root, mu: new(sync.Mutex)}
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallLioLunCreate, b.lunCreate),
		hostcalls.Typed(Family, abi.HostCallLioLunDelete, b.lunDelete),
		hostcalls.Typed(Family, abi.HostCallLioGrant, b.grant),
		hostcalls.Typed(Family, abi.HostCallLioRevoke, b.revoke),
		hostcalls.Typed(Family, abi.HostCallLioLunResize, b.lunResize),
	}
}

type binder struct {
	root string
	mu   *sync.Mutex
}

// scope returns a Configfs confined to the longest granted IQN prefix that
// target starts with.
func (b *binder) scope(env *hostcalls.Env, target string) (*Configfs, error) {
	if err := iscsi.ValidateName(target); err != nil {
		return nil, err
	}
	prefix := ""
	for _, r := range env.Roots {
		if isNameRoot(r) && strings.HasPrefix(target, r) && len(r) > len(prefix) && target != r {
			prefix = r
		}
	}
	if prefix == "" {
		return nil, abi.Errorf(abi.PermissionDenied, "target %s is outside the granted IQN prefixes", target)
	}
	c, err := New(Config{Root: b.root, IQNPrefix: prefix, NamePrefix: BindingNamePrefix})
	if err != nil {
		return nil, err
	}
	c.mu = b.mu
	return c, nil
}

func (b *binder) lunCreate(ctx context.Context, env *hostcalls.Env, req *abi.LioLunCreateRequest) (*abi.Empty, error) {
	c, err := b.scope(env, req.Target)
	if err != nil {
		return nil, err
	}
	var kind Kind
	switch req.Kind {
	case string(Block):
		kind = Block
	case string(FileIO):
		kind = FileIO
	default:
		return nil, abi.Errorf(abi.InvalidArgument, "lio_lun_create: kind %q is not block or fileio", req.Kind)
	}
	if err := grantedBacking(env.Roots, kind, req.Path); err != nil {
		return nil, err
	}
	if len(req.Portals) == 0 {
		return nil, abi.Errorf(abi.InvalidArgument, "lio_lun_create: no portals")
	}
	for _, p := range req.Portals {
		if err := grantedPortal(env.Roots, p); err != nil {
			return nil, err
		}
	}
	spec := LUN{Target: req.Target, LUN: int(req.LUN), Portals: req.Portals,
		Backstore: Backstore{Kind: kind, Name: backstoreName(req.Target, int(req.LUN)), Path: req.Path, Size: req.SizeBytes, WriteCache: req.WriteCache}}
	if err := c.CreateLUN(ctx, spec); err != nil {
		return nil, err
	}
	if env.Log != nil {
		env.Log.Info("lio LUN created", "target", req.Target, "lun", req.LUN, "path", req.Path)
	}
	return &abi.Empty{}, nil
}

func (b *binder) lunDelete(ctx context.Context, env *hostcalls.Env, req *abi.LioLunRequest) (*abi.Empty, error) {
	c, err := b.scope(env, req.Target)
	if err != nil {
		return nil, err
	}
	if req.Path != "" {
		// Only the LUN that serves Path: a repeated delete must not take
		// away a LUN number that meanwhile serves another volume.
		// A missing LUN still goes to DeleteLUN, which removes a target
		// an interrupted delete left without LUNs.
		bs, path, err := c.lunBacking(req.Target, int(req.LUN))
		if err != nil {
			return nil, err
		}
		if bs != nil && path != filepath.Clean(req.Path) {
			if env.Log != nil {
				env.Log.Info("lio_lun_delete: LUN serves another backing store; left alone",
					"target", req.Target, "lun", req.LUN, "path", req.Path)
			}
			return &abi.Empty{}, nil
		}
	}
	if err := c.DeleteLUN(ctx, req.Target, int(req.LUN)); err != nil {
		return nil, err
	}
	return &abi.Empty{}, nil
}

func (b *binder) lunResize(ctx context.Context, env *hostcalls.Env, req *abi.LioLunResizeRequest) (*abi.Empty, error) {
	c, err := b.scope(env, req.Target)
	if err != nil {
		return nil, err
	}
	if req.SizeBytes <= 0 || req.SizeBytes%512 != 0 {
		return nil, abi.Errorf(abi.InvalidArgument, "lio_lun_resize: size %d is not a positive multiple of 512", req.SizeBytes)
	}
	bs, path, err := c.lunBacking(req.Target, int(req.LUN))
	if err != nil {
		return nil, err
	}
	switch {
	case bs == nil:
		return nil, abi.Errorf(abi.NotFound, "lio_lun_resize: %s has no LUN %d", req.Target, int(req.LUN))
	case bs.Kind == Block:
		return &abi.Empty{}, nil // LIO reads a block device's size on every capacity request
	case bs.Kind != FileIO:
		return nil, abi.Errorf(abi.FailedPrecondition, "lio_lun_resize: LUN %d is served by a %s backstore", int(req.LUN), string(bs.Kind))
	}
	// A fileio LUN larger than its file would let initiators write past
	// the end and grow the file behind the pool's accounting.
	st, err := os.Stat(path)
	if err != nil {
		return nil, abi.Errorf(abi.FailedPrecondition, "lio_lun_resize: backing file: %v", err)
	}
	if st.Size() < req.SizeBytes {
		return nil, abi.Errorf(abi.FailedPrecondition, "lio_lun_resize: %s has %d bytes, fewer than %d: grow the file first", path, st.Size(), req.SizeBytes)
	}
	if err := c.ResizeFileIO(ctx, bs.Name, req.SizeBytes); err != nil {
		return nil, err
	}
	if env.Log != nil {
		env.Log.Info("lio LUN resized", "target", req.Target, "lun", req.LUN, "bytes", req.SizeBytes)
	}
	return &abi.Empty{}, nil
}

// lunBacking reports the backstore a LUN serves and the path it was made
// from; nil and "" when the LUN does not exist.
func (c *Configfs) lunBacking(target string, lun int) (*BackstoreRef, string, error) {
	if err := checkLUN(lun); err != nil {
		return nil, "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.available(); err != nil {
		return nil, "", err
	}
	bs, err := c.lunBackstore(target, lun)
	if err != nil || bs == nil {
		return nil, "", err
	}
	hba, err := bs.Kind.hba()
	if err != nil {
		return bs, "", nil
	}
	path, err := sysattr.Read(filepath.Join(c.cfg.Root, "core", hba, bs.Name, "udev_path"))
	if err != nil {
		return nil, "", fmt.Errorf("lio: %s LUN %d: backing path: %w", target, lun, err)
	}
	return bs, path, nil
}

func (b *binder) grant(ctx context.Context, env *hostcalls.Env, req *abi.LioGrantRequest) (*abi.Empty, error) {
	c, err := b.scope(env, req.Target)
	if err != nil {
		return nil, err
	}
	var chap *iscsi.CHAP
	if req.ChapUser != "" || req.ChapSecret != "" {
		chap = &iscsi.CHAP{User: req.ChapUser, Secret: req.ChapSecret}
	}
	if err := c.Grant(ctx, req.Target, int(req.LUN), req.Initiator, chap); err != nil {
		return nil, err
	}
	return &abi.Empty{}, nil
}

func (b *binder) revoke(ctx context.Context, env *hostcalls.Env, req *abi.LioGrantRequest) (*abi.Empty, error) {
	c, err := b.scope(env, req.Target)
	if err != nil {
		return nil, err
	}
	if err := c.Revoke(ctx, req.Target, int(req.LUN), req.Initiator); err != nil {
		return nil, err
	}
	return &abi.Empty{}, nil
}

// backstoreName derives a backstore's name from its target and LUN.
func backstoreName(target string, lun int) string {
	sum := sha256.Sum256([]byte(target))
	return BindingNamePrefix + hex.EncodeToString(sum[:8]) + "-" + strconv.Itoa(lun)
}

func isNameRoot(r string) bool {
	return strings.HasPrefix(r, "iqn.") || strings.HasPrefix(r, "eui.") || strings.HasPrefix(r, "naa.")
}

// grantedBacking checks path against the caller's path roots.
func grantedBacking(roots []string, kind Kind, path string) error {
	var paths []string
	for _, r := range roots {
		if strings.HasPrefix(r, "/") {
			paths = append(paths, r)
		}
	}
	if _, err := hostcalls.Confine(paths, path, true); err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return abi.Errorf(abi.NotFound, "lio_lun_create: backing store: %v", err)
	}
	if kind == Block {
		if !strings.HasPrefix(real, "/dev/") {
			return abi.Errorf(abi.PermissionDenied, "lio_lun_create: %s does not lead to a device node under /dev", path)
		}
		return nil
	}
	if _, err := hostcalls.Confine(paths, real, true); err != nil {
		return abi.Errorf(abi.PermissionDenied, "lio_lun_create: %s leads outside the granted roots", path)
	}
	return nil
}

// grantedPortal checks a listen portal against the caller's portal roots.
func grantedPortal(roots []string, p string) error {
	want, err := portalName(p)
	if err != nil {
		return err
	}
	for _, r := range roots {
		if strings.HasPrefix(r, "/") || isNameRoot(r) {
			continue
		}
		if got, err := portalName(r); err == nil && got == want {
			return nil
		}
	}
	return abi.Errorf(abi.PermissionDenied, "portal %s is not granted", want)
}
