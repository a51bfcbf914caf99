package iscsi_test

// End-to-end tests of the initiator against the kernel's LIO target on
// loopback (portal 127.0.0.1:3260), set up with hostcalls/lio. They need
// root, the iSCSI and LIO modules and a running iscsid, which the VM tier
// (.ci/vm/test.sh) provides; elsewhere they skip with the reason.

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/iscsi"
	"github.com/wasmcsi/wasmcsi/hostcalls/lio"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
)

const (
	vmPrefix = "iqn.2024-01.dev.wasmcsi:vmtest."
	vmNames  = "wcsivm-"
	vmPortal = "127.0.0.1:3260"
)

// rig is one test's target side and initiator.
type rig struct {
	t         *testing.T
	lio       *lio.Configfs
	in        *iscsi.Initiator
	state     string
	initiator string // this node's initiator name
}

// newRig skips unless the VM tier's kernel and iscsid are here, and returns
// a LIO handle and an Initiator whose objects and sessions are all removed
// when t ends.
func newRig(t *testing.T) *rig {
	t.Helper()
	vmtest.Require(t, "iscsi_tcp", "sd_mod", "loop", "configfs", "target_core_mod", "iscsi_target_mod",
		"target_core_file", "target_core_iblock")
	if _, err := os.Stat(filepath.Join(lio.DefaultRoot, "core")); err != nil {
		t.Skipf("needs configfs mounted with LIO at %s: %v", lio.DefaultRoot, err)
	}
	requireIscsid(t)
	l, err := lio.New(lio.Config{IQNPrefix: vmPrefix, NamePrefix: vmNames})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, lio: l, state: t.TempDir()}
	r.in = r.initiatorAt(r.state)
	if r.initiator, err = r.in.InitiatorName(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.cleanup)
	return r
}

func (r *rig) initiatorAt(state string) *iscsi.Initiator {
	in, err := iscsi.New(state, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return in
}

// cleanup logs out every session to a test target and deletes the targets
// and backstores, also after a failure.
func (r *rig) cleanup() {
	ctx := context.Background()
	ss, _ := r.in.Sessions(ctx)
	for _, s := range ss {
		if strings.HasPrefix(s.IQN, vmPrefix) {
			exec.Command("iscsiadm", "-m", "session", "-r", itoa(s.ID), "-u").Run()
			exec.Command("iscsiadm", "-m", "node", "-T", s.IQN, "-o", "delete").Run()
		}
	}
	ents, _ := os.ReadDir(filepath.Join(lio.DefaultRoot, "iscsi"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), vmPrefix) {
			if err := r.lio.DeleteTarget(ctx, e.Name()); err != nil {
				r.t.Errorf("cleanup: %v", err)
			}
		}
	}
	for _, k := range []lio.Kind{lio.Block, lio.FileIO} {
		hba := map[lio.Kind]string{lio.Block: "iblock_0", lio.FileIO: "fileio_0"}[k]
		ents, _ := os.ReadDir(filepath.Join(lio.DefaultRoot, "core", hba))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), vmNames) {
				if err := r.lio.DeleteBackstore(ctx, k, e.Name()); err != nil {
					r.t.Errorf("cleanup: %v", err)
				}
			}
		}
	}
}

