package iscsi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/sysattr"
)

// Options tune an Initiator. The zero value of every field picks the default
// documented on it.
type Options struct {
	// Iscsiadm is the iscsiadm program; default "iscsiadm" found in PATH.
	Iscsiadm string
	// CommandTimeout bounds one iscsiadm run; default 30 s. It must exceed
	// (LoginRetries+1) * LoginTimeout or a slow login is cut short.
	CommandTimeout time.Duration
	// LoginTimeout is node.conn[0].timeo.login_timeout; default 5 s.
	LoginTimeout time.Duration
	// LoginRetries is node.session.initial_login_retry_max; default 2.
	// open-iscsi's own default (8 retries of 15 s) keeps a login to an
	// unreachable portal busy for two minutes.
	LoginRetries int
	// DeviceTimeout bounds the wait for a LUN's block device after login;
	// default 30 s.
	DeviceTimeout time.Duration
	// ByPathWait bounds the extra wait for udev's /dev/disk/by-path link
	// once the kernel device exists; default 5 s. When udev does not make
	// the link in time the kernel name (/dev/sdX) is returned.
	ByPathWait time.Duration
	// Sysfs is where sysfs is mounted; default /sys.
	Sysfs string
	// Dev is where device nodes live; default /dev.
	Dev string
	// UdevControl exists while udev runs; default /run/udev/control.
	UdevControl string
	// InitiatorNameFile is open-iscsi's name file; default
	// /etc/iscsi/initiatorname.iscsi.
	InitiatorNameFile string
	// NodeDB is open-iscsi's node database folder, where CHAP credentials
	// are written; default: records are looked for in /etc/iscsi/nodes and
	// /var/lib/iscsi/nodes (where Debian and RHEL build open-iscsi to keep
	// them), and written in the one where iscsiadm made or changed them.
	// Temp files are made in its parent folder, which must be on the same
	// filesystem.
	NodeDB string
	// Log receives one line per login and logout; default slog.Default().
	Log *slog.Logger
}

