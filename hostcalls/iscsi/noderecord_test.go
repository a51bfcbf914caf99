package iscsi

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

// TestNoSecretOnIscsiadmArgv logs in with CHAP (right and wrong secret, both
// record layouts, IPv4 and IPv6 portals) and checks that no iscsiadm
// command line the initiator ran carried a secret, while the login still
// used it: the fake target checks the secret it reads from the record file.
func TestNoSecretOnIscsiadmArgv(t *testing.T) {
	chap := &CHAP{User: "user1", Secret: "secret123456"}
	wrong := &CHAP{User: "user1", Secret: "wrong-secret-1"}
	for _, tc := range []struct {
		name   string
		portal string
		tpgt   int
		login  *CHAP
		code   abi.Code
	}{
		{"ipv4 flat record", "127.0.0.1:3260", 0, chap, abi.OK},
		{"ipv6 flat record", "[fd00::1]:3260", 0, chap, abi.OK},
		{"ipv4 tpgt record", "127.0.0.1:3260", 1, chap, abi.OK},
		{"ipv6 tpgt record", "[fd00::1]:3261", 7, chap, abi.OK},
		{"wrong secret", "127.0.0.1:3260", 0, wrong, abi.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, fakeTarget{IQN: tIQN, Portal: tc.portal, LUNs: []int{0}, CHAP: chap})
			w := f.world()
			w.TPGT = tc.tpgt
			f.save(w)
			in := f.initiator(t.TempDir())
			tg := Target{Portal: tc.portal, IQN: tIQN, CHAP: tc.login}
			_, err := in.Login(ctxT(t), tg)

			w = f.world()
			if len(w.Argv) == 0 {
				t.Fatal("no iscsiadm run recorded")
			}
			for _, argv := range w.Argv {
				cmd := strings.Join(argv, " ")
				for _, s := range []string{chap.Secret, wrong.Secret} {
					if strings.Contains(cmd, s) {
						t.Fatalf("iscsiadm command line carries a CHAP secret: %q", cmd)
					}
				}
				if strings.Contains(cmd, "password") {
					t.Fatalf("iscsiadm command line names a password setting: %q", cmd)
				}
			}
			if abi.CodeOf(err) != tc.code {
				t.Fatalf("login = %v, want %v", err, tc.code)
			}
			if tc.code != abi.OK {
				if n := f.nodes(); len(n) != 0 {
					t.Fatalf("a refused login left node records: %v", n)
				}
				return
			}
			recs, err := nodeRecords([]string{f.opts.NodeDB}, mustKey(tc.portal, tIQN))
			if err != nil || len(recs) != 1 {
				t.Fatalf("node records %v, %v: want one", recs, err)
			}
			st, err := os.Stat(recs[0])
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Fatalf("record %s has mode %v, want 0600", recs[0], st.Mode().Perm())
			}
			rec := f.nodes()[tIQN+"|"+tc.portal]
			if rec[authMethod] != "CHAP" || rec[authUser] != chap.User || rec[authPassword] != chap.Secret ||
				rec["node.startup"] != "manual" {
				t.Fatalf("node record %v: want manual startup and CHAP for user1", rec)
			}
			if err := in.Logout(ctxT(t), Target{Portal: tc.portal, IQN: tIQN}); err != nil {
				t.Fatal(err)
			}
			if n := f.nodes(); len(n) != 0 {
				t.Fatalf("node records with the secret left after the last logout: %v", n)
			}
		})
	}
}