// requireIscsid makes sure iscsid answers, starting one for the test when
// none runs (the tier starts one; a bare guest may not).
func requireIscsid(t *testing.T) {
	t.Helper()
	if iscsidUp() {
		return
	}
	if _, err := exec.LookPath("iscsid"); err != nil {
		t.Skipf("needs open-iscsi's iscsid: %v", err)
	}
	cmd := exec.Command("iscsid", "-f")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // iscsid signals its process group
	if err := cmd.Start(); err != nil {
		t.Fatalf("start iscsid: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for range 100 {
		if iscsidUp() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("iscsid started but does not answer")
}

func iscsidUp() bool {
	c, err := net.Dial("unix", "@ISCSIADM_ABSTRACT_NAMESPACE")
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// fileLUN creates a LUN served from a new sparse file and returns the file.
func (r *rig) fileLUN(target string, lun int, size int64) string {
	r.t.Helper()
	file := sparse(r.t, size)
	spec := lio.LUN{Target: target, LUN: lun, Portals: []string{vmPortal},
		Backstore: lio.Backstore{Kind: lio.FileIO, Name: vmNames + lastPart(target) + "-" + itoa(lun), Path: file}}
	start := time.Now()
	if err := r.lio.CreateLUN(context.Background(), spec); err != nil {
		r.t.Fatal(err)
	}
	r.t.Logf("MEASURE lio LUN create (fileio %d MiB): %v", size>>20, time.Since(start))
	return file
}

// blockLUN creates a LUN served from a loop device over a new sparse file
// and returns the file and the device.
func (r *rig) blockLUN(target string, lun int, size int64) (string, string) {
	r.t.Helper()
	file := sparse(r.t, size)
	d, err := loop.Attach(context.Background(), file, loop.Options{})
	if err != nil {
		r.t.Fatal(err)
	}
	// Cleanups run last-registered first, so this one runs before the
	// rig's: it removes the backstore (LIO holds the device) and detaches.
	r.t.Cleanup(func() {
		r.cleanup()
		if err := loop.Detach(context.Background(), d.Path); err != nil {
			r.t.Errorf("detach %s: %v", d.Path, err)
		}
	})
	spec := lio.LUN{Target: target, LUN: lun, Portals: []string{vmPortal},
		Backstore: lio.Backstore{Kind: lio.Block, Name: vmNames + lastPart(target) + "-" + itoa(lun), Path: d.Path}}
	start := time.Now()
	if err := r.lio.CreateLUN(context.Background(), spec); err != nil {
		r.t.Fatal(err)
	}
	r.t.Logf("MEASURE lio LUN create (block %d MiB): %v", size>>20, time.Since(start))
	return file, d.Path
}

func (r *rig) grant(target string, lun int, chap *iscsi.CHAP) {
	r.t.Helper()
	if err := r.lio.Grant(context.Background(), target, lun, r.initiator, chap); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) login(tg iscsi.Target) string {
	r.t.Helper()
	start := time.Now()
	dev, err := r.in.Login(context.Background(), tg)
	if err != nil {
		r.t.Fatalf("login %s LUN %d: %v", tg.IQN, tg.LUN, err)
	}
	r.t.Logf("MEASURE login to device ready (LUN %d): %v -> %s", tg.LUN, time.Since(start), dev)
	return dev
}

func (r *rig) logout(tg iscsi.Target) {
	r.t.Helper()
	start := time.Now()
	if err := r.in.Logout(context.Background(), tg); err != nil {
		r.t.Fatalf("logout %s LUN %d: %v", tg.IQN, tg.LUN, err)
	}
	r.t.Logf("MEASURE logout (LUN %d): %v", tg.LUN, time.Since(start))
}

// sessionsTo returns the sessions to target.
func (r *rig) sessionsTo(target string) []iscsi.Session {
	r.t.Helper()
	ss, err := r.in.Sessions(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	return slices.DeleteFunc(ss, func(s iscsi.Session) bool { return s.IQN != target })
}

// writeAndVerify writes random data through dev at off, syncs, and checks
// that the bytes reached backing (the file behind the LUN) and read back
// through dev after its cache is dropped.
func writeAndVerify(t *testing.T, dev, backing string, off int64) {
	t.Helper()
	data := make([]byte, 1<<20)
	rand.Read(data)
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("write %s: %v", dev, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync %s: %v", dev, err)
	}
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0); err != nil {
		t.Fatalf("drop cache of %s: %v", dev, err)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%s read back other bytes than written", dev)
	}
	b, err := os.Open(backing)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.ReadAt(got, off); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("the bytes written to %s did not reach %s", dev, backing)
	}
}

func TestVMLoginWriteReadLogout(t *testing.T) {
	for _, kind := range []lio.Kind{lio.FileIO, lio.Block} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t)
			target := vmPrefix + "rw-" + string(kind)
			var backing string
			if kind == lio.Block {
				backing, _ = r.blockLUN(target, 0, 64<<20)
			} else {
				backing = r.fileLUN(target, 0, 64<<20)
			}
			r.grant(target, 0, nil)
			tg := iscsi.Target{Portal: vmPortal, IQN: target, LUN: 0}
			dev := r.login(tg)
			writeAndVerify(t, dev, backing, 5<<20)
			if dev2 := r.login(tg); dev2 != dev {
				t.Fatalf("repeated login returned %s, first %s", dev2, dev)
			}
			r.logout(tg)
			if _, err := os.Stat(dev); !os.IsNotExist(err) {
				t.Fatalf("%s still exists after logout: %v", dev, err)
			}
			if ss := r.sessionsTo(target); len(ss) != 0 {
				t.Fatalf("sessions after the last logout: %+v", ss)
			}
			r.logout(tg) // idempotent
		})
	}
}