func (o *Options) setDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defDur := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Iscsiadm, "iscsiadm")
	def(&o.Sysfs, "/sys")
	def(&o.Dev, "/dev")
	def(&o.UdevControl, "/run/udev/control")
	def(&o.InitiatorNameFile, "/etc/iscsi/initiatorname.iscsi")
	defDur(&o.CommandTimeout, 30*time.Second)
	defDur(&o.LoginTimeout, 5*time.Second)
	defDur(&o.DeviceTimeout, 30*time.Second)
	defDur(&o.ByPathWait, 5*time.Second)
	if o.LoginRetries <= 0 {
		o.LoginRetries = 2
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// Initiator logs in to iSCSI targets and shares one session per (portal,
// target) among all the LUNs that use it. It is safe for concurrent use;
// operations on one session are serialized, different sessions proceed in
// parallel.
type Initiator struct {
	opt   Options
	adm   runner
	sys   Sysfs
	users *users

	// locks serializes operations per session.
	mu    sync.Mutex
	locks map[sessionKey]chan struct{}
	// nodeDB serializes writes to open-iscsi's node database; concurrent
	// iscsiadm updates of different records have raced in the past.
	nodeDB sync.Mutex
	// swept holds the node databases whose stale temp files this
	// Initiator has removed (under nodeDB).
	swept map[string]bool
	// nodeDBs, when set, replaces the node databases of the options
	// (tests: several databases in temporary folders).
	nodeDBs []string
}

// New returns an Initiator that keeps its record of session users in
// stateDir (created if missing, mode 0700). opts may be nil.
func New(stateDir string, opts *Options) (*Initiator, error) {
	if stateDir == "" || !filepath.IsAbs(stateDir) {
		return nil, abi.Errorf(abi.InvalidArgument, "iscsi: state dir %q is not absolute", stateDir)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.setDefaults()
	u, err := loadUsers(stateDir)
	if err != nil {
		return nil, fmt.Errorf("iscsi: %w", err)
	}
	return &Initiator{
		opt:   o,
		adm:   runner{prog: o.Iscsiadm, timeout: o.CommandTimeout},
		sys:   Sysfs{Root: o.Sysfs},
		users: u,
		locks: map[sessionKey]chan struct{}{},
		swept: map[string]bool{},
	}, nil
}

// lock takes the per-session lock, giving up when ctx ends.
func (in *Initiator) lock(ctx context.Context, k sessionKey) (func(), error) {
	in.mu.Lock()
	ch, ok := in.locks[k]
	if !ok {
		ch = make(chan struct{}, 1)
		in.locks[k] = ch
	}
	in.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, abi.Errorf(abi.Aborted, "iscsi: %s is busy: %v", k.String(), ctx.Err())
	}
}

// Login makes t's LUN available as a block device and returns its path:
// the /dev/disk/by-path link when udev makes one, else /dev/sdX. It records
// the LUN as a user of the session before logging in, logs in only when no
// session to (portal, IQN) exists, and waits for the LUN's device with a
// deadline. Login is idempotent: a LUN already in use returns its device.
//
// Errors: InvalidArgument for a bad target, PermissionDenied when the
// target refuses the initiator or its CHAP credentials, Unavailable when
// the portal does not answer, NotFound when the session is up but the
// target does not present the LUN to this initiator.
func (in *Initiator) Login(ctx context.Context, t Target) (string, error) {
	k, err := t.check()
	if err != nil {
		return "", err
	}
	unlock, err := in.lock(ctx, k)
	if err != nil {
		return "", err
	}
	defer unlock()
	start := time.Now()

	added, err := in.users.add(k, t.LUN)
	if err != nil {
		return "", fmt.Errorf("login %s LUN %d: %w", k, t.LUN, err)
	}
	dev, created, err := in.login(ctx, k, t)
	if err != nil {
		if added {
			in.rollback(ctx, k, t.LUN, created)
		}
		return "", fmt.Errorf("login %s LUN %d: %w", k, t.LUN, err)
	}
	in.opt.Log.Info("iscsi login", "target", k.String(), "lun", t.LUN, "device", dev,
		"new_session", created, "took", time.Since(start).Round(time.Millisecond))
	return dev, nil
}

// login does Login's work under the session lock and reports whether it
// created the session.
func (in *Initiator) login(ctx context.Context, k sessionKey, t Target) (string, bool, error) {
	ks, ok, err := in.sys.find(k)
	if err != nil {
		return "", false, err
	}
	created := false
	if !ok {
		if err := in.configureNode(ctx, k, t.CHAP); err != nil {
			return "", false, err
		}
		_, err := in.adm.run(ctx, "login", "-m", "node", "-T", k.IQN, "-p", k.portalArg(), "--login")
		if err != nil && exitCode(err) != admSessExists {
			in.deleteNode(ctx, k)
			return "", false, err
		}
		created = err == nil
		if ks, ok, err = in.sys.find(k); err != nil {
			return "", created, err
		} else if !ok {
			return "", created, abi.Errorf(abi.Internal, "iscsiadm reported a login but sysfs shows no session")
		}
	}
	dev, err := in.waitDevice(ctx, ks, t.LUN, !created)
	return dev, created, err
}

// rollback undoes a failed Login's user record, and its session when the
// session was made for it and nobody else uses it.
func (in *Initiator) rollback(ctx context.Context, k sessionKey, lun int, created bool) {
	left, err := in.users.remove(k, lun)
	if err != nil {
		in.opt.Log.Error("iscsi: undo login record", "target", k.String(), "lun", lun, "err", err)
		return
	}
	if left > 0 || !created {
		return
	}
	if ks, ok, err := in.sys.find(k); err == nil && ok {
		if err := in.logoutSession(ctx, ks); err != nil {
			in.opt.Log.Error("iscsi: undo login", "target", k.String(), "err", err)
			return
		}
	}
	if err := in.deleteNode(ctx, k); err != nil {
		in.opt.Log.Error("iscsi: undo login", "target", k.String(), "err", err)
	}
}

// configureNode creates or refreshes the node record of k with this
// package's settings, in two iscsiadm runs, and writes t's CHAP
// credentials into the record file itself: never on iscsiadm's command
// line, where every local user can read them in /proc/<pid>/cmdline.
func (in *Initiator) configureNode(ctx context.Context, k sessionKey, chap *CHAP) error {
	in.nodeDB.Lock()
	defer in.nodeDB.Unlock()
	dbs := defaultNodeDBs
	if in.opt.NodeDB != "" {
		dbs = []string{in.opt.NodeDB}
	}
	if in.nodeDBs != nil {
		dbs = in.nodeDBs
	}
	var before map[string]recordStamp
	if chap != nil {
		var err error
		if before, err = recordStamps(dbs, k); err != nil {
			return abi.Errorf(abi.Internal, "write CHAP credentials: %v", err)
		}
	}
	base := []string{"-m", "node", "-T", k.IQN, "-p", k.portalArg()}
	if _, err := in.adm.run(ctx, "create node record", append(slices.Clone(base), "-o", "new")...); err != nil {
		return err
	}
	set := func(args []string, name, value string) []string { return append(args, "-n", name, "-v", value) }
	args := append(slices.Clone(base), "-o", "update")
	// The daemon decides when to log in, never iscsid at boot.
	args = set(args, "node.startup", "manual")
	args = set(args, "node.session.initial_login_retry_max", strconv.Itoa(in.opt.LoginRetries))
	args = set(args, "node.conn[0].timeo.login_timeout", strconv.Itoa(int(in.opt.LoginTimeout/time.Second)))
	if chap == nil {
		args = set(args, authMethod, "None")
	}
	if _, err := in.adm.run(ctx, "update node record", args...); err != nil || chap == nil {
		return err
	}
	// Only the database iscsiadm uses gets the secret: a copy in another
	// one would outlive the record, as "-o delete" never looks there.
	db, err := activeNodeDB(dbs, k, before)
	if err != nil {
		return abi.Errorf(abi.Internal, "write CHAP credentials: %v", err)
	}
	if db == "" {
		return abi.Errorf(abi.Internal, "write CHAP credentials: iscsiadm made no node record for %s under %s",
			k.String(), strings.Join(dbs, " or "))
	}
	if !in.swept[db] {
		if err := removeStaleTemps(db); err != nil {
			return abi.Errorf(abi.Internal, "write CHAP credentials: %v", err)
		}
		in.swept[db] = true
	}
	recs, err := nodeRecords([]string{db}, k)
	if err != nil {
		return abi.Errorf(abi.Internal, "write CHAP credentials: %v", err)
	}
	for _, r := range recs {
		if err := updateRecord(r, recordTmpDir(db), chapSettings(chap)); err != nil {
			return abi.Errorf(abi.Internal, "write CHAP credentials: %v", err)
		}
	}
	return nil
}

// deleteNode removes k's node record (and with it any stored CHAP secret).
// A missing record is not an error.
func (in *Initiator) deleteNode(ctx context.Context, k sessionKey) error {
	in.nodeDB.Lock()
	defer in.nodeDB.Unlock()
	_, err := in.adm.run(ctx, "delete node record", "-m", "node", "-T", k.IQN, "-p", k.portalArg(), "-o", "delete")
	if err != nil && abi.CodeOf(err) != abi.NotFound {
		return err
	}
	return nil
}

// waitDevice waits until the LUN's block device exists and returns its path.
// scanNow asks the kernel to probe the LUN at once (the session existed
// before, so its initial scan is long done or the LUN's device was deleted
// by an earlier Logout); otherwise the probe waits for the session's own
// initial scan. A LUN still absent after a probe is not presented to us.
func (in *Initiator) waitDevice(ctx context.Context, ks kernelSession, lun int, scanNow bool) (string, error) {
	deadline := time.Now().Add(in.opt.DeviceTimeout)
	scanned := false
	loginAt := time.Now()
	sleep := 10 * time.Millisecond
	for {
		d, ok, err := in.sys.lun(ks, lun)
		if err != nil {
			return "", err
		}
		if ok && d.Block != "" {
			dev := filepath.Join(in.opt.Dev, d.Block)
			if live(dev) {
				return in.byPath(ctx, ks, lun, dev, deadline), nil
			}
		}
		if !ok && !scanned {
			cur, err := in.sys.session(ks.ID)
			if err != nil {
				return "", abi.Errorf(abi.Unavailable, "session%d went away", ks.ID)
			}
			// The kernel's initial scan of a new session runs after
			// iscsiadm returns; a kernel without target_state gets a
			// second before we probe ourselves.
			if scanNow || cur.TargetState == "SCANNED" || (cur.TargetState == "" && time.Since(loginAt) > time.Second) {
				if err := in.sys.scan(cur, lun); err != nil {
					return "", err
				}
				scanned = true
				if _, ok, err := in.sys.lun(ks, lun); err != nil {
					return "", err
				} else if !ok {
					return "", abi.Errorf(abi.NotFound, "target presents no LUN %d to this initiator", lun)
				}
				continue
			}
		}
		if time.Now().After(deadline) {
			return "", abi.Errorf(abi.DeadlineExceeded, "LUN %d has no block device after %s", lun, in.opt.DeviceTimeout.String())
		}
		select {
		case <-ctx.Done():
			return "", abi.Errorf(abi.DeadlineExceeded, "waiting for LUN %d: %v", lun, ctx.Err())
		case <-time.After(sleep):
		}
		sleep = min(sleep*2, 100*time.Millisecond)
	}
}

// live reports whether the device node dev can be opened. A node that
// exists may not be usable yet: right after a session ends and a new one
// logs in, the new LUN's disk can take the name its predecessor had
// moments ago, and until the kernel has finished removing the one and
// adding the other an open fails with ENXIO (a stage then failed its probe
// with "no such device or address"). Errors that say nothing about the
// device's presence (EACCES) count as live, as the node's existence did.
func live(dev string) bool {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return !errors.Is(err, unix.ENXIO) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV)
	}
	unix.Close(fd)
	return true
}