func TestNodeRecordsFindsOnlyThisPortal(t *testing.T) {
	db := t.TempDir()
	iqn := "iqn.2024-01.dev.wasmcsi:t"
	mk := func(rel string) string {
		p := filepath.Join(db, iqn, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("# BEGIN RECORD 2.1.8\n# END RECORD\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	want := []string{
		mk("10.0.0.1,3260"),
		mk("10.0.0.1,3260,1/default"),
		mk("10.0.0.1,3260,1/eth1"),
		mk("10.0.0.1,3260,-1/default"),
	}
	for _, other := range []string{"10.0.0.10,3260", "10.0.0.1,32600", "10.0.0.1,32600,1/default",
		"10.0.0.1,3260,x/default", "10.0.0.1,3260,1/.default.tmp-1", "fd00::1,3260"} {
		mk(other)
	}
	k := sessionKey{Portal: mustPortal(t, "10.0.0.1"), IQN: iqn}
	got, err := nodeRecords([]string{filepath.Join(db, "missing"), db}, k)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	k6 := sessionKey{Portal: mustPortal(t, "[fd00::1]"), IQN: iqn}
	if got, err := nodeRecords([]string{db}, k6); err != nil || len(got) != 1 || filepath.Base(got[0]) != "fd00::1,3260" {
		t.Fatalf("IPv6 records %v, %v: want fd00::1,3260", got, err)
	}
}

func mustPortal(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := ParsePortal(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

func TestUpdateRecordSetsAuthLinesAtomically(t *testing.T) {
	p := filepath.Join(t.TempDir(), "10.0.0.1,3260")
	old := "# BEGIN RECORD 2.1.8\n" +
		"node.name = iqn.2024-01.dev.wasmcsi:t\n" +
		"node.session.auth.authmethod = None\n" +
		"node.session.auth.username_in = them\n" +
		"node.session.auth.password_in = their-secret-1\n" +
		"node.session.auth.chap_algs = MD5\n" +
		"node.conn[0].port = 3260\n" +
		"# END RECORD\n"
	if err := os.WriteFile(p, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := updateRecord(p, filepath.Dir(p), chapSettings(&CHAP{User: "user1", Secret: "secret123456"})); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	want := "# BEGIN RECORD 2.1.8\n" +
		"node.name = iqn.2024-01.dev.wasmcsi:t\n" +
		"node.session.auth.authmethod = CHAP\n" +
		"node.session.auth.chap_algs = MD5\n" +
		"node.conn[0].port = 3260\n" +
		"node.session.auth.username = user1\n" +
		"node.session.auth.password = secret123456\n" +
		"# END RECORD\n"
	if string(b) != want {
		t.Fatalf("record:\n%s\nwant:\n%s", b, want)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("record mode %v, want 0600", st.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".*")); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
	// A second update replaces, never repeats, the lines.
	if err := updateRecord(p, filepath.Dir(p), chapSettings(&CHAP{User: "user2", Secret: "secret654321"})); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(p)
	if n := strings.Count(string(b), "node.session.auth.password = "); n != 1 || !strings.Contains(string(b), "= secret654321\n") {
		t.Fatalf("after a second update:\n%s", b)
	}
}

// TestRecordTempFileOutsideNodeDB: the temp file that holds a new record,
// secret included, until the rename is made next to the node database,
// never in a target or portal folder, where open-iscsi would read a file
// a crash left behind as a record of its own; and a first CHAP login
// removes such leftovers, this package's and the ones earlier versions
// made next to the record.
func TestRecordTempFileOutsideNodeDB(t *testing.T) {
	chap := &CHAP{User: "user1", Secret: "secret123456"}
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}, CHAP: chap})
	w := f.world()
	w.TPGT = 1
	f.save(w)
	db := f.opts.NodeDB
	portalDir := filepath.Dir(fakeRecordPath(f.dir, tIQN, tPortal, 1))
	var stale []string
	for _, p := range []string{
		filepath.Join(filepath.Dir(db), ".wasmcsi-node-record.tmp-1"),
		filepath.Join(portalDir, ".default.tmp-2"),
		filepath.Join(db, tIQN, ".127.0.0.1,3260.tmp-3"),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("node.session.auth.password = old-secret-1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		stale = append(stale, p)
	}
	var tmps []string
	testHookBeforeRename = func(tmp string) { tmps = append(tmps, tmp) }
	t.Cleanup(func() { testHookBeforeRename = nil })

	in := f.initiator(t.TempDir())
	if _, err := in.Login(ctxT(t), Target{Portal: tPortal, IQN: tIQN, CHAP: chap}); err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, tmp := range tmps {
		if rel, err := filepath.Rel(db, tmp); err != nil || !strings.HasPrefix(rel, "..") {
			t.Errorf("temp file %s inside the node database %s", tmp, db)
		}
		if strings.HasPrefix(filepath.Base(tmp), ".wasmcsi-node-record.tmp-") {
			records++
		}
	}
	if records != 1 {
		t.Fatalf("temp files %v: want one for the record", tmps)
	}
	for _, p := range stale {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("stale temp file %s left after the first CHAP login", p)
		}
	}
	if err := in.Logout(ctxT(t), Target{Portal: tPortal, IQN: tIQN}); err != nil {
		t.Fatal(err)
	}
}

// TestCHAPOnlyInTheDatabaseIscsiadmUses: of two node databases that both
// hold a record of the target (a stale one in the database iscsiadm does
// not use), only the one iscsiadm made its record in gets the secret; a
// copy in the other would stay there after the last logout.
func TestCHAPOnlyInTheDatabaseIscsiadmUses(t *testing.T) {
	chap := &CHAP{User: "user1", Secret: "secret123456"}
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}, CHAP: chap})
	other := filepath.Join(t.TempDir(), "nodes")
	staleRec := filepath.Join(other, tIQN, "127.0.0.1,3260")
	if err := os.MkdirAll(filepath.Dir(staleRec), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(staleRec, []byte("# BEGIN RECORD 2.1.8\nnode.session.auth.authmethod = None\n# END RECORD\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, order := range [][]string{{other, f.opts.NodeDB}, {f.opts.NodeDB, other}} {
		in := f.initiator(t.TempDir())
		in.nodeDBs = order
		if _, err := in.Login(ctxT(t), Target{Portal: tPortal, IQN: tIQN, CHAP: chap}); err != nil {
			t.Fatal(err)
		}
		if rec := f.nodes()[tIQN+"|"+tPortal]; rec[authPassword] != chap.Secret {
			t.Fatalf("record iscsiadm uses: %v, want the secret", rec)
		}
		if b, err := os.ReadFile(staleRec); err != nil || strings.Contains(string(b), chap.Secret) {
			t.Fatalf("record in the database iscsiadm does not use (%v):\n%s", err, b)
		}
		if err := in.Logout(ctxT(t), Target{Portal: tPortal, IQN: tIQN}); err != nil {
			t.Fatal(err)
		}
	}
}
