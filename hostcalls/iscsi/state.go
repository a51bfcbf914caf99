package iscsi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
)

// stateFile is the name of the users file inside the state directory.
const stateFile = "iscsi-sessions.json"

// stateVersion is the layout version of the users file.
const stateVersion = 1

// users is the durable record of which LUNs of which session are in use.
// It is the refcount that decides when a shared session may be logged out,
// so it must survive daemon restarts: every change is written to a temporary
// file, synced, renamed over the old one, and the directory is synced.
type users struct {
	path string

	mu   sync.Mutex
	luns map[sessionKey][]int // sorted, no duplicates, never empty
}

type stateDoc struct {
	Version  int           `json:"version"`
	Sessions []stateRecord `json:"sessions"`
}

type stateRecord struct {
	Portal string `json:"portal"`
	IQN    string `json:"iqn"`
	LUNs   []int  `json:"luns"`
}

// loadUsers reads the users file in dir, creating dir if needed. A missing
// file is an empty record; a corrupt one is an error, never silently reset,
// because dropping users would let a later logout end a session in use.
func loadUsers(dir string) (*users, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	u := &users{path: filepath.Join(dir, stateFile), luns: map[sessionKey][]int{}}
	b, err := os.ReadFile(u.path)
	if errors.Is(err, fs.ErrNotExist) {
		return u, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", u.path, err)
	}
	var doc stateDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse %s: %w", u.path, err)
	}
	if doc.Version != stateVersion {
		return nil, fmt.Errorf("%s: unknown version %d", u.path, doc.Version)
	}
	for _, r := range doc.Sessions {
		ap, err := ParsePortal(r.Portal)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u.path, err)
		}
		if err := ValidateName(r.IQN); err != nil {
			return nil, fmt.Errorf("%s: %w", u.path, err)
		}
		k := sessionKey{Portal: ap, IQN: r.IQN}
		for _, l := range r.LUNs {
			if l < 0 || l > MaxLUN {
				return nil, fmt.Errorf("%s: %s: LUN %d out of range", u.path, k, l)
			}
			u.luns[k] = insertSorted(u.luns[k], l)
		}
	}
	return u, nil
}

// get returns a copy of the LUNs in use on k.
func (u *users) get(k sessionKey) []int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.luns[k])
}

// keys returns every session that has users.
func (u *users) keys() []sessionKey {
	u.mu.Lock()
	defer u.mu.Unlock()
	ks := make([]sessionKey, 0, len(u.luns))
	for k := range u.luns {
		ks = append(ks, k)
	}
	return ks
}

// add records lun as a user of k and reports whether it was new.
func (u *users) add(k sessionKey, lun int) (bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if slices.Contains(u.luns[k], lun) {
		return false, nil
	}
	old := u.luns[k]
	u.luns[k] = insertSorted(slices.Clone(old), lun)
	if err := u.saveLocked(); err != nil {
		u.setLocked(k, old)
		return false, err
	}
	return true, nil
}

// remove drops lun from k's users and returns how many users remain.
func (u *users) remove(k sessionKey, lun int) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	old := u.luns[k]
	i := slices.Index(old, lun)
	if i < 0 {
		return len(old), nil
	}
	u.setLocked(k, slices.Delete(slices.Clone(old), i, i+1))
	if err := u.saveLocked(); err != nil {
		u.setLocked(k, old)
		return len(old), err
	}
	return len(old) - 1, nil
}

func (u *users) setLocked(k sessionKey, luns []int) {
	if len(luns) == 0 {
		delete(u.luns, k)
		return
	}
	u.luns[k] = luns
}

// saveLocked writes the record atomically: temp file, fsync, rename, fsync
// of the directory. Entries are sorted so the file is stable and diffable.
func (u *users) saveLocked() error {
	doc := stateDoc{Version: stateVersion, Sessions: []stateRecord{}}
	for k, luns := range u.luns {
		doc.Sessions = append(doc.Sessions, stateRecord{Portal: k.Portal.String(), IQN: k.IQN, LUNs: luns})
	}
	sort.Slice(doc.Sessions, func(i, j int) bool {
		a, b := doc.Sessions[i], doc.Sessions[j]
		if a.IQN != b.IQN {
			return a.IQN < b.IQN
		}
		return a.Portal < b.Portal
	})
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", u.path, err)
	}
	b = append(b, '\n')
	return writeFileAtomic(u.path, b)
}

func writeFileAtomic(path string, b []byte) error {
	return writeFileVia(path, filepath.Dir(path), "."+filepath.Base(path)+".tmp-*", b)
}

// testHookBeforeRename, when set, is called with the temp file's path
// before writeFileVia renames it into place (tests: a crash there).
var testHookBeforeRename func(tmp string)

// writeFileVia is writeFileAtomic with the temp file made in tmpDir (which
// must be on path's filesystem) under the os.CreateTemp pattern pattern.
func writeFileVia(path, tmpDir, pattern string, b []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(tmpDir, pattern)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if testHookBeforeRename != nil {
		testHookBeforeRename(tmp)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	ok = true
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

func insertSorted(s []int, v int) []int {
	i, found := slices.BinarySearch(s, v)
	if found {
		return s
	}
	return slices.Insert(s, i, v)
}