// byPath returns udev's stable link for the LUN when udev runs and makes it
// in time, else dev.
func (in *Initiator) byPath(ctx context.Context, ks kernelSession, lun int, dev string, deadline time.Time) string {
	if _, err := os.Stat(in.opt.UdevControl); err != nil {
		return dev
	}
	// Same format as udev's path_id builtin.
	link := filepath.Join(in.opt.Dev, "disk", "by-path",
		"ip-"+ks.Address+":"+strconv.Itoa(int(ks.Key.Portal.Port()))+"-iscsi-"+ks.Key.IQN+"-lun-"+strconv.Itoa(lun))
	until := time.Now().Add(in.opt.ByPathWait)
	if deadline.Before(until) {
		until = deadline
	}
	for {
		if real, err := filepath.EvalSymlinks(link); err == nil && real == dev {
			return link
		}
		if time.Now().After(until) {
			in.opt.Log.Warn("iscsi: udev made no by-path link in time; using the kernel name", "link", link, "device", dev)
			return dev
		}
		select {
		case <-ctx.Done():
			return dev
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Logout ends t's LUN's use of its session: it deletes the LUN's SCSI device
// (after flushing it) and logs the session out only when no other LUN uses
// it. The LUN's user record is dropped last, so a failure leaves it in place
// and a retry finishes the job. Logout is idempotent. A device that is still
// mounted or held (opened exclusively) is refused with FailedPrecondition.
func (in *Initiator) Logout(ctx context.Context, t Target) error {
	t.CHAP = nil
	k, err := t.check()
	if err != nil {
		return err
	}
	unlock, err := in.lock(ctx, k)
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	ks, ok, err := in.sys.find(k)
	if err != nil {
		return fmt.Errorf("logout %s LUN %d: %w", k, t.LUN, err)
	}
	if ok {
		if err := in.deleteLUN(ks, t.LUN); err != nil {
			return fmt.Errorf("logout %s LUN %d: %w", k, t.LUN, err)
		}
	}
	all := in.users.get(k)
	wasUser := slices.Contains(all, t.LUN)
	others := slices.DeleteFunc(all, func(l int) bool { return l == t.LUN })
	ended := false
	if len(others) == 0 && (ok || wasUser) {
		if ok {
			if err := in.logoutSession(ctx, ks); err != nil {
				return fmt.Errorf("logout %s LUN %d: %w", k, t.LUN, err)
			}
			ended = true
		}
		if err := in.deleteNode(ctx, k); err != nil {
			return fmt.Errorf("logout %s LUN %d: %w", k, t.LUN, err)
		}
	}
	if _, err := in.users.remove(k, t.LUN); err != nil {
		return fmt.Errorf("logout %s LUN %d: %w", k, t.LUN, err)
	}
	in.opt.Log.Info("iscsi logout", "target", k.String(), "lun", t.LUN, "session_ended", ended,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// deleteLUN flushes and deletes one LUN's SCSI device, if present.
func (in *Initiator) deleteLUN(ks kernelSession, lun int) error {
	d, ok, err := in.sys.lun(ks, lun)
	if err != nil || !ok {
		return err
	}
	if d.Block != "" {
		if err := flushExclusive(filepath.Join(in.opt.Dev, d.Block)); err != nil {
			return err
		}
	}
	if err := sysattr.Write(filepath.Join(d.Dir, "delete"), "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete SCSI device %s: %w", filepath.Base(d.Dir), err)
	}
	return nil
}

// flushExclusive opens a block device exclusively, which fails with EBUSY
// while it is mounted or held by device-mapper or md, and flushes its
// buffers. Deleting a device under a mounted filesystem loses data.
func flushExclusive(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return abi.Errorf(abi.FailedPrecondition, "%s is still in use (mounted or held)", dev)
	}
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	if err := unix.IoctlSetInt(fd, unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("flush %s: %w", dev, err)
	}
	return nil
}

// logoutSession logs one session out by its id; a session that is already
// gone is not an error.
func (in *Initiator) logoutSession(ctx context.Context, ks kernelSession) error {
	_, err := in.adm.run(ctx, "logout", "-m", "session", "-r", strconv.Itoa(ks.ID), "-u")
	if err != nil && abi.CodeOf(err) != abi.NotFound {
		return err
	}
	return nil
}

// Rescan makes the kernel re-read the capacity of t's LUN, after the target
// grew it, and returns the new size in bytes. Only that LUN is probed: a
// session-wide rescan would bring back devices of LUNs not in use here.
func (in *Initiator) Rescan(ctx context.Context, t Target) (int64, error) {
	t.CHAP = nil
	k, err := t.check()
	if err != nil {
		return 0, err
	}
	unlock, err := in.lock(ctx, k)
	if err != nil {
		return 0, err
	}
	defer unlock()
	ks, ok, err := in.sys.find(k)
	if err != nil {
		return 0, fmt.Errorf("rescan %s LUN %d: %w", k, t.LUN, err)
	}
	if !ok {
		return 0, abi.Errorf(abi.NotFound, "rescan %s: not logged in", k.String())
	}
	d, ok, err := in.sys.lun(ks, t.LUN)
	if err != nil {
		return 0, fmt.Errorf("rescan %s LUN %d: %w", k, t.LUN, err)
	}
	if !ok || d.Block == "" {
		return 0, abi.Errorf(abi.NotFound, "rescan %s: LUN %d has no device", k.String(), t.LUN)
	}
	if err := sysattr.Write(filepath.Join(d.Dir, "rescan"), "1"); err != nil {
		return 0, fmt.Errorf("rescan %s LUN %d: %w", k, t.LUN, err)
	}
	return in.sys.size(d.Block)
}

// Session describes one iSCSI session on this node.
type Session struct {
	ID     int
	Portal string
	IQN    string
	State  string
	// Users are the LUNs recorded as in use through this session.
	Users []int
	// Devices maps each LUN with a block device to its /dev path.
	Devices map[int]string
}

// Sessions lists the node's iSCSI sessions with their users and devices.
func (in *Initiator) Sessions(ctx context.Context) ([]Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	all, err := in.sys.sessions()
	if err != nil {
		return nil, err
	}
	out := make([]Session, 0, len(all))
	for _, ks := range all {
		s := Session{ID: ks.ID, Portal: ks.Key.Portal.String(), IQN: ks.Key.IQN, State: ks.State,
			Users: in.users.get(ks.Key), Devices: map[int]string{}}
		luns, err := in.sys.luns(ks)
		if err != nil {
			return nil, err
		}
		for _, d := range luns {
			if d.Block != "" {
				s.Devices[d.LUN] = filepath.Join(in.opt.Dev, d.Block)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// Cleanup logs out the sessions that no recorded user holds and whose LUN
// devices are all gone, the leftovers of a crash between deleting a
// device and logging out, and returns them. Sessions with devices are left
// alone: something outside this package may be using them.
func (in *Initiator) Cleanup(ctx context.Context) ([]Session, error) {
	all, err := in.Sessions(ctx)
	if err != nil {
		return nil, fmt.Errorf("cleanup: %w", err)
	}
	var done []Session
	var errs []error
	for _, s := range all {
		if len(s.Users) > 0 || len(s.Devices) > 0 {
			continue
		}
		k := sessionKey{IQN: s.IQN}
		k.Portal, _ = ParsePortal(s.Portal)
		unlock, err := in.lock(ctx, k)
		if err != nil {
			return done, err
		}
		did, err := in.cleanupOne(ctx, k, s.ID)
		unlock()
		if err != nil {
			errs = append(errs, err)
		}
		if did {
			done = append(done, s)
		}
	}
	return done, errors.Join(errs...)
}

// cleanupOne re-checks one idle session under its lock and logs it out.
func (in *Initiator) cleanupOne(ctx context.Context, k sessionKey, id int) (bool, error) {
	ks, err := in.sys.session(id)
	if err != nil || ks.Key != k {
		return false, nil // gone, or the id was reused
	}
	if len(in.users.get(k)) > 0 {
		return false, nil
	}
	luns, err := in.sys.luns(ks)
	if err != nil {
		return false, err
	}
	for _, d := range luns {
		if d.Block != "" {
			return false, nil
		}
	}
	if err := in.logoutSession(ctx, ks); err != nil {
		return false, fmt.Errorf("cleanup %s: %w", k, err)
	}
	if err := in.deleteNode(ctx, k); err != nil {
		return true, fmt.Errorf("cleanup %s: %w", k, err)
	}
	in.opt.Log.Info("iscsi cleanup: logged out idle session", "target", k.String(), "session", id)
	return true, nil
}

// InitiatorName returns this node's initiator name from open-iscsi's name
// file ("InitiatorName=iqn...").
func (in *Initiator) InitiatorName(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return readInitiatorName(in.opt.InitiatorNameFile)
}

func readInitiatorName(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", abi.Errorf(abi.FailedPrecondition, "initiator name: %s does not exist (is open-iscsi installed?)", path)
	}
	if err != nil {
		return "", fmt.Errorf("initiator name: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		v, ok := strings.CutPrefix(line, "InitiatorName=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if err := ValidateName(v); err != nil {
			return "", fmt.Errorf("initiator name in %s: %w", path, err)
		}
		return v, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("initiator name: read %s: %w", path, err)
	}
	return "", abi.Errorf(abi.FailedPrecondition, "initiator name: no InitiatorName= line in %s", path)
}
