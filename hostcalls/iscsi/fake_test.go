package iscsi

// A stand-in for iscsiadm and the kernel, so that the session-sharing logic
// runs on any machine: the test binary re-executes itself as "iscsiadm"
// (TestMain dispatches on fakeDirEnv) and fakes what open-iscsi and the
// kernel would do: node records as files, sessions and SCSI devices as
// a sysfs-shaped tree, block devices as plain files.
// Node records are files in open-iscsi's layout and format under nodes/,
// because the initiator writes CHAP credentials into them directly; the
// fake refuses a secret on its command line. The real thing runs in
// iscsi_vm_test.go.

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const fakeDirEnv = "WASMCSI_FAKE_ISCSIADM_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(fakeDirEnv); dir != "" {
		os.Exit(fakeIscsiadm(dir, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeTarget is a target the fake world serves.
type fakeTarget struct {
	IQN     string `json:"iqn"`
	Portal  string `json:"portal"` // canonical addr:port
	LUNs    []int  `json:"luns"`   // LUNs presented to the initiator
	Denied  bool   `json:"denied"` // no ACL for the initiator
	CHAP    *CHAP  `json:"chap"`   // required credentials, if any
	Sectors int64  `json:"sectors"`
}

// fakeWorld is the fake's whole state, kept in world.json.
type fakeWorld struct {
	Targets []fakeTarget `json:"targets"`
	// TPGT, when not 0, makes "-o new" write the record in the layout
	// discovery uses (<iqn>/<addr>,<port>,<tpgt>/default) instead of the
	// flat one (<iqn>/<addr>,<port>).
	TPGT     int            `json:"tpgt"`
	Sessions map[int]string `json:"sessions"`
	NextID   int            `json:"next_id"`
	NextDisk int            `json:"next_disk"`
	Calls    []string       `json:"calls"` // "mode op"
	// Argv is every command line the fake was run with, as another user
	// could read it in /proc/<pid>/cmdline.
	Argv [][]string `json:"argv"`
}

// fake is the test side of the fake world.
type fake struct {
	t    *testing.T
	dir  string
	opts Options
}

func newFake(t *testing.T, targets ...fakeTarget) *fake {
	t.Helper()
	dir := t.TempDir()
	f := &fake{t: t, dir: dir}
	f.save(fakeWorld{Targets: targets, Sessions: map[int]string{}, NextID: 1})
	for _, d := range []string{"nodes", "sys/class/iscsi_session", "sys/class/iscsi_connection", "sys/class/scsi_host", "sys/class/block", "sys/devices/platform", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeDirEnv, dir)
	f.opts = Options{
		Iscsiadm:          exe,
		Sysfs:             filepath.Join(dir, "sys"),
		Dev:               filepath.Join(dir, "dev"),
		UdevControl:       filepath.Join(dir, "no-udev"),
		InitiatorNameFile: filepath.Join(dir, "initiatorname.iscsi"),
		NodeDB:            filepath.Join(dir, "nodes"),
		DeviceTimeout:     3 * time.Second,
	}
	return f
}

// initiator returns an Initiator on the fake world with its state in stateDir.
func (f *fake) initiator(stateDir string) *Initiator {
	f.t.Helper()
	o := f.opts
	in, err := New(stateDir, &o)
	if err != nil {
		f.t.Fatal(err)
	}
	return in
}

func (f *fake) world() fakeWorld { return loadWorld(f.dir) }
func (f *fake) save(w fakeWorld) { saveWorld(f.dir, w) }

func loadWorld(dir string) fakeWorld {
	b, err := os.ReadFile(filepath.Join(dir, "world.json"))
	if err != nil {
		panic(err)
	}
	var w fakeWorld
	if err := json.Unmarshal(b, &w); err != nil {
		panic(err)
	}
	return w
}

func saveWorld(dir string, w fakeWorld) {
	b, err := json.MarshalIndent(w, "", " ")
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "world.json"), b, 0o600); err != nil {
		panic(err)
	}
}

