package lio

// These tests drive the kernel's LIO target through configfs. They need
// root and the target modules, which the VM tier (.ci/vm/test.sh) provides;
// elsewhere they skip with the reason.

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/iscsi"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

const vmInitiator = "iqn.1993-08.org.debian:01:lio-vm-test"

// requireLIO skips unless LIO can be driven here and returns a Configfs on
// the real tree whose test objects are all removed when t ends.
func requireLIO(t *testing.T) *Configfs {
	t.Helper()
	vmtest.Require(t, "configfs", "target_core_mod", "iscsi_target_mod", "target_core_file", "target_core_iblock")
	if _, err := os.Stat(filepath.Join(DefaultRoot, "core")); err != nil {
		t.Skipf("needs configfs mounted with LIO at %s: %v", DefaultRoot, err)
	}
	c, err := New(Config{IQNPrefix: testPrefix, NamePrefix: testNames})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(t, c) })
	return c
}

// removeAll deletes every target and backstore inside the test prefixes.
func removeAll(t *testing.T, c *Configfs) {
	ctx := context.Background()
	targets, _ := listDirs(filepath.Join(c.cfg.Root, "iscsi"))
	for _, tg := range targets {
		if strings.HasPrefix(tg, testPrefix) {
			if err := c.DeleteTarget(ctx, tg); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
	for _, k := range []Kind{Block, FileIO} {
		hba, _ := k.hba()
		names, _ := listDirs(filepath.Join(c.cfg.Root, "core", hba))
		for _, n := range names {
			if strings.HasPrefix(n, testNames) {
				if err := c.DeleteBackstore(ctx, k, n); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
	}
}

func sparseFile(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lun.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return p
}

func attr(t *testing.T, path string) string {
	t.Helper()
	v, err := sysattr.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVMLUNLifecycle(t *testing.T) {
	c := requireLIO(t)
	ctx := context.Background()
	target := testPrefix + "life"
	spec := LUN{Target: target, LUN: 3, Portals: []string{"127.0.0.1:3260"},
		Backstore: Backstore{Kind: FileIO, Name: testNames + "life", Path: sparseFile(t, 64<<20)}}

	start := time.Now()
	if err := c.CreateLUN(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURE lio LUN create (fileio, new target): %v", time.Since(start))

	// The access rules: only granted initiators log in and discover.
	tpgDir := c.tpgPath(target)
	for name, want := range map[string]string{
		"attrib/generate_node_acls": "0", "attrib/demo_mode_discovery": "0", "attrib/authentication": "0", "enable": "1",
	} {
		if got := attr(t, filepath.Join(tpgDir, name)); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	bs := filepath.Join(c.cfg.Root, "core", "fileio_0", spec.Backstore.Name)
	if got := attr(t, filepath.Join(bs, "enable")); got != "1" {
		t.Fatalf("backstore enable = %s", got)
	}
	if info := attr(t, filepath.Join(bs, "info")); !strings.Contains(info, "Size: 67108864") {
		t.Fatalf("backstore info %q: want size 67108864", info)
	}

	// Idempotent, and conflicts are refused.
	start = time.Now()
	if err := c.CreateLUN(ctx, spec); err != nil {
		t.Fatalf("repeated CreateLUN: %v", err)
	}
	t.Logf("MEASURE lio LUN create (repeat, no-op): %v", time.Since(start))

	// The write cache a fileio LUN reports follows every create, also
	// of the LUN that exists.
	cache := filepath.Join(bs, "attrib", "emulate_write_cache")
	if got := attr(t, cache); got != "0" {
		t.Fatalf("emulate_write_cache of a new LUN = %s, want 0", got)
	}
	for _, on := range []bool{true, true, false} {
		spec.Backstore.WriteCache = on
		if err := c.CreateLUN(ctx, spec); err != nil {
			t.Fatalf("CreateLUN with WriteCache %v: %v", on, err)
		}
		if got, want := attr(t, cache), map[bool]string{false: "0", true: "1"}[on]; got != want {
			t.Fatalf("after CreateLUN with WriteCache %v: emulate_write_cache = %s, want %s", on, got, want)
		}
	}
	other := spec
	other.Backstore = Backstore{Kind: FileIO, Name: testNames + "other", Path: sparseFile(t, 1<<20)}
	if err := c.CreateLUN(ctx, other); abi.CodeOf(err) != abi.AlreadyExists {
		t.Fatalf("CreateLUN of a used LUN number with another backstore = %v, want ALREADY_EXISTS", err)
	}
	moved := spec
	moved.LUN = 4
	moved.Backstore.Path = sparseFile(t, 1<<20)
	if err := c.CreateLUN(ctx, moved); abi.CodeOf(err) != abi.AlreadyExists {
		t.Fatalf("CreateLUN reusing a backstore name for another file = %v, want ALREADY_EXISTS", err)
	}

	// Grant, with and without CHAP; repeat; then revoke.
	if err := c.Grant(ctx, target, 3, vmInitiator, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Grant(ctx, target, 3, vmInitiator, nil); err != nil {
		t.Fatalf("repeated Grant: %v", err)
	}
	if err := c.Grant(ctx, target, 9, vmInitiator, nil); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("Grant of a missing LUN = %v, want NOT_FOUND", err)
	}
	chap := &iscsi.CHAP{User: "user1", Secret: "secret123456"}
	if err := c.Grant(ctx, target, 3, vmInitiator, chap); err != nil {
		t.Fatal(err)
	}
	acl := filepath.Join(tpgDir, "acls", vmInitiator)
	if got := attr(t, filepath.Join(acl, "auth", "password")); got != chap.Secret {
		t.Fatalf("stored CHAP secret %q, want it verbatim", got)
	}
	ti, err := c.Target(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if !ti.Enabled || !slices.Equal(ti.Portals, []string{"127.0.0.1:3260"}) ||
		ti.LUNs[3] != (BackstoreRef{Kind: FileIO, Name: spec.Backstore.Name}) ||
		!slices.Equal(ti.ACLs[vmInitiator], []int{3}) || !ti.CHAP[vmInitiator] {
		t.Fatalf("Target = %+v", ti)
	}
	if err := c.DeleteBackstore(ctx, FileIO, spec.Backstore.Name); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("DeleteBackstore under a LUN = %v, want FAILED_PRECONDITION", err)
	}
	if err := c.Revoke(ctx, target, 3, vmInitiator); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(acl); !os.IsNotExist(err) {
		t.Fatalf("ACL left after its last LUN was revoked: %v", err)
	}
	if err := c.Revoke(ctx, target, 3, vmInitiator); err != nil {
		t.Fatalf("repeated Revoke: %v", err)
	}

	// Deleting the last LUN (granted again first) takes the ACL, LUN,
	// backstore and target with it, in order; repeating is fine.
	if err := c.Grant(ctx, target, 3, vmInitiator, nil); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := c.DeleteLUN(ctx, target, 3); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURE lio LUN delete (with ACL, last LUN, target removed): %v", time.Since(start))
	for _, p := range []string{filepath.Join(c.cfg.Root, "iscsi", target), bs} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s left after DeleteLUN: %v", p, err)
		}
	}
	if err := c.DeleteLUN(ctx, target, 3); err != nil {
		t.Fatalf("repeated DeleteLUN: %v", err)
	}
	if _, err := c.Target(ctx, target); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("Target after delete = %v, want NOT_FOUND", err)
	}
}

func TestVMBlockBackstoreAndSharedTarget(t *testing.T) {
	c := requireLIO(t)
	vmtest.Require(t, "loop")
	ctx := context.Background()
	file := sparseFile(t, 32<<20)
	d, err := loop.Attach(ctx, file, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		removeAll(t, c) // LIO holds the device until its backstore goes
		if err := loop.Detach(context.Background(), d.Path); err != nil {
			t.Errorf("detach: %v", err)
		}
	})
	target := testPrefix + "shared"
	block := LUN{Target: target, LUN: 0, Portals: []string{"127.0.0.1:3260", "[::1]:3260"},
		Backstore: Backstore{Kind: Block, Name: testNames + "blk", Path: d.Path}}
	start := time.Now()
	if err := c.CreateLUN(ctx, block); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURE lio LUN create (block, new target): %v", time.Since(start))
	cached := block
	cached.Backstore.WriteCache = true
	if err := c.CreateLUN(ctx, cached); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("block LUN with WriteCache = %v, want INVALID_ARGUMENT", err)
	}
	file2 := LUN{Target: target, LUN: 1, Portals: []string{"127.0.0.1:3260"},
		Backstore: Backstore{Kind: FileIO, Name: testNames + "f2", Path: sparseFile(t, 8<<20)}}
	start = time.Now()
	if err := c.CreateLUN(ctx, file2); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURE lio LUN create (fileio, existing target): %v", time.Since(start))
	for _, l := range []int{0, 1} {
		if err := c.Grant(ctx, target, l, vmInitiator, nil); err != nil {
			t.Fatal(err)
		}
	}
	if info := attr(t, filepath.Join(c.cfg.Root, "core", "iblock_0", block.Backstore.Name, "info")); !strings.Contains(info, d.Path) {
		t.Fatalf("iblock info %q does not name %s", info, d.Path)
	}
	// While it serves the LUN, LIO holds the device exclusively.
	if fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0); err == nil {
		unix.Close(fd)
		t.Fatalf("%s is not held by its iblock backstore", d.Path)
	}

	// Deleting LUN 0 keeps the target, LUN 1 and the initiator's ACL.
	if err := c.DeleteLUN(ctx, target, 0); err != nil {
		t.Fatal(err)
	}
	ti, err := c.Target(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if len(ti.LUNs) != 1 || ti.LUNs[1].Name != file2.Backstore.Name || !slices.Equal(ti.ACLs[vmInitiator], []int{1}) {
		t.Fatalf("after deleting LUN 0: %+v", ti)
	}
	if len(ti.Portals) != 2 {
		t.Fatalf("portals %v, want both kept", ti.Portals)
	}
	// The block device is free again: LIO let go of it.
	if _, err := os.Stat(filepath.Join(c.cfg.Root, "core", "iblock_0", block.Backstore.Name)); !os.IsNotExist(err) {
		t.Fatalf("block backstore left: %v", err)
	}
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("exclusive open of %s after its backstore went: %v", d.Path, err)
	}
	unix.Close(fd)
	// DeleteTarget takes the rest down but leaves backstores to their owner.
	if err := c.DeleteTarget(ctx, target); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Target(ctx, target); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("Target after DeleteTarget = %v, want NOT_FOUND", err)
	}
	if _, err := os.Stat(filepath.Join(c.cfg.Root, "core", "fileio_0", file2.Backstore.Name)); err != nil {
		t.Fatalf("DeleteTarget removed a backstore: %v", err)
	}
	if err := c.DeleteBackstore(ctx, FileIO, file2.Backstore.Name); err != nil {
		t.Fatal(err)
	}
}

