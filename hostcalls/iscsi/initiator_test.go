package iscsi

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

const (
	tIQN    = "iqn.2024-01.dev.wasmcsi:shared"
	tPortal = "127.0.0.1:3260"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// sessionsOf returns the sessions the kernel (fake) shows.
func sessionsOf(t *testing.T, in *Initiator) []Session {
	t.Helper()
	s, err := in.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func countCalls(w fakeWorld, call string) int {
	n := 0
	for _, c := range w.Calls {
		if c == call {
			n++
		}
	}
	return n
}

func TestLoginSharesOneSessionAndLogsOutWithTheLastUser(t *testing.T) {
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0, 1}})
	in := f.initiator(t.TempDir())
	ctx := ctxT(t)

	dev0, err := in.Login(ctx, Target{Portal: "127.0.0.1", IQN: tIQN, LUN: 0})
	if err != nil {
		t.Fatal(err)
	}
	dev1, err := in.Login(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 1})
	if err != nil {
		t.Fatal(err)
	}
	if dev0 == dev1 || filepath.Dir(dev0) != f.opts.Dev {
		t.Fatalf("devices %q and %q: want two distinct devices under %s", dev0, dev1, f.opts.Dev)
	}
	w := f.world()
	if n := countCalls(w, "node login"); n != 1 {
		t.Fatalf("%d logins for two LUNs of one target, want 1 (calls %v)", n, w.Calls)
	}
	rec := f.nodes()[tIQN+"|"+tPortal]
	if rec["node.startup"] != "manual" || rec["node.session.auth.authmethod"] != "None" ||
		rec["node.session.initial_login_retry_max"] != "2" || rec["node.conn[0].timeo.login_timeout"] != "5" {
		t.Fatalf("node record %v: want manual startup, no auth, short login timeouts", rec)
	}
	ss := sessionsOf(t, in)
	if len(ss) != 1 || !slices.Equal(ss[0].Users, []int{0, 1}) || len(ss[0].Devices) != 2 {
		t.Fatalf("sessions %+v: want one session with users [0 1] and two devices", ss)
	}
	sid := ss[0].ID

	// The first logout deletes only LUN 0's device and keeps the session.
	if err := in.Logout(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 0}); err != nil {
		t.Fatal(err)
	}
	lun0Dir := filepath.Join(f.opts.Sysfs, "devices", "platform", "host1", "session1", "target1:0:0", "1:0:0:0")
	lun1Dir := filepath.Join(f.opts.Sysfs, "devices", "platform", "host1", "session1", "target1:0:0", "1:0:0:1")
	if got := readFile(t, filepath.Join(lun0Dir, "delete")); got != "1" {
		t.Fatalf("LUN 0 delete attribute = %q, want 1", got)
	}
	if got := readFile(t, filepath.Join(lun1Dir, "delete")); got != "" {
		t.Fatalf("LUN 1 delete attribute = %q, want untouched", got)
	}
	ss = sessionsOf(t, in)
	if len(ss) != 1 || ss[0].ID != sid || !slices.Equal(ss[0].Users, []int{1}) {
		t.Fatalf("after first logout: %+v, want session %d with users [1]", ss, sid)
	}
	if n := countCalls(f.world(), "session logout"); n != 0 {
		t.Fatalf("session logged out while LUN 1 still uses it")
	}

	// Logout is idempotent and still leaves the session to LUN 1.
	if err := in.Logout(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 0}); err != nil {
		t.Fatal(err)
	}
	if len(sessionsOf(t, in)) != 1 {
		t.Fatal("repeated logout of LUN 0 ended the session")
	}

	// The last user's logout ends the session and removes the node record.
	if err := in.Logout(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 1}); err != nil {
		t.Fatal(err)
	}
	if ss := sessionsOf(t, in); len(ss) != 0 {
		t.Fatalf("after last logout: sessions %+v, want none", ss)
	}
	w = f.world()
	if _, ok := f.nodes()[tIQN+"|"+tPortal]; ok {
		t.Fatal("node record left behind after the last logout")
	}
	if n := countCalls(w, "session logout"); n != 1 {
		t.Fatalf("%d session logouts, want 1", n)
	}
	if err := in.Logout(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 1}); err != nil {
		t.Fatalf("logout after the session ended: %v", err)
	}
}

