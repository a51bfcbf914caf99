// Package nfsd exports folders over NFS with the kernel's nfsd, each to an
// explicit list of client addresses, and keeps each module's exports in a
// file of its own under /etc/exports.d (see abi/hc_nfsd.go).
//
// Why a file and exportfs rather than a syscall: the kernel has no call
// that adds an export. nfsd asks user space (rpc.mountd) through the
// export cache channels (/proc/net/rpc/nfsd.export, auth.unix.ip) whenever
// it meets a client or a file handle it has not cached, and mountd answers
// from /var/lib/nfs/etab, which exportfs writes from /etc/exports and
// /etc/exports.d. Writing the channels ourselves would mean taking over
// mountd's job for every export of the host, ours and the operator's. So
// the daemon owns one file per module in /etc/exports.d, written whole,
// fsynced and renamed into place (the record: it survives a daemon
// restart, a reboot and a restart of the NFS server, and never names a
// client the module did not), and runs "exportfs -r", which makes etab
// and the kernel agree with the files and flushes the kernel's caches, so
// a client taken off a list loses access at its next request. One run per
// change, never a shell.
package nfsd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Paths of the system's NFS server.
const (
	DefaultExportsDir = "/etc/exports.d"
	DefaultEtab       = "/var/lib/nfs/etab"
	DefaultThreads    = "/proc/fs/nfsd/threads"
)

// FilePrefix starts the name of every file the daemon owns in the exports
// folder: "wasmcsi-<module>.exports".
const FilePrefix = "wasmcsi-"

// Export is one recorded export.
type Export struct {
	Path    string
	Clients []Client
}

// Client is one client of an export.
type Client struct {
	Address  string // an IP address or prefix
	ReadOnly bool
}

// Runner runs exportfs with args; tests replace it.
type Runner func(ctx context.Context, args ...string) error

// Server manages the daemon's export files. Its methods are safe for
// concurrent use; changes are serialized, since the kernel's export table
// and etab are one for the whole host (as LIO's tree is for lio).
type Server struct {
	Dir     string // the exports folder, DefaultExportsDir
	Etab    string
	Threads string
	Run     Runner
	// Check, when set, says whether the server's tools are there; a
	// change is refused (FAILED_PRECONDITION) before anything is written.
	Check func() error

	mu sync.Mutex
}

// New returns a Server on the system's paths, running exportfs.
func New() *Server {
	return &Server{Dir: DefaultExportsDir, Etab: DefaultEtab, Threads: DefaultThreads, Run: runExportfs, Check: Available}
}