func TestVMResizeFileIO(t *testing.T) {
	c := requireLIO(t)
	ctx := context.Background()
	spec := LUN{Target: testPrefix + "grow", LUN: 0, Portals: []string{"127.0.0.1:3260"},
		Backstore: Backstore{Kind: FileIO, Name: testNames + "grow", Path: sparseFile(t, 16<<20)}}
	if err := c.CreateLUN(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(spec.Backstore.Path, 32<<20); err != nil {
		t.Fatal(err)
	}
	if err := c.ResizeFileIO(ctx, spec.Backstore.Name, 32<<20); err != nil {
		t.Fatal(err)
	}
	info := attr(t, filepath.Join(c.cfg.Root, "core", "fileio_0", spec.Backstore.Name, "info"))
	if !strings.Contains(info, "Size: 33554432") {
		t.Fatalf("info after resize %q: want Size: 33554432", info)
	}
	if err := c.ResizeFileIO(ctx, testNames+"missing", 32<<20); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("resize of a missing backstore = %v, want NOT_FOUND", err)
	}
}

func TestVMBindingRoundTrip(t *testing.T) {
	c := requireLIO(t)
	ctx := context.Background()
	target := testPrefix + "hostcall"
	name := backstoreName(target, 2)
	t.Cleanup(func() { c.DeleteTarget(ctx, target); deleteBackstoreNamed(t, FileIO, name) })
	file := sparseFile(t, 8<<20)
	roots := []string{testPrefix, filepath.Dir(file), "127.0.0.1:3260"}
	create := &abi.LioLunCreateRequest{Target: target, LUN: 2, Kind: "fileio", Path: file, Portals: []string{"127.0.0.1:3260"}}
	for range 2 { // idempotent
		if err := callAt(t, DefaultRoot, roots, abi.HostCallLioLunCreate, create); err != nil {
			t.Fatal(err)
		}
	}
	grant := &abi.LioGrantRequest{Target: target, LUN: 2, Initiator: vmInitiator, ChapUser: "user1", ChapSecret: "secret123456"}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioGrant, grant); err != nil {
		t.Fatal(err)
	}
	ti, err := c.Target(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if ti.LUNs[2] != (BackstoreRef{Kind: FileIO, Name: name}) || !slices.Equal(ti.ACLs[vmInitiator], []int{2}) || !ti.CHAP[vmInitiator] {
		t.Fatalf("after create and grant: %+v", ti)
	}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioRevoke, grant); err != nil {
		t.Fatal(err)
	}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: target, LUN: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Target(ctx, target); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("target after lio_lun_delete: %v, want NOT_FOUND", err)
	}
	if _, err := os.Stat(filepath.Join(DefaultRoot, "core", "fileio_0", name)); !os.IsNotExist(err) {
		t.Fatalf("backstore %s left after lio_lun_delete: %v", name, err)
	}
}

