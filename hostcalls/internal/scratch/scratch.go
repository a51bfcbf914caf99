// Package scratch keeps the temporaries of a pool: entries that are being
// built and get their final name only when complete (hostcalls/dirpool's
// copies, hostcalls/filepool's files on filesystems without O_TMPFILE).
// They live in one folder of the pool root, Dir, named with a leading dot:
// pool names never start with one, so no name a caller chooses reaches a
// temporary and no existence check sees one.
//
// A builder holds an exclusive flock(2) on its temporary for as long as it
// works on it. The kernel drops the lock when the process dies, so a
// temporary nobody holds is abandoned: Sweep removes those, and never one
// that a live builder, in this process or another, still holds. Where the
// filesystem has no flock (some network filesystems) builders go on without
// the lock and Sweep leaves every entry alone, as it cannot tell.
//
// The package must never touch anything outside the scratch folder: every
// entry is opened relative to the folder's descriptor, one path component,
// without following symlinks or crossing mounts.
package scratch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Dir is the name of the scratch folder in a pool root. It exists only
// while something is built in it (or after a crash, until a sweep).
const Dir = ".wasmcsi-tmp"

// dirMode keeps the scratch folder to the daemon.
const dirMode = 0o700

// Temp is a temporary being built: an entry of the scratch folder, open
// and locked.
type Temp struct {
	Dir  int    // the scratch folder
	Name string // the temporary's name in Dir
	// FD is the temporary itself; closing it releases the lock. A caller
	// that hands it to an owner of its own (an os.File) sets it to -1 and
	// closes that owner before Close.
	FD int

	root int
}

// Close releases the temporary's lock and descriptors and removes the
// scratch folder if nothing else is in it. The caller has renamed or
// removed the temporary before.
func (t *Temp) Close() {
	if t.FD >= 0 {
		unix.Close(t.FD)
	}
	unix.Close(t.Dir)
	tidy(t.root)
}

// folderInUse keeps this process's tidies from removing a scratch folder
// between a Create's open of it and the creation of its entry: Create holds
// it shared for those two system calls, tidy exclusively for its one. (A
// folder removed there, empty for an instant, made the entry's creation
// fail with ENOENT; with four builders and two sweepers at work, eight
// retries in a row could fail.) Builds run in parallel; a tidy, one
// unlinkat at the end of a build, waits for creations in flight. Another
// process's tidy can still race a Create; Create's retries cover that.
var folderInUse sync.RWMutex

// tidy removes the scratch folder of root if it is empty. The removal
// needs no sync: an empty folder that comes back after a crash is swept.
func tidy(root int) {
	folderInUse.Lock()
	_ = unix.Unlinkat(root, Dir, unix.AT_REMOVEDIR) // ENOTEMPTY: in use
	folderInUse.Unlock()
}

// Create makes a new temporary in the scratch folder of the pool root open
// at root, making the folder when missing: mk creates the entry name
// relative to the folder's descriptor dir and returns an open descriptor
// of it. Create locks the entry; Temp.Close releases it.
//
// No sync is needed for the folder: on xfs and on ext4 with a journal
// (hostcalls.JournalsMetadata) the journal orders its
// creation before whatever is renamed or linked out of it, and elsewhere
// the builder syncs the filesystem or the file before it names anything.
func Create(root int, mk func(dir int, name string) (int, error)) (*Temp, error) {
	folderInUse.RLock()
	defer folderInUse.RUnlock()
	for range 8 {
		dir, err := openBeneath(root, Dir, unix.O_RDONLY|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			err = unix.Mkdirat(root, Dir, dirMode)
			if err == nil || errors.Is(err, unix.EEXIST) {
				continue // open what was made, by us or meanwhile
			}
		}
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", Dir, err)
		}
		name, fd, err := create(dir, mk)
		if err != nil {
			unix.Close(dir)
			if errors.Is(err, unix.ENOENT) {
				continue // another build tidied the folder away meanwhile
			}
			return nil, err
		}
		return &Temp{Dir: dir, Name: name, FD: fd, root: root}, nil
	}
	return nil, fmt.Errorf("create a temporary in %s: it kept vanishing", Dir)
}