func TestLoginIsIdempotent(t *testing.T) {
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{4}})
	in := f.initiator(t.TempDir())
	ctx := ctxT(t)
	tg := Target{Portal: tPortal, IQN: tIQN, LUN: 4}
	a, err := in.Login(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := in.Login(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("second login returned %q, first %q", b, a)
	}
	w := f.world()
	if countCalls(w, "node login") != 1 || countCalls(w, "node new") != 1 {
		t.Fatalf("calls %v: want one record creation and one login", w.Calls)
	}
	if got := in.users.get(mustKey(tPortal, tIQN)); !slices.Equal(got, []int{4}) {
		t.Fatalf("users %v, want [4]", got)
	}
}

func TestLoginFailures(t *testing.T) {
	chap := &CHAP{User: "user1", Secret: "secret123456"}
	tests := []struct {
		name   string
		target fakeTarget
		login  Target
		code   abi.Code
	}{
		{"unreachable portal", fakeTarget{IQN: tIQN, Portal: "192.0.2.1:3260", LUNs: []int{0}},
			Target{Portal: tPortal, IQN: tIQN}, abi.Unavailable},
		{"initiator not granted", fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}, Denied: true},
			Target{Portal: tPortal, IQN: tIQN}, abi.PermissionDenied},
		{"CHAP required, none given", fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}, CHAP: chap},
			Target{Portal: tPortal, IQN: tIQN}, abi.PermissionDenied},
		{"wrong CHAP secret", fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}, CHAP: chap},
			Target{Portal: tPortal, IQN: tIQN, CHAP: &CHAP{User: "user1", Secret: "wrong-secret-1"}}, abi.PermissionDenied},
		{"LUN not presented", fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}},
			Target{Portal: tPortal, IQN: tIQN, LUN: 5}, abi.NotFound},
		{"bad IQN", fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}},
			Target{Portal: tPortal, IQN: "iqn.bad"}, abi.InvalidArgument},
		{"host name portal", fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}},
			Target{Portal: "storage.example:3260", IQN: tIQN}, abi.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, tc.target)
			in := f.initiator(t.TempDir())
			start := time.Now()
			_, err := in.Login(ctxT(t), tc.login)
			if abi.CodeOf(err) != tc.code {
				t.Fatalf("Login = %v, want code %v", err, tc.code)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("failure took %v; a failed login must not wait out the device timeout", d)
			}
			if tc.login.CHAP != nil && strings.Contains(err.Error(), tc.login.CHAP.Secret) {
				t.Fatalf("error %q leaks the CHAP secret", err)
			}
			// Nothing is left behind: no user, no session, no node record.
			if ks := in.users.keys(); len(ks) != 0 {
				t.Fatalf("users left behind: %v", ks)
			}
			if ss := sessionsOf(t, in); len(ss) != 0 {
				t.Fatalf("sessions left behind: %+v", ss)
			}
			if n := f.nodes(); len(n) != 0 {
				t.Fatalf("node records left behind: %v", n)
			}
		})
	}
}

func TestLoginWithCHAP(t *testing.T) {
	chap := &CHAP{User: "user1", Secret: "secret123456"}
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}, CHAP: chap})
	in := f.initiator(t.TempDir())
	if _, err := in.Login(ctxT(t), Target{Portal: tPortal, IQN: tIQN, CHAP: chap}); err != nil {
		t.Fatal(err)
	}
	rec := f.nodes()[tIQN+"|"+tPortal]
	if rec["node.session.auth.authmethod"] != "CHAP" || rec["node.session.auth.username"] != "user1" {
		t.Fatalf("node record %v: want CHAP for user1", rec)
	}
	if err := in.Logout(ctxT(t), Target{Portal: tPortal, IQN: tIQN}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.nodes()[tIQN+"|"+tPortal]; ok {
		t.Fatal("node record with the CHAP secret left on disk after the last logout")
	}
}