// exportfsPath finds exportfs where Debian, Fedora and Alpine put it.
func exportfsPath() (string, error) {
	for _, p := range []string{"/usr/sbin/exportfs", "/sbin/exportfs"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("exportfs"); err == nil {
		return p, nil
	}
	return "", abi.Errorf(abi.FailedPrecondition, "exportfs not found: install the NFS server (nfs-kernel-server, nfs-utils)")
}

// Available reports whether this host can serve exports.
func Available() error {
	_, err := exportfsPath()
	return err
}

func runExportfs(ctx context.Context, args ...string) error {
	bin, err := exportfsPath()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return abi.Errorf(abi.Unavailable, "exportfs %s: %v", strings.Join(args, " "), ctx.Err())
		}
		return abi.Errorf(abi.Internal, "exportfs %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// file is the module's export file.
func (s *Server) file(module string) (string, error) {
	if module == "" || strings.ContainsAny(module, "/\x00") || strings.HasPrefix(module, ".") {
		return "", abi.Errorf(abi.InvalidArgument, "nfsd: module name %q cannot name an exports file", module)
	}
	return filepath.Join(s.Dir, FilePrefix+module+".exports"), nil
}

// Load reads a module's recorded exports, in byte order of their paths.
func (s *Server) Load(module string) ([]Export, error) {
	name, err := s.file(module)
	if err != nil {
		return nil, err
	}
	return readFile(name)
}

// Set records path's export with exactly clients (nil: forget it) and
// makes the kernel serve what the records say. It answers the recorded
// export.
func (s *Server) Set(ctx context.Context, module, path string, change func(cur *Export) *Export) (*Export, error) {
	name, err := s.file(module)
	if err != nil {
		return nil, err
	}
	if s.Check != nil {
		if err := s.Check(); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exports, err := readFile(name)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(exports, func(e Export) bool { return e.Path == path })
	var cur *Export
	if i >= 0 {
		c := exports[i]
		cur = &c
	}
	next := change(cur)
	switch {
	case next == nil && cur == nil:
		return nil, nil
	case next == nil:
		exports = slices.Delete(exports, i, i+1)
	case cur == nil:
		exports = append(exports, *next)
	default:
		if equalExport(*cur, *next) {
			// Unchanged: still apply, so a repeat repairs a kernel table
			// that lost the export (a server restart that ran before the
			// file was written, an operator's exportfs -u).
			return next, s.apply(ctx)
		}
		exports[i] = *next
	}
	if err := writeFile(name, exports); err != nil {
		return nil, err
	}
	return next, s.apply(ctx)
}

// Apply makes the kernel serve what every export file says; the daemon
// calls it at start-up.
func (s *Server) Apply(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apply(ctx)
}

func (s *Server) apply(ctx context.Context) error {
	return s.Run(ctx, "-r")
}

// Running reports whether nfsd has threads, and why not.
func (s *Server) Running() (bool, string) {
	b, err := os.ReadFile(s.Threads)
	if err != nil {
		return false, "nfsd is not loaded or its filesystem is not mounted: " + err.Error()
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return false, "nfsd has no threads: the NFS server is stopped"
	}
	return true, ""
}

// Active reports which (path, client) pairs etab serves.
func (s *Server) Active() (map[string]map[string]bool, error) {
	f, err := os.Open(s.Etab)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]map[string]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nfsd: read %s: %w", s.Etab, err)
	}
	defer f.Close()
	out := map[string]map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// "/path\tclient(options)"
		path, rest, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			continue
		}
		client, _, _ := strings.Cut(rest, "(")
		if out[path] == nil {
			out[path] = map[string]bool{}
		}
		out[path][normalClient(client)] = true
	}
	return out, sc.Err()
}

// normalClient is a client as etab and the records compare it.
func normalClient(c string) string {
	if p, err := netip.ParsePrefix(c); err == nil {
		if p.Bits() == p.Addr().BitLen() {
			return p.Addr().String()
		}
		return p.Masked().String()
	}
	if a, err := netip.ParseAddr(c); err == nil {
		return a.String()
	}
	return c
}

func equalExport(a, b Export) bool {
	return a.Path == b.Path && slices.Equal(a.Clients, b.Clients)
}

// Options are the export options of a client: fixed but for ro/rw.
func Options(path string, readOnly bool) string {
	rw := "rw"
	if readOnly {
		rw = "ro"
	}
	return rw + ",sync,no_subtree_check,no_root_squash,sec=sys,fsid=" + FSID(path)
}

// FSID derives an export's fsid from its path: stable across restarts and
// reboots, so file handles clients hold stay valid, and distinct per
// export, so each volume is a filesystem of its own to clients.
func FSID(path string) string {
	sum := sha256.Sum256([]byte("wasmcsi-nfsd:" + path))
	return hex.EncodeToString(sum[:16])
}

// ValidPath checks a path can be written in an exports file unquoted.
func ValidPath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return abi.Errorf(abi.InvalidArgument, "nfsd: path %q is not absolute and clean", p)
	}
	for _, r := range p {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == '"' || r == '\\' || r == '#' || r == '(' || r == ')' {
			return abi.Errorf(abi.InvalidArgument, "nfsd: path %q has a character an exports file cannot hold (space, quote, #, parenthesis)", p)
		}
	}
	return nil
}

