package scratch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func openRoot(t *testing.T) (string, int) {
	t.Helper()
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return dir, fd
}

func mkfile(dir int, name string) (int, error) {
	return unix.Openat(dir, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
}

func unlink(dir int, name string) error { return unix.Unlinkat(dir, name, 0) }

func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// TestCreateSweepTidy: a temporary lives in the scratch folder while it is
// built; a sweep leaves it alone while its builder holds it and removes it
// once nobody does; the folder goes with its last entry.
func TestCreateSweepTidy(t *testing.T) {
	ctx := context.Background()
	dir, root := openRoot(t)
	if n, err := Sweep(ctx, root, unlink); n != 0 || err != nil {
		t.Fatalf("Sweep of a pool without a scratch folder = %d, %v", n, err)
	}
	tmp, err := Create(root, mkfile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, Dir, tmp.Name)
	if n, err := Sweep(ctx, root, unlink); n != 0 || err != nil || !exists(path) {
		t.Fatalf("Sweep with a live temporary = %d, %v; still there: %v", n, err, exists(path))
	}
	// The builder dies without cleaning up: its lock goes with its
	// descriptor, its entry stays.
	unix.Close(tmp.FD)
	unix.Close(tmp.Dir)
	if n, err := Sweep(ctx, root, unlink); n != 1 || err != nil || exists(path) {
		t.Fatalf("Sweep of an abandoned temporary = %d, %v; still there: %v", n, err, exists(path))
	}
	if exists(filepath.Join(dir, Dir)) {
		t.Fatal("Sweep left an empty scratch folder")
	}

	tmp, err = Create(root, mkfile)
	if err != nil {
		t.Fatal(err)
	}
	if err := unlink(tmp.Dir, tmp.Name); err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	if exists(filepath.Join(dir, Dir)) {
		t.Fatal("Close left an empty scratch folder")
	}
}

// TestSweepRefusesEscapes: a symlink planted as the scratch folder is not
// followed.
func TestSweepRefusesEscapes(t *testing.T) {
	dir, root := openRoot(t)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "precious"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, Dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := Sweep(context.Background(), root, unlink); err == nil {
		t.Fatal("Sweep through a symlinked scratch folder succeeded")
	}
	if _, err := Create(root, mkfile); err == nil {
		t.Fatal("Create through a symlinked scratch folder succeeded")
	}
	if !exists(filepath.Join(outside, "precious")) {
		t.Fatal("a sweep removed a file outside the pool")
	}
}

// TestConcurrentBuildsAndSweeps: builders that create, hold and finish
// temporaries while others sweep and the folder comes and goes never lose
// a live temporary and never fail.
func TestConcurrentBuildsAndSweeps(t *testing.T) {
	ctx := context.Background()
	dir, root := openRoot(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 4 {
		wg.Go(func() {
			for range 200 {
				tmp, err := Create(root, mkfile)
				if err != nil {
					errs <- err
					return
				}
				if !exists(filepath.Join(dir, Dir, tmp.Name)) {
					errs <- errors.New("a live temporary was swept")
				}
				if err := unlink(tmp.Dir, tmp.Name); err != nil {
					errs <- err
				}
				tmp.Close()
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 400 {
				if _, err := Sweep(ctx, root, unlink); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if exists(filepath.Join(dir, Dir)) {
		t.Fatal("the scratch folder stays after every build ended")
	}
}