func TestLoginOfMissingLUNKeepsSharedSession(t *testing.T) {
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}})
	in := f.initiator(t.TempDir())
	ctx := ctxT(t)
	if _, err := in.Login(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 0}); err != nil {
		t.Fatal(err)
	}
	_, err := in.Login(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 9})
	if abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("login of an absent LUN = %v, want NOT_FOUND", err)
	}
	scan := readFile(t, filepath.Join(f.opts.Sysfs, "class", "scsi_host", "host1", "scan"))
	if scan != "0 0 9" {
		t.Fatalf("host scan got %q, want a probe of exactly LUN 9 (\"0 0 9\")", scan)
	}
	ss := sessionsOf(t, in)
	if len(ss) != 1 || !slices.Equal(ss[0].Users, []int{0}) {
		t.Fatalf("sessions %+v: want the session kept for LUN 0 alone", ss)
	}
}

func TestUsersSurviveRestart(t *testing.T) {
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0, 1}})
	state := t.TempDir()
	ctx := ctxT(t)
	in := f.initiator(state)
	for _, l := range []int{0, 1} {
		if _, err := in.Login(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: l}); err != nil {
			t.Fatal(err)
		}
	}
	// A restarted daemon knows LUN 1 still uses the session.
	in2 := f.initiator(state)
	if err := in2.Logout(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 0}); err != nil {
		t.Fatal(err)
	}
	if ss := sessionsOf(t, in2); len(ss) != 1 {
		t.Fatalf("restarted initiator ended a session LUN 1 still uses: %+v", ss)
	}
	if err := in2.Logout(ctx, Target{Portal: tPortal, IQN: tIQN, LUN: 1}); err != nil {
		t.Fatal(err)
	}
	if ss := sessionsOf(t, in2); len(ss) != 0 {
		t.Fatalf("sessions %+v after the last logout, want none", ss)
	}
}

func TestCleanupLogsOutOnlyIdleSessionsWithoutDevices(t *testing.T) {
	const other = "iqn.2024-01.dev.wasmcsi:other"
	const third = "iqn.2024-01.dev.wasmcsi:third"
	f := newFake(t,
		fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}},
		fakeTarget{IQN: other, Portal: tPortal, LUNs: []int{0}},
		fakeTarget{IQN: third, Portal: tPortal, LUNs: []int{0}},
	)
	ctx := ctxT(t)
	old := f.initiator(t.TempDir()) // its records are "lost"
	for _, iqn := range []string{tIQN, other} {
		if _, err := old.Login(ctx, Target{Portal: tPortal, IQN: iqn}); err != nil {
			t.Fatal(err)
		}
	}
	in := f.initiator(t.TempDir())
	if _, err := in.Login(ctx, Target{Portal: tPortal, IQN: third}); err != nil {
		t.Fatal(err)
	}
	// tIQN's device is gone (a crash after deleting it); other's is not.
	blocks, _ := filepath.Glob(filepath.Join(f.opts.Sysfs, "devices", "platform", "host1", "session1", "*", "*", "block"))
	if len(blocks) != 1 {
		t.Fatalf("fake layout: %v", blocks)
	}
	if err := os.RemoveAll(blocks[0]); err != nil {
		t.Fatal(err)
	}
	done, err := in.Cleanup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0].IQN != tIQN {
		t.Fatalf("cleanup logged out %+v, want only %s", done, tIQN)
	}
	var left []string
	for _, s := range sessionsOf(t, in) {
		left = append(left, s.IQN)
	}
	slices.Sort(left)
	if want := []string{other, third}; !slices.Equal(left, want) {
		t.Fatalf("sessions left %v, want %v", left, want)
	}
}

