package dirpool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

func newPool(t *testing.T, root string) *Pool {
	t.Helper()
	p, err := Open(root)
	if err != nil {
		t.Fatalf("Open(%s): %v", root, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func wantCode(t *testing.T, what string, err error, want abi.Code) {
	t.Helper()
	if got := abi.CodeOf(err); got != want {
		t.Fatalf("%s: code %v (err %v), want %v", what, got, err, want)
	}
}

func writeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func TestValidName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"pvc-0a1b", true},
		{"snap.1", true},
		{"..data", false}, // a leading dot is the pool's own (its scratch folder)
		{".wasmcsi-tmp", false},
		{".hidden", false},
		{strings.Repeat("x", 255), true},
		{"", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"/abs", false},
		{"../up", false},
		{"a\x00b", false},
		{strings.Repeat("x", 256), false},
	} {
		err := ValidName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil {
			wantCode(t, "ValidName", err, abi.InvalidArgument)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	writeFile(t, file, "x", 0o644)
	for _, tc := range []struct {
		root string
		want abi.Code
	}{
		{"", abi.InvalidArgument},
		{"relative/dir", abi.InvalidArgument},
		{filepath.Join(t.TempDir(), "missing"), abi.NotFound},
		{file, abi.FailedPrecondition},
	} {
		p, err := Open(tc.root)
		if err == nil {
			p.Close()
		}
		wantCode(t, "Open("+tc.root+")", err, tc.want)
	}
}

func TestCreateExistsRemove(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	p := newPool(t, root)
	old := unix.Umask(0o077) // the mode must not depend on the umask
	t.Cleanup(func() { unix.Umask(old) })

	path, err := p.Create(ctx, "vol", 0)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(root, "vol") {
		t.Fatalf("Create path %s", path)
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != dirMode {
		t.Fatalf("created %v, %v; want a directory with mode %o", fi, err, dirMode)
	}
	writeFile(t, filepath.Join(path, "data"), "keep", 0o644)
	again, err := p.Create(ctx, "vol", 0)
	if err != nil || again != path {
		t.Fatalf("second Create = %q, %v", again, err)
	}
	if b, err := os.ReadFile(filepath.Join(path, "data")); err != nil || string(b) != "keep" {
		t.Fatalf("second Create touched the content: %q %v", b, err)
	}
	if !p.Exists(ctx, "vol") {
		t.Fatal("Exists(vol) = false")
	}
	if err := os.MkdirAll(filepath.Join(path, "a/b/c"), 0o500); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(ctx, "vol"); err != nil {
		t.Fatal(err)
	}
	if p.Exists(ctx, "vol") {
		t.Fatal("Exists after Remove")
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Remove: %v", err)
	}
	if err := p.Remove(ctx, "vol"); err != nil {
		t.Fatalf("Remove of a missing volume: %v", err)
	}

	writeFile(t, filepath.Join(root, "file"), "x", 0o644)
	_, err = p.Create(ctx, "file", 0)
	wantCode(t, "Create over a file", err, abi.AlreadyExists)
	if p.Exists(ctx, "file") {
		t.Fatal("Exists(file) = true for a regular file")
	}
	_, err = p.Create(ctx, "neg", -1)
	wantCode(t, "Create with a negative quota", err, abi.InvalidArgument)
}

// TestEscapes plants symlinks to a directory outside the pool, as a
// workload or a confused operator could, and checks that no operation
// reaches it.
func TestEscapes(t *testing.T) {
	ctx := context.Background()
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "keep"), "precious", 0o644)
	root := t.TempDir()
	p := newPool(t, root)
	if err := os.Symlink(outside, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	vol, err := p.Create(ctx, "vol", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(vol, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(vol, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../..", filepath.Join(vol, "sub", "up")); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		op   string
		run  func() error
		want abi.Code
	}{
		{"Create(..)", func() error { _, err := p.Create(ctx, "..", 0); return err }, abi.InvalidArgument},
		{"Create(a/b)", func() error { _, err := p.Create(ctx, "a/b", 0); return err }, abi.InvalidArgument},
		{"Create(evil/x)", func() error { _, err := p.Create(ctx, "evil/x", 0); return err }, abi.InvalidArgument},
		{"Create(evil)", func() error { _, err := p.Create(ctx, "evil", 0); return err }, abi.AlreadyExists},
		{"Copy(evil, x)", func() error { return p.Copy(ctx, "evil", "x") }, abi.PermissionDenied},
		{"Copy(vol, evil)", func() error { return p.Copy(ctx, "vol", "evil") }, abi.AlreadyExists},
		{"Copy(vol, ..)", func() error { return p.Copy(ctx, "vol", "..") }, abi.InvalidArgument},
		{"Usage(evil)", func() error { _, _, err := p.Usage(ctx, "evil"); return err }, abi.PermissionDenied},
		{"VolumeStatfs(evil)", func() error { _, err := p.VolumeStatfs(ctx, "evil"); return err }, abi.PermissionDenied},
		{"Remove(../x)", func() error { return p.Remove(ctx, "../x") }, abi.InvalidArgument},
	} {
		wantCode(t, tc.op, tc.run(), tc.want)
	}
	if p.Exists(ctx, "evil") || p.Exists(ctx, "x") {
		t.Fatal("Exists through a symlink, or a failed Copy left its target")
	}

	// Below a single component, only openat2 stands between a name and the
	// outside: test it directly.
	for _, tc := range []struct {
		path string
		want unix.Errno
	}{
		{"evil/keep", unix.ELOOP},
		{"vol/link/keep", unix.ELOOP},
		{"vol/sub/up", unix.ELOOP},
		{"../" + filepath.Base(outside) + "/keep", unix.EXDEV},
		{outside + "/keep", unix.EXDEV},
	} {
		fd, err := openBeneath(p.fd, tc.path, unix.O_RDONLY, 0)
		if err == nil {
			unix.Close(fd)
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("openBeneath(%q) = %v, want %v", tc.path, err, tc.want)
		}
	}

	if err := p.Copy(ctx, "vol", "clone"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(filepath.Join(root, "clone", "link")); err != nil || got != outside {
		t.Fatalf("copied symlink = %q, %v; want a symlink to %s", got, err, outside)
	}
	if _, err := os.Lstat(filepath.Join(root, "clone", "keep")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Copy followed a symlink: %v", err)
	}
	for _, name := range []string{"evil", "vol", "clone"} {
		if err := p.Remove(ctx, name); err != nil {
			t.Fatalf("Remove(%s): %v", name, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "precious" {
		t.Fatalf("outside file after Remove: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(root, "evil")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Remove(evil) left the symlink: %v", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("pool not empty after removing everything: %v", entries)
	}
}

// TestRemoveStopsAtMountPoint bind-mounts an outside directory inside a
// volume, as a leaked publish would, and checks that Remove refuses instead
// of emptying it.
func TestRemoveStopsAtMountPoint(t *testing.T) {
	mounttest.RequireRoot(t)
	ctx := context.Background()
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "keep"), "precious", 0o644)
	p := newPool(t, t.TempDir())
	vol, err := p.Create(ctx, "vol", 0)
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(vol, "deep", "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(outside, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind: %v", err)
	}
	t.Cleanup(func() { mounttest.Unmount(t, mnt) })

	wantCode(t, "Remove with a mount inside", p.Remove(ctx, "vol"), abi.FailedPrecondition)
	wantCode(t, "Copy with a mount inside", p.Copy(ctx, "vol", "clone"), abi.FailedPrecondition)
	if p.Exists(ctx, "clone") {
		t.Fatal("failed Copy left its target")
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "precious" {
		t.Fatalf("outside file after Remove: %q, %v", b, err)
	}
	_, inodes, err := p.Usage(ctx, "vol")
	if err != nil || inodes != 3 { // vol, deep, mnt; nothing of the mount
		t.Fatalf("Usage = %d inodes, %v; want 3", inodes, err)
	}
	mounttest.Unmount(t, mnt)
	if err := p.Remove(ctx, "vol"); err != nil {
		t.Fatalf("Remove after unmount: %v", err)
	}
}

func TestStatfs(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	p := newPool(t, root)
	got, err := p.Statfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var s unix.Statfs_t
	if err := unix.Statfs(root, &s); err != nil {
		t.Fatal(err)
	}
	if want := int64(s.Blocks) * s.Frsize; got.TotalBytes != want || want == 0 {
		t.Errorf("TotalBytes %d, want %d", got.TotalBytes, want)
	}
	if got.TotalInodes != int64(s.Files) {
		t.Errorf("TotalInodes %d, want %d", got.TotalInodes, s.Files)
	}
	if got.AvailBytes > got.FreeBytes || got.FreeBytes > got.TotalBytes {
		t.Errorf("inconsistent %+v", got)
	}
	if _, err := p.Create(ctx, "vol", 0); err != nil {
		t.Fatal(err)
	}
	v, err := p.VolumeStatfs(ctx, "vol")
	if err != nil || v.TotalBytes != got.TotalBytes {
		t.Fatalf("VolumeStatfs without quota = %+v, %v; want the pool's size %d", v, err, got.TotalBytes)
	}
	_, err = p.VolumeStatfs(ctx, "missing")
	wantCode(t, "VolumeStatfs(missing)", err, abi.NotFound)
}

func TestUsageWalk(t *testing.T) {
	ctx := context.Background()
	p := newPool(t, t.TempDir())
	vol, err := p.Create(ctx, "vol", 0)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 10
	data := strings.Repeat("u", size)
	must(t, os.MkdirAll(filepath.Join(vol, "a", "b"), 0o755))
	writeFile(t, filepath.Join(vol, "one"), data, 0o644)
	writeFile(t, filepath.Join(vol, "a", "two"), data, 0o644)
	must(t, os.Link(filepath.Join(vol, "a", "two"), filepath.Join(vol, "a", "b", "two-again")))
	must(t, os.Symlink("one", filepath.Join(vol, "sym")))
	sparse, err := os.Create(filepath.Join(vol, "sparse"))
	must(t, err)
	must(t, sparse.Truncate(1<<30))
	must(t, sparse.Close())
	unix.Sync() // settle delayed allocation before st_blocks is read

	bytes, inodes, err := p.Usage(ctx, "vol")
	if err != nil {
		t.Fatal(err)
	}
	// vol, a, b, one, two (once for two links), sym, sparse
	if inodes != 7 {
		t.Errorf("inodes = %d, want 7", inodes)
	}
	if bytes < 2*size || bytes > 2*size+1<<20 {
		t.Errorf("bytes = %d, want about %d (hard link once, hole not counted)", bytes, 2*size)
	}
	_, _, err = p.Usage(ctx, "missing")
	wantCode(t, "Usage(missing)", err, abi.NotFound)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