func TestVMTwoLUNsShareOneSession(t *testing.T) {
	r := newRig(t)
	target := vmPrefix + "shared"
	f0 := r.fileLUN(target, 0, 16<<20)
	f1 := r.fileLUN(target, 1, 16<<20)
	r.grant(target, 0, nil)
	r.grant(target, 1, nil)
	t0 := iscsi.Target{Portal: vmPortal, IQN: target, LUN: 0}
	t1 := iscsi.Target{Portal: vmPortal, IQN: target, LUN: 1}
	r.login(t0)
	d1 := r.login(t1)
	ss := r.sessionsTo(target)
	if len(ss) != 1 || !slices.Equal(ss[0].Users, []int{0, 1}) {
		t.Fatalf("sessions %+v: want one session used by LUNs 0 and 1", ss)
	}
	sid := ss[0].ID

	r.logout(t0)
	ss = r.sessionsTo(target)
	if len(ss) != 1 || ss[0].ID != sid {
		t.Fatalf("logout of LUN 0 ended the shared session: %+v", ss)
	}
	if _, ok := ss[0].Devices[0]; ok {
		t.Fatalf("LUN 0's device survived its logout: %+v", ss[0].Devices)
	}
	writeAndVerify(t, d1, f1, 1<<20) // LUN 1 still works

	// LUN 0 comes back on the same session by a probe of just that LUN.
	if d := r.login(t0); d == "" {
		t.Fatal("no device")
	} else {
		writeAndVerify(t, d, f0, 0)
	}
	if ss = r.sessionsTo(target); len(ss) != 1 || ss[0].ID != sid || len(ss[0].Devices) != 2 {
		t.Fatalf("re-login of LUN 0: %+v, want session %d with two devices", ss, sid)
	}

	// A restarted daemon still knows both users.
	r.in = r.initiatorAt(r.state)
	r.logout(t0)
	if len(r.sessionsTo(target)) != 1 {
		t.Fatal("restarted initiator ended the session LUN 1 still uses")
	}
	r.logout(t1)
	if ss := r.sessionsTo(target); len(ss) != 0 {
		t.Fatalf("sessions after the last logout: %+v", ss)
	}
}

func TestVMOnlyGrantedInitiatorsSeeLUNs(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	target := vmPrefix + "acl"
	r.fileLUN(target, 0, 8<<20)
	r.fileLUN(target, 1, 8<<20)
	t0 := iscsi.Target{Portal: vmPortal, IQN: target, LUN: 0}
	t1 := iscsi.Target{Portal: vmPortal, IQN: target, LUN: 1}

	// No ACL: login refused.
	if _, err := r.in.Login(ctx, t0); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("login without a grant = %v, want PERMISSION_DENIED", err)
	}
	if len(r.sessionsTo(target)) != 0 {
		t.Fatal("a refused login left a session")
	}

	// Granted LUN 0 only: LUN 0 usable, LUN 1 not presented.
	r.grant(target, 0, nil)
	r.login(t0)
	start := time.Now()
	if _, err := r.in.Login(ctx, t1); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("login of an ungranted LUN = %v, want NOT_FOUND", err)
	}
	t.Logf("MEASURE refusal of an ungranted LUN on a live session: %v", time.Since(start))
	if ss := r.sessionsTo(target); len(ss) != 1 || !slices.Equal(ss[0].Users, []int{0}) {
		t.Fatalf("after the refused LUN: %+v, want the session kept for LUN 0", ss)
	}
	r.logout(t0)
}