func TestRescanReportsNewSize(t *testing.T) {
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{0}, Sectors: 2048})
	in := f.initiator(t.TempDir())
	ctx := ctxT(t)
	tg := Target{Portal: tPortal, IQN: tIQN}
	if _, err := in.Rescan(ctx, tg); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("rescan before login = %v, want NOT_FOUND", err)
	}
	dev, err := in.Login(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	// The "target" grows the LUN; the fake kernel reports it after a rescan.
	sizeFile := filepath.Join(f.opts.Sysfs, "class", "block", filepath.Base(dev), "size")
	if err := os.WriteFile(sizeFile, []byte("4096\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	size, err := in.Rescan(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	if size != 4096*512 {
		t.Fatalf("size %d, want %d", size, 4096*512)
	}
	rescan := filepath.Join(f.opts.Sysfs, "devices", "platform", "host1", "session1", "target1:0:0", "1:0:0:0", "rescan")
	if got := readFile(t, rescan); got != "1" {
		t.Fatalf("rescan attribute = %q, want 1", got)
	}
}

func TestInitiatorName(t *testing.T) {
	tests := []struct {
		name, body, want string
		code             abi.Code
	}{
		{"debian", "## DO NOT EDIT\nInitiatorName=iqn.1993-08.org.debian:01:abc123\n", "iqn.1993-08.org.debian:01:abc123", abi.OK},
		{"spaces", "  InitiatorName=iqn.1993-08.org.debian:01:abc  \n", "iqn.1993-08.org.debian:01:abc", abi.OK},
		{"commented", "#InitiatorName=iqn.1993-08.org.debian:01:abc\n", "", abi.FailedPrecondition},
		{"invalid", "InitiatorName=GenerateName=yes\n", "", abi.InvalidArgument},
		{"missing file", "", "", abi.FailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			if tc.body != "" {
				if err := os.WriteFile(f.opts.InitiatorNameFile, []byte(tc.body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := f.initiator(t.TempDir()).InitiatorName(context.Background())
			if abi.CodeOf(err) != tc.code || got != tc.want {
				t.Fatalf("InitiatorName = %q, %v; want %q, %v", got, err, tc.want, tc.code)
			}
		})
	}
}

func TestNewRejectsRelativeStateDir(t *testing.T) {
	if _, err := New("state", nil); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("New(relative) = %v, want INVALID_ARGUMENT", err)
	}
}

func TestRunner(t *testing.T) {
	ctx := context.Background()
	if _, err := (runner{prog: "sleep", timeout: 50 * time.Millisecond}).run(ctx, "sleep", "10"); abi.CodeOf(err) != abi.DeadlineExceeded {
		t.Fatalf("timeout: %v, want DEADLINE_EXCEEDED", err)
	}
	if _, err := (runner{prog: "/nonexistent/iscsiadm", timeout: time.Second}).run(ctx, "x"); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("missing program: %v, want FAILED_PRECONDITION", err)
	}
	_, err := (runner{prog: "sh", timeout: time.Second}).run(ctx, "x", "-c", "echo 'iscsiadm: No records found' >&2; exit 21")
	if abi.CodeOf(err) != abi.NotFound || exitCode(err) != 21 || !strings.Contains(err.Error(), "No records found") {
		t.Fatalf("exit 21: %v (exit %d), want NOT_FOUND with iscsiadm's message", err, exitCode(err))
	}
}

func TestCodeForExit(t *testing.T) {
	tests := []struct {
		exit int
		code abi.Code
	}{
		{admAuthFailed, abi.PermissionDenied},
		{admNoObjsFound, abi.NotFound},
		{admSessNotFound, abi.NotFound},
		{admSessExists, abi.AlreadyExists},
		{admTransTimeout, abi.Unavailable},
		{admIscsidNotConn, abi.Unavailable},
		{admFatalLogin, abi.FailedPrecondition},
		{admInval, abi.InvalidArgument},
		{1, abi.Internal},
		{99, abi.Internal},
	}
	for _, tc := range tests {
		if got := codeForExit(tc.exit); got != tc.code {
			t.Errorf("codeForExit(%d) = %v, want %v", tc.exit, got, tc.code)
		}
	}
}

func TestSummarize(t *testing.T) {
	out := "Logging in to [iface: default, ...]\niscsiadm: Could not login to [...].\niscsiadm: initiator reported error (24 - auth)\n"
	if got := summarize(out); got != "Could not login to [...].; initiator reported error (24 - auth)" {
		t.Fatalf("summarize = %q", got)
	}
	if got := summarize("just this\n"); got != "just this" {
		t.Fatalf("summarize = %q", got)
	}
}

// A device node that cannot be opened for want of its device (ENXIO, here
// a socket, which open(2) refuses the same way) is not live yet: waitDevice
// keeps waiting for it rather than handing a stage a node whose probe
// fails.
func TestLiveDevice(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "sda")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if live(sock) {
		t.Error("a node whose open fails with ENXIO counts as live")
	}
	if live(filepath.Join(dir, "sdb")) {
		t.Error("a missing node counts as live")
	}
	file := filepath.Join(dir, "sdc")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !live(file) {
		t.Error("an openable node does not count as live")
	}
}
