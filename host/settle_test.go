package host

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// A folder whose fsync failed once must not let its operations complete
// when a later fsync succeeds: Linux reports a writeback error to one
// fsync, and the next succeeds although the entries are gone (the disk-
// fault tier saw a CreateVolume's pool file lost this way, its intent
// dropped and its record kept). A folder that could not be opened is
// tried again, and so are the operations of other folders.
func TestSettlerFailedFsyncHoldsForStartUp(t *testing.T) {
	st := newSettler(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer st.close()
	calls := map[string]int{}
	st.sync = func(path string) error {
		calls[path]++
		switch {
		case path == "/pool/eio" && calls[path] == 1:
			return &fsyncError{unix.EIO}
		case path == "/pool/away" && calls[path] == 1:
			return unix.ENOENT
		}
		return nil
	}
	var eio, later, away, other atomic.Bool
	if st.Broken() {
		t.Fatal("a new settler is broken")
	}
	st.add("eio", []string{"/pool/eio"}, func() error { eio.Store(true); return nil })
	st.add("away", []string{"/pool/away"}, func() error { away.Store(true); return nil })
	st.add("other", []string{"/pool/other"}, func() error { other.Store(true); return nil })
	ctx := context.Background()
	for range 3 {
		if err := st.flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st.add("later", []string{"/pool/eio"}, func() error { later.Store(true); return nil })
	if err := st.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if eio.Load() || later.Load() {
		t.Errorf("operations on a folder whose fsync failed completed (first %v, later %v): a later fsync proves nothing", eio.Load(), later.Load())
	}
	if !st.settling("eio") || !st.settling("later") {
		t.Error("operations on the broken folder no longer pending: racing calls would not answer ABORTED")
	}
	if !st.Broken() {
		t.Error("Broken is false after a failed fsync: Probe would still say ready and nothing restarts the daemon")
	}
	if !away.Load() || !other.Load() {
		t.Errorf("a folder that could not be opened once, or another folder, held back (away %v, other %v)", away.Load(), other.Load())
	}
	if errors.Is(&fsyncError{unix.EIO}, unix.EIO) == false {
		t.Error("fsyncError does not unwrap")
	}
}

// A pool filesystem that turned read-only (ext4 after a write error
// aborted its journal) answers a folder's fsync with success although
// nothing queued on it was written, and the error may have gone to
// another caller's fsync: the disk-fault tier lost an acknowledged
// volume's pool file this way. syncFolder reports such a folder as
// failed, so its operations wait for start-up.
func TestSyncFolderReadOnlyFilesystemFails(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root to mount a read-only tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY, "size=1m"); err != nil {
		t.Skipf("mount a read-only tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	var fe *fsyncError
	if err := syncFolder(dir); !errors.As(err, &fe) {
		t.Fatalf("syncFolder of a read-only filesystem: %v, want an fsync error", err)
	}
	if err := syncFolder(t.TempDir()); err != nil {
		t.Fatalf("syncFolder of a writable folder: %v", err)
	}
}

// An ext4 whose journal a write error aborted may answer a later fsync of
// a folder with success, and the error may have gone to another caller's
// fsync (the disk-fault tier lost an acknowledged volume's pool file this
// way): a folder whose filesystem counted errors since its operations
// were queued holds them for start-up, as a failed fsync does.
func TestSettlerFilesystemErrorsHoldForStartUp(t *testing.T) {
	st := newSettler(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer st.close()
	var errs atomic.Int32
	errs.Store(2) // errors counted before: an old incident, fsck'd since
	st.fsErrors = func(dir string) int {
		if dir == "/pool/sick" {
			return int(errs.Load())
		}
		return 0
	}
	st.sync = func(string) error { return nil }
	var sick, well atomic.Bool
	st.add("sick", []string{"/pool/sick"}, func() error { sick.Store(true); return nil })
	st.add("well", []string{"/pool/well"}, func() error { well.Store(true); return nil })
	errs.Add(1) // the journal aborts after the operation was queued
	if err := st.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if sick.Load() || !st.settling("sick") || !st.Broken() {
		t.Errorf("an operation on a filesystem that counted a new error completed (%v) or is no longer pending (%v), broken %v", sick.Load(), st.settling("sick"), st.Broken())
	}
	if !well.Load() {
		t.Error("an operation on another folder was held back")
	}
}