func create(dir int, mk func(dir int, name string) (int, error)) (string, int, error) {
	for range 8 {
		var rnd [12]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return "", -1, err
		}
		name := hex.EncodeToString(rnd[:])
		fd, err := mk(dir, name)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return "", -1, err
		}
		if err := lock(fd, unix.LOCK_EX); err != nil && !noLocks(err) {
			unix.Close(fd)
			return "", -1, fmt.Errorf("lock %s: %w", name, err)
		}
		// Between mk and the lock a sweep (of this or another process) may
		// have taken the unlocked entry for abandoned and removed it; the
		// blocking lock above then waited for that removal to end.
		if same(dir, name, fd) {
			return name, fd, nil
		}
		unix.Close(fd)
	}
	return "", -1, fmt.Errorf("create a temporary in %s: no free name after 8 tries", Dir)
}

// Sweep removes, with remove, every entry of the scratch folder of the pool
// root open at root that no process holds locked, and returns how many it
// removed. remove is called with the folder's descriptor and the entry's
// name while Sweep holds the entry's lock. A pool without a scratch folder
// has nothing to sweep.
func Sweep(ctx context.Context, root int, remove func(dir int, name string) error) (int, error) {
	dir, err := openBeneath(root, Dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", Dir, err)
	}
	defer tidy(root)
	defer unix.Close(dir)
	names, err := list(dir)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil // tidied away by a build that just ended
	}
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", Dir, err)
	}
	removed := 0
	var errs []error
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		ok, err := sweepOne(dir, name, remove)
		if ok {
			removed++
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep %s/%s: %w", Dir, name, err))
		}
	}
	return removed, errors.Join(errs...)
}

// sweepOne removes name if it is abandoned and reports whether it did.
func sweepOne(dir int, name string, remove func(dir int, name string) error) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if k := st.Mode & unix.S_IFMT; k != unix.S_IFDIR && k != unix.S_IFREG {
		// Not a temporary of ours, and opening a device or FIFO to lock it
		// could have side effects: it goes without a look.
		return true, remove(dir, name)
	}
	fd, err := openBeneath(dir, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	switch err := lock(fd, unix.LOCK_EX|unix.LOCK_NB); {
	case errors.Is(err, unix.EWOULDBLOCK):
		return false, nil // a live builder's
	case noLocks(err):
		return false, nil // cannot tell: leave it
	case err != nil:
		return false, fmt.Errorf("lock: %w", err)
	}
	if !same(dir, name, fd) {
		return false, nil
	}
	if err := remove(dir, name); err != nil {
		return false, err
	}
	return true, nil
}

func lock(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// noLocks reports the errors of a filesystem without flock.
func noLocks(err error) bool {
	return errors.Is(err, unix.ENOLCK) || errors.Is(err, unix.EOPNOTSUPP) ||
		errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EBADF)
}

// same reports whether name in dir is still the inode open at fd.
func same(dir int, name string, fd int) bool {
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Fstatat(dir, name, &b, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// list returns the names in the directory open at dir, except "." and
// "..". It reads through a descriptor of its own, so the caller's file
// offset is untouched.
func list(dir int) ([]string, error) {
	fd, err := openBeneath(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 8<<10)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("getdents: %w", err)
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// openBeneath opens name, one path component, relative to dirfd: no
// symlink, no mount crossing. Where a seccomp filter hides openat2, openat
// with O_NOFOLLOW is as strict for one component, except that it does not
// refuse a mount point.
func openBeneath(dirfd int, name string, flags int) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_MAGICLINKS,
	}
	for range 16 {
		fd, err := unix.Openat2(dirfd, name, &how)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
			return unix.Openat(dirfd, name, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}
