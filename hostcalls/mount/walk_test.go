package mount

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// TestOpenWalk: without openat2, a path beneath the root opens component by
// component; a symlink on the way or at the end, even one that stays
// inside the root, and ".." are PermissionDenied, as with openat2.
func TestOpenWalk(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "a", "b", "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, to := range map[string]string{"up": "/", "in": "a", "file": "a/b/f"} {
		if err := os.Symlink(to, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	var want unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "a", "b", "f"), &want); err != nil {
		t.Fatal(err)
	}
	for _, flags := range []int{unix.O_PATH, unix.O_RDONLY} {
		fd, err := openWalk(dir, "a/./b//f", flags)
		if err != nil {
			t.Fatalf("open a/b/f (flags %#x): %v", flags, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil || st.Dev != want.Dev || st.Ino != want.Ino {
			t.Errorf("a/b/f (flags %#x) opened another file: %v", flags, err)
		}
		for _, rel := range []string{"up", "up/etc", "in/b", "file", "a/../a/b", "..", "/etc"} {
			if fd, err := openWalk(dir, rel, flags); abi.CodeOf(err) != abi.PermissionDenied {
				if err == nil {
					unix.Close(fd)
				}
				t.Errorf("open %q (flags %#x): %v, want PERMISSION_DENIED", rel, flags, err)
			}
		}
	}
	fd, err := openWalk(dir, ".", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.Fatalf("open the root itself: %v", err)
	}
	unix.Close(fd)
}