func TestVMCHAP(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	target := vmPrefix + "chap"
	r.fileLUN(target, 0, 8<<20)
	chap := &iscsi.CHAP{User: "wasmcsi-node", Secret: "right-secret-123"}
	r.grant(target, 0, chap)
	// Run iscsiadm through a wrapper that logs each command line, as any
	// local user could read it in /proc/<pid>/cmdline.
	argvLog := filepath.Join(t.TempDir(), "argv.log")
	wrapper := filepath.Join(t.TempDir(), "iscsiadm")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nprintf '%s\\n' \"$*\" >>"+argvLog+"\nexec iscsiadm \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := iscsi.New(t.TempDir(), &iscsi.Options{Iscsiadm: wrapper})
	if err != nil {
		t.Fatal(err)
	}
	records := func() []string {
		var recs []string
		filepath.WalkDir(filepath.Join("/etc/iscsi/nodes", target), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				recs = append(recs, p)
			}
			return nil
		})
		return recs
	}
	tests := []struct {
		name string
		chap *iscsi.CHAP
		code abi.Code
	}{
		{"none", nil, abi.PermissionDenied},
		{"wrong secret", &iscsi.CHAP{User: chap.User, Secret: "wrong-secret-123"}, abi.PermissionDenied},
		{"wrong user", &iscsi.CHAP{User: "someone", Secret: chap.Secret}, abi.PermissionDenied},
		{"right", chap, abi.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tg := iscsi.Target{Portal: vmPortal, IQN: target, CHAP: tc.chap}
			_, err := in.Login(ctx, tg)
			if abi.CodeOf(err) == abi.OK {
				defer in.Logout(ctx, tg)
			}
			argv, rerr := os.ReadFile(argvLog)
			if rerr != nil {
				t.Fatalf("no iscsiadm run logged: %v", rerr)
			}
			if bytes.Contains(argv, []byte("secret-123")) || bytes.Contains(argv, []byte("password")) {
				t.Fatalf("an iscsiadm command line carries a CHAP secret:\n%s", argv)
			}
			if abi.CodeOf(err) != tc.code {
				t.Fatalf("login = %v, want %v", err, tc.code)
			}
			if err != nil && strings.Contains(err.Error(), "secret-123") {
				t.Fatalf("error %q leaks a secret", err)
			}
			if tc.code != abi.OK {
				if len(r.sessionsTo(target)) != 0 {
					t.Fatal("a refused login left a session")
				}
				return
			}
			// The secret reached iscsid through the record file alone.
			recs := records()
			if len(recs) == 0 {
				t.Fatal("logged in with no node record on disk")
			}
			for _, p := range recs {
				st, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if st.Mode().Perm() != 0o600 || !bytes.Contains(b, []byte("\nnode.session.auth.password = "+chap.Secret+"\n")) {
					t.Fatalf("record %s (mode %v) lacks the secret or is not 0600:\n%s", p, st.Mode().Perm(), b)
				}
			}
			if err := in.Logout(ctx, tg); err != nil {
				t.Fatalf("logout: %v", err)
			}
			if recs := records(); len(recs) != 0 {
				t.Fatalf("node records with the secret left after logout: %v", recs)
			}
		})
	}
}

func TestVMRescanAfterGrowth(t *testing.T) {
	for _, kind := range []lio.Kind{lio.Block, lio.FileIO} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t)
			ctx := context.Background()
			target := vmPrefix + "grow-" + string(kind)
			var file, loopDev string
			if kind == lio.Block {
				file, loopDev = r.blockLUN(target, 0, 32<<20)
			} else {
				file = r.fileLUN(target, 0, 32<<20)
			}
			r.grant(target, 0, nil)
			tg := iscsi.Target{Portal: vmPortal, IQN: target}
			r.login(tg)
			if size, err := r.in.Rescan(ctx, tg); err != nil || size != 32<<20 {
				t.Fatalf("Rescan before growth = %d, %v; want %d", size, err, 32<<20)
			}
			if err := os.Truncate(file, 48<<20); err != nil {
				t.Fatal(err)
			}
			if kind == lio.Block {
				if _, err := loop.Resize(ctx, loopDev); err != nil {
					t.Fatal(err)
				}
			} else if err := r.lio.ResizeFileIO(ctx, vmNames+lastPart(target)+"-0", 48<<20); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			size, err := r.in.Rescan(ctx, tg)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("MEASURE rescan: %v", time.Since(start))
			if size != 48<<20 {
				t.Fatalf("Rescan after growth = %d, want %d", size, 48<<20)
			}
			r.logout(tg)
		})
	}
}

func TestVMCleanupEndsOrphanedSession(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	target := vmPrefix + "orphan"
	r.fileLUN(target, 0, 8<<20)
	r.grant(target, 0, nil)
	dev := r.login(iscsi.Target{Portal: vmPortal, IQN: target})
	// A crash after the device was deleted, with the user record lost.
	if err := os.WriteFile(filepath.Join("/sys/class/block", filepath.Base(dev), "device", "delete"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	fresh := r.initiatorAt(t.TempDir())
	done, err := fresh.Cleanup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(done, func(s iscsi.Session) bool { return s.IQN == target }) {
		t.Fatalf("Cleanup logged out %+v, want the orphaned session to %s", done, target)
	}
	if len(r.sessionsTo(target)) != 0 {
		t.Fatal("orphaned session still there")
	}
}

func sparse(t *testing.T, size int64) string {
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

func lastPart(iqn string) string { return iqn[strings.LastIndexAny(iqn, ":.")+1:] }

func itoa(i int) string { return strconv.Itoa(i) }