// ParseClient checks a client address or prefix and answers its normal form.
func ParseClient(c string) (netip.Prefix, string, error) {
	if c == "" || c == "*" {
		return netip.Prefix{}, "", abi.Errorf(abi.InvalidArgument, "nfsd: client %q: name one address or prefix; exports are never open to everyone", c)
	}
	if a, err := netip.ParseAddr(c); err == nil {
		if a.Zone() != "" {
			return netip.Prefix{}, "", abi.Errorf(abi.InvalidArgument, "nfsd: client %q has a zone", c)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), a.String(), nil
	}
	if p, err := netip.ParsePrefix(c); err == nil {
		if p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return netip.Prefix{}, "", abi.Errorf(abi.InvalidArgument, "nfsd: client %q: write an IPv4 prefix as such", c)
		}
		p = p.Masked()
		if p.Bits() == 0 {
			return netip.Prefix{}, "", abi.Errorf(abi.InvalidArgument, "nfsd: client %q is every address; exports are never open to everyone", c)
		}
		return p, normalClient(p.String()), nil
	}
	return netip.Prefix{}, "", abi.Errorf(abi.InvalidArgument, "nfsd: client %q is not an IP address or prefix (host names, netgroups and wildcards are refused)", c)
}

// Marker starts the record of every export in a file; a record with no
// client is the marker alone, so that nothing exports the folder.
const Marker = "#wasmcsi-export "

func readFile(name string) ([]Export, error) {
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nfsd: read %s: %w", name, err)
	}
	var out []Export
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case strings.HasPrefix(line, Marker):
			p := strings.TrimPrefix(line, Marker)
			if ValidPath(p) != nil {
				return nil, fmt.Errorf("nfsd: %s:%d: bad record %q", name, n+1, line)
			}
			out = append(out, Export{Path: p})
		case strings.HasPrefix(line, "#"):
		default:
			fields := strings.Fields(line)
			if len(out) == 0 || fields[0] != out[len(out)-1].Path {
				return nil, fmt.Errorf("nfsd: %s:%d: export line outside its record", name, n+1)
			}
			for _, f := range fields[1:] {
				addr, opts, ok := strings.Cut(f, "(")
				if !ok {
					return nil, fmt.Errorf("nfsd: %s:%d: client %q without options", name, n+1, f)
				}
				out[len(out)-1].Clients = append(out[len(out)-1].Clients,
					Client{Address: addr, ReadOnly: slices.Contains(strings.Split(strings.TrimSuffix(opts, ")"), ","), "ro")})
			}
		}
	}
	slices.SortFunc(out, func(a, b Export) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

// format writes exports as an exports(5) file.
func format(exports []Export) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by wasmcsi: every line is a volume's export; do not edit.\n")
	for _, e := range exports {
		b.WriteString(Marker + e.Path + "\n")
		if len(e.Clients) == 0 {
			continue
		}
		b.WriteString(e.Path)
		for _, c := range e.Clients {
			b.WriteString(" " + c.Address + "(" + Options(e.Path, c.ReadOnly) + ")")
		}
		b.WriteString("\n")
	}
	return b.Bytes()
}

// writeFile replaces name with exports, durably: a temporary file,
// fsynced, renamed over the old one, and the folder fsynced. No exports
// removes the file.
func writeFile(name string, exports []Export) error {
	dir := filepath.Dir(name)
	if len(exports) == 0 {
		if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("nfsd: remove %s: %w", name, err)
		}
		return syncDir(dir)
	}
	slices.SortFunc(exports, func(a, b Export) int { return strings.Compare(a.Path, b.Path) })
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("nfsd: %w", err)
	}
	// The temporary name does not end in .exports: exportfs reads only
	// those.
	tmp := name + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("nfsd: %w", err)
	}
	_, err = f.Write(format(exports))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("nfsd: write %s: %w", name, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nfsd: open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("nfsd: sync %s: %w", dir, err)
	}
	return nil
}

var evalSymlinks = filepath.EvalSymlinks