// fakeIscsiadm is main() of the fake iscsiadm. It supports the commands
// this package runs, with open-iscsi's exit codes.
func fakeIscsiadm(dir string, args []string) int {
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w := loadWorld(dir)
	defer func() { saveWorld(dir, w) }()

	var mode, iqn, portal, op, sid string
	var login, logout bool
	var names, values []string
	for i := 0; i < len(args); i++ {
		next := func() string { i++; return args[i] }
		switch args[i] {
		case "-m":
			mode = next()
		case "-T":
			iqn = next()
		case "-p":
			portal = next()
		case "-o":
			op = next()
		case "-r":
			sid = next()
		case "-n":
			names = append(names, next())
		case "-v":
			values = append(values, next())
		case "--login":
			login = true
		case "-u":
			logout = true
		default:
			fmt.Fprintf(os.Stderr, "iscsiadm: fake: unknown argument %q\n", args[i])
			return admInval
		}
	}
	verb := op
	if login {
		verb = "login"
	} else if logout {
		verb = "logout"
	}
	w.Calls = append(w.Calls, mode+" "+verb)
	w.Argv = append(w.Argv, append([]string{filepath.Base(os.Args[0])}, args...))
	sys := filepath.Join(dir, "sys")
	key := iqn + "|" + portal
	for _, n := range names {
		if n == "node.session.auth.password" || n == "node.session.auth.password_in" {
			fmt.Fprintf(os.Stderr, "iscsiadm: fake: secret %s on the command line\n", n)
			return admInval
		}
	}
	var recPath string
	if mode == "node" && iqn != "" && portal != "" {
		recPath = fakeRecordPath(dir, iqn, portal, w.TPGT)
	}

	switch {
	case mode == "node" && op == "new":
		fakeWriteRecord(recPath, map[string]string{"node.name": iqn, "node.startup": "automatic",
			"node.session.auth.authmethod": "None"})
		return 0
	case mode == "node" && op == "update":
		rec, ok := fakeReadRecord(recPath)
		if !ok || len(names) != len(values) {
			fmt.Fprintln(os.Stderr, "iscsiadm: No records found")
			return admNoObjsFound
		}
		for i := range names {
			rec[names[i]] = values[i]
		}
		fakeWriteRecord(recPath, rec)
		return 0
	case mode == "node" && op == "delete":
		if _, ok := fakeReadRecord(recPath); !ok {
			fmt.Fprintln(os.Stderr, "iscsiadm: No records found")
			return admNoObjsFound
		}
		gone := recPath
		if w.TPGT != 0 {
			gone = filepath.Dir(recPath)
		}
		if err := os.RemoveAll(gone); err != nil {
			panic(err)
		}
		return 0
	case mode == "node" && login:
		rec, ok := fakeReadRecord(recPath)
		if !ok {
			fmt.Fprintln(os.Stderr, "iscsiadm: No records found")
			return admNoObjsFound
		}
		for _, s := range w.Sessions {
			if s == key {
				fmt.Fprintln(os.Stderr, "iscsiadm: default: 1 session requested, but 1 already present.")
				return admSessExists
			}
		}
		i := slices.IndexFunc(w.Targets, func(t fakeTarget) bool { return t.IQN == iqn && t.Portal == portal })
		if i < 0 {
			fmt.Fprintln(os.Stderr, "iscsiadm: initiator reported error (8 - connection timed out)")
			return admTransTimeout
		}
		t := w.Targets[i]
		if t.Denied || (t.CHAP != nil && (rec["node.session.auth.authmethod"] != "CHAP" ||
			rec["node.session.auth.username"] != t.CHAP.User || rec["node.session.auth.password"] != t.CHAP.Secret)) {
			fmt.Fprintln(os.Stderr, "iscsiadm: initiator reported error (24 - iSCSI login failed due to authorization failure)")
			return admAuthFailed
		}
		id := w.NextID
		w.NextID++
		w.Sessions[id] = key
		fakeMakeSession(&w, sys, filepath.Join(dir, "dev"), id, t)
		fmt.Printf("Login to [iface: default, target: %s, portal: %s] successful.\n", iqn, portal)
		return 0
	case mode == "session" && logout:
		id, _ := strconv.Atoi(sid)
		if _, ok := w.Sessions[id]; !ok {
			fmt.Fprintln(os.Stderr, "iscsiadm: Could not get session info for sid "+sid)
			return admSysfsLookup
		}
		delete(w.Sessions, id)
		fakeRemoveSession(sys, filepath.Join(dir, "dev"), id)
		return 0
	}
	fmt.Fprintf(os.Stderr, "iscsiadm: fake: unsupported command %q\n", args)
	return admInval
}

