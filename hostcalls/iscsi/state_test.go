package iscsi

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func mustKey(portal, iqn string) sessionKey {
	return sessionKey{Portal: netip.MustParseAddrPort(portal), IQN: iqn}
}

func TestUsersPersistAcrossReload(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	u, err := loadUsers(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := mustKey("127.0.0.1:3260", "iqn.2024-01.dev.wasmcsi:a")
	b := mustKey("[fd00::1]:3260", "iqn.2024-01.dev.wasmcsi:b")
	for _, step := range []struct {
		k   sessionKey
		lun int
		new bool
	}{{a, 2, true}, {a, 0, true}, {a, 2, false}, {b, 7, true}} {
		added, err := u.add(step.k, step.lun)
		if err != nil {
			t.Fatal(err)
		}
		if added != step.new {
			t.Fatalf("add(%s, %d) = %v, want %v", step.k, step.lun, added, step.new)
		}
	}
	if left, err := u.remove(b, 7); err != nil || left != 0 {
		t.Fatalf("remove(b, 7) = %d, %v; want 0", left, err)
	}
	if left, err := u.remove(b, 7); err != nil || left != 0 {
		t.Fatalf("second remove(b, 7) = %d, %v; want 0", left, err)
	}

	// A new process sees exactly what the old one recorded.
	u2, err := loadUsers(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := u2.get(a); !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("after reload a = %v, want [0 2]", got)
	}
	if got := u2.get(b); len(got) != 0 {
		t.Fatalf("after reload b = %v, want none", got)
	}
	if ks := u2.keys(); len(ks) != 1 || ks[0] != a {
		t.Fatalf("keys = %v, want [%s]", ks, a)
	}

	// The file is private, and no temporary files are left behind.
	st, err := os.Stat(filepath.Join(dir, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v, want 0600", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("state dir holds %d entries, want only %s", len(ents), stateFile)
	}
}

func TestUsersRejectsCorruptState(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"not json", "{", "parse"},
		{"future version", `{"version": 2, "sessions": []}`, "unknown version"},
		{"bad portal", `{"version": 1, "sessions": [{"portal": "host:3260", "iqn": "iqn.2024-01.a.b", "luns": [1]}]}`, "portal"},
		{"bad iqn", `{"version": 1, "sessions": [{"portal": "127.0.0.1:3260", "iqn": "nope", "luns": [1]}]}`, "iSCSI name"},
		{"bad lun", `{"version": 1, "sessions": [{"portal": "127.0.0.1:3260", "iqn": "iqn.2024-01.a.b", "luns": [256]}]}`, "out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := loadUsers(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("loadUsers = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func TestUsersFailedWriteKeepsMemory(t *testing.T) {
	dir := t.TempDir()
	u, err := loadUsers(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := mustKey("127.0.0.1:3260", "iqn.2024-01.dev.wasmcsi:a")
	if _, err := u.add(a, 1); err != nil {
		t.Fatal(err)
	}
	// A non-empty directory where the file should be makes the rename
	// fail, for root too.
	path := filepath.Join(dir, stateFile)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := u.add(a, 2); err == nil {
		t.Fatal("add succeeded although the file cannot be written")
	}
	if got := u.get(a); !slices.Equal(got, []int{1}) {
		t.Fatalf("after failed add: %v, want [1]", got)
	}
	if _, err := u.remove(a, 1); err == nil {
		t.Fatal("remove succeeded although the file cannot be written")
	}
	if got := u.get(a); !slices.Equal(got, []int{1}) {
		t.Fatalf("after failed remove: %v, want [1]", got)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("failed writes left %d entries in the state dir, want 1", len(ents))
	}
}