// deleteBackstoreNamed removes a backstore outside the test name prefix.
func deleteBackstoreNamed(t *testing.T, k Kind, name string) {
	hba, _ := k.hba()
	if err := rmdir(filepath.Join(DefaultRoot, "core", hba, name)); err != nil {
		t.Errorf("cleanup %s: %v", name, err)
	}
}

// TestVMBindingResizeAndGuardedDelete drives lio_lun_resize and a
// lio_lun_delete guarded by its backing path on the real tree.
func TestVMBindingResizeAndGuardedDelete(t *testing.T) {
	c := requireLIO(t)
	ctx := context.Background()
	target := testPrefix + "resize"
	name := backstoreName(target, 1)
	t.Cleanup(func() {
		c.DeleteTarget(ctx, target)
		if _, err := os.Stat(filepath.Join(DefaultRoot, "core", "fileio_0", name)); err == nil {
			deleteBackstoreNamed(t, FileIO, name)
		}
	})
	file := sparseFile(t, 16<<20)
	other := filepath.Join(filepath.Dir(file), "other.img")
	roots := []string{testPrefix, filepath.Dir(file), "127.0.0.1:3260"}
	create := &abi.LioLunCreateRequest{Target: target, LUN: 1, Kind: "fileio", Path: file, Portals: []string{"127.0.0.1:3260"}}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioLunCreate, create); err != nil {
		t.Fatal(err)
	}
	resize := &abi.LioLunResizeRequest{Target: target, LUN: 1, SizeBytes: 32 << 20}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioLunResize, resize); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("resize past the file's end = %v, want FAILED_PRECONDITION", err)
	}
	if err := os.Truncate(file, 32<<20); err != nil {
		t.Fatal(err)
	}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioLunResize, resize); err != nil {
		t.Fatal(err)
	}
	if info := attr(t, filepath.Join(DefaultRoot, "core", "fileio_0", name, "info")); !strings.Contains(info, "Size: 33554432") {
		t.Fatalf("info after lio_lun_resize %q: want Size: 33554432", info)
	}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: target, LUN: 1, Path: other}); err != nil {
		t.Fatal(err)
	}
	if ti, err := c.Target(ctx, target); err != nil || ti.LUNs[1].Name != name {
		t.Fatalf("a delete guarded by another path removed the LUN: %+v, %v", ti, err)
	}
	if err := callAt(t, DefaultRoot, roots, abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: target, LUN: 1, Path: file}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Target(ctx, target); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("target after the guarded delete: %v, want NOT_FOUND", err)
	}
}