func fakeMakeSession(w *fakeWorld, sys, dev string, id int, t fakeTarget) {
	n := strconv.Itoa(id)
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	write := func(path, v string) {
		must(os.MkdirAll(filepath.Dir(path), 0o755))
		must(os.WriteFile(path, []byte(v+"\n"), 0o644))
	}
	ap := netip.MustParseAddrPort(t.Portal)
	addr, port := ap.Addr().String(), strconv.Itoa(int(ap.Port()))
	host := filepath.Join(sys, "devices", "platform", "host"+n)
	sess := filepath.Join(host, "session"+n)
	cls := filepath.Join(sys, "class", "iscsi_session", "session"+n)
	write(filepath.Join(cls, "targetname"), t.IQN)
	write(filepath.Join(cls, "state"), "LOGGED_IN")
	write(filepath.Join(cls, "target_state"), "SCANNED")
	write(filepath.Join(cls, "target_id"), "0")
	conn := filepath.Join(sys, "class", "iscsi_connection", "connection"+n+":0")
	write(filepath.Join(conn, "persistent_address"), addr)
	write(filepath.Join(conn, "persistent_port"), port)
	write(filepath.Join(sys, "class", "scsi_host", "host"+n, "scan"), "")
	sectors := t.Sectors
	if sectors == 0 {
		sectors = 131072
	}
	for _, l := range t.LUNs {
		name := "sd" + string(rune('a'+w.NextDisk%26)) + strconv.Itoa(w.NextDisk/26)
		w.NextDisk++
		d := filepath.Join(sess, "target"+n+":0:0", n+":0:0:"+strconv.Itoa(l))
		write(filepath.Join(d, "delete"), "")
		write(filepath.Join(d, "rescan"), "")
		must(os.MkdirAll(filepath.Join(d, "block", name), 0o755))
		write(filepath.Join(sys, "class", "block", name, "size"), strconv.FormatInt(sectors, 10))
		write(filepath.Join(dev, name), "")
	}
	must(os.MkdirAll(sess, 0o755))
	must(os.Symlink(sess, filepath.Join(cls, "device")))
}

func fakeRemoveSession(sys, dev string, id int) {
	n := strconv.Itoa(id)
	host := filepath.Join(sys, "devices", "platform", "host"+n)
	blocks, _ := filepath.Glob(filepath.Join(host, "session"+n, "target*", "*", "block", "*"))
	for _, b := range blocks {
		os.RemoveAll(filepath.Join(sys, "class", "block", filepath.Base(b)))
		os.Remove(filepath.Join(dev, filepath.Base(b)))
	}
	os.RemoveAll(host)
	os.RemoveAll(filepath.Join(sys, "class", "iscsi_session", "session"+n))
	os.RemoveAll(filepath.Join(sys, "class", "iscsi_connection", "connection"+n+":0"))
	os.RemoveAll(filepath.Join(sys, "class", "scsi_host", "host"+n))
}

// fakeRecordPath is where open-iscsi keeps the node record of (iqn,
// portal): <iqn>/<addr>,<port> for a record made without a portal group
// tag, <iqn>/<addr>,<port>,<tpgt>/default otherwise.
func fakeRecordPath(dir, iqn, portal string, tpgt int) string {
	ap := netip.MustParseAddrPort(portal)
	base := ap.Addr().String() + "," + strconv.Itoa(int(ap.Port()))
	if tpgt != 0 {
		return filepath.Join(dir, "nodes", iqn, base+","+strconv.Itoa(tpgt), "default")
	}
	return filepath.Join(dir, "nodes", iqn, base)
}

// fakeReadRecord parses a node record file as iscsiadm does: "name = value"
// lines, "#" comments, the last of repeated names wins.
func fakeReadRecord(path string) (map[string]string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	rec := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if n, v, ok := strings.Cut(l, "="); ok {
			rec[strings.TrimSpace(n)] = strings.TrimSpace(v)
		}
	}
	return rec, true
}

// fakeWriteRecord writes a node record file in open-iscsi's format.
func fakeWriteRecord(path string, rec map[string]string) {
	var b strings.Builder
	b.WriteString("# BEGIN RECORD 2.1.8\n")
	for _, n := range slices.Sorted(maps.Keys(rec)) {
		b.WriteString(n + " = " + rec[n] + "\n")
	}
	b.WriteString("# END RECORD\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		panic(err)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		panic(err)
	}
}

// nodes returns every node record of the fake world by "iqn|portal".
func (f *fake) nodes() map[string]map[string]string {
	f.t.Helper()
	out := map[string]map[string]string{}
	err := filepath.WalkDir(filepath.Join(f.dir, "nodes"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rec, _ := fakeReadRecord(p)
		rel, _ := filepath.Rel(filepath.Join(f.dir, "nodes"), p)
		iqn, rest, _ := strings.Cut(rel, string(filepath.Separator))
		parts := strings.Split(strings.Split(rest, string(filepath.Separator))[0], ",")
		addr := netip.MustParseAddr(parts[0])
		port, _ := strconv.Atoi(parts[1])
		out[iqn+"|"+netip.AddrPortFrom(addr, uint16(port)).String()] = rec
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}
