package iscsi

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// open-iscsi keeps one node record per (target, portal, portal group tag,
// interface) in its node database, a folder of plain "name = value" files:
//
//	<db>/<iqn>/<addr>,<port>              made by "-o new" without a tag
//	<db>/<iqn>/<addr>,<port>,<tpgt>/<if>  made by discovery, one per interface
//
// <addr> is the bare address (an IPv6 one without brackets). iscsiadm reads
// the whole record before each login and hands it to iscsid. The folder is
// compiled into open-iscsi: /etc/iscsi/nodes on Debian and Ubuntu,
// /var/lib/iscsi/nodes on Fedora and RHEL.
var defaultNodeDBs = []string{"/etc/iscsi/nodes", "/var/lib/iscsi/nodes"}

// Node record settings written into the record file instead of iscsiadm's
// command line (see "Node records" in the package comment).
const (
	authMethod   = "node.session.auth.authmethod"
	authUser     = "node.session.auth.username"
	authPassword = "node.session.auth.password"
	authUserIn   = "node.session.auth.username_in"
	authPassIn   = "node.session.auth.password_in"
)

// setting is one "name = value" line of a node record; an empty value drops
// the line.
type setting struct{ name, value string }

// chapSettings are the record lines for one-way CHAP with c. Mutual CHAP
// lines that iscsid.conf's defaults may have put into a new record are
// dropped: this login asks for one-way CHAP only.
func chapSettings(c *CHAP) []setting {
	return []setting{
		{authMethod, "CHAP"},
		{authUser, c.User},
		{authPassword, c.Secret},
		{authUserIn, ""},
		{authPassIn, ""},
	}
}

// nodeRecords returns the paths of k's node records under the node
// databases dbs (both layouts, every interface), as "iscsiadm -o update"
// would change them.
func nodeRecords(dbs []string, k sessionKey) ([]string, error) {
	addr := k.Portal.Addr().WithZone("").String()
	flat := addr + "," + strconv.Itoa(int(k.Portal.Port()))
	var recs []string
	for _, db := range dbs {
		dir := filepath.Join(db, k.IQN)
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("node records of %s: %w", k, err)
		}
		for _, e := range ents {
			name := e.Name()
			p := filepath.Join(dir, name)
			switch {
			case name == flat && e.Type().IsRegular():
				recs = append(recs, p)
			case e.IsDir() && isTPGT(name, flat):
				ifs, err := os.ReadDir(p)
				if err != nil {
					return nil, fmt.Errorf("node records of %s: %w", k, err)
				}
				for _, f := range ifs {
					if f.Type().IsRegular() && !strings.HasPrefix(f.Name(), ".") {
						recs = append(recs, filepath.Join(p, f.Name()))
					}
				}
			}
		}
	}
	return recs, nil
}

// isTPGT reports whether name is flat followed by ",<tpgt>".
func isTPGT(name, flat string) bool {
	tag, ok := strings.CutPrefix(name, flat+",")
	if !ok {
		return false
	}
	_, err := strconv.Atoi(tag)
	return err == nil
}

// recordTmpPattern names the temp files of updateRecord, made in the
// folder that holds the node database: never inside the database, where
// open-iscsi takes every file of a portal folder for an interface record.
const recordTmpPattern = ".wasmcsi-node-record.tmp-*"

// recordTmpDir is where updateRecord makes the temp files for the records
// of the node database db: db's parent, on the same filesystem as db in
// every layout open-iscsi is packaged with.
func recordTmpDir(db string) string { return filepath.Dir(filepath.Clean(db)) }

// removeStaleTemps removes the temp files a crash during updateRecord may
// have left, each holding a secret: this package's in db's parent, and
// those earlier versions made next to the records (".<name>.tmp-*" in the
// database's target and portal folders).
func removeStaleTemps(db string) error {
	old, err := filepath.Glob(filepath.Join(recordTmpDir(db), recordTmpPattern))
	if err != nil {
		return err
	}
	for _, pat := range []string{"*/.*.tmp-*", "*/*/.*.tmp-*"} {
		m, err := filepath.Glob(filepath.Join(db, pat))
		if err != nil {
			return err
		}
		old = append(old, m...)
	}
	for _, p := range old {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale temp file: %w", err)
		}
	}
	return nil
}

// recordStamp identifies one version of a record file.
type recordStamp struct {
	ino   uint64
	size  int64
	mtime int64
}

// recordStamps returns the stamps of k's node records in each of dbs.
func recordStamps(dbs []string, k sessionKey) (map[string]recordStamp, error) {
	out := map[string]recordStamp{}
	for _, db := range dbs {
		recs, err := nodeRecords([]string{db}, k)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			var st syscall.Stat_t
			if err := syscall.Stat(r, &st); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return nil, fmt.Errorf("node record %s: %w", r, err)
			}
			out[r] = recordStamp{ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
		}
	}
	return out, nil
}

// activeNodeDB picks, of dbs, the node database iscsiadm uses: the one
// whose records of k its "-o new" and "-o update" runs made or changed
// (before are the stamps from before those runs), or, when no stamp tells,
// the only one holding a record of k. It returns "" when none holds one.
func activeNodeDB(dbs []string, k sessionKey, before map[string]recordStamp) (string, error) {
	var changed, holding []string
	for _, db := range dbs {
		after, err := recordStamps([]string{db}, k)
		if err != nil {
			return "", err
		}
		if len(after) == 0 {
			continue
		}
		holding = append(holding, db)
		for r, st := range after {
			if old, ok := before[r]; !ok || old != st {
				changed = append(changed, db)
				break
			}
		}
	}
	switch {
	case len(changed) == 1:
		return changed[0], nil
	case len(holding) <= 1 && len(changed) == 0:
		if len(holding) == 0 {
			return "", nil
		}
		return holding[0], nil
	}
	return "", fmt.Errorf("records of %s in %s, and iscsiadm changed those of %d: cannot tell which database it uses",
		k, strings.Join(holding, " and "), len(changed))
}

// updateRecord sets the given settings in the record file at path: it
// replaces their lines, adds the missing ones before "# END RECORD" and
// replaces the file atomically (temp file mode 0600 in tmpDir, fsync,
// rename, folder fsync), so a crash leaves the old record or the new one,
// and the file holding a secret is readable by root only. tmpDir must be
// on path's filesystem and outside the node database.
func updateRecord(path, tmpDir string, set []setting) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read node record: %w", err)
	}
	want := make(map[string]string, len(set))
	for _, s := range set {
		want[s.name] = s.value
	}
	var out bytes.Buffer
	done := map[string]bool{}
	add := func() {
		for _, s := range set {
			if !done[s.name] && s.value != "" {
				fmt.Fprintf(&out, "%s = %s\n", s.name, s.value)
			}
			done[s.name] = true
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(old))
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "# END RECORD" {
			add()
		}
		if name, _, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			name = strings.TrimSpace(name)
			if v, ok := want[name]; ok {
				if !done[name] && v != "" {
					fmt.Fprintf(&out, "%s = %s\n", name, v)
				}
				done[name] = true
				continue
			}
		}
		out.WriteString(line + "\n")
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read node record: %w", err)
	}
	add()
	if err := writeFileVia(path, tmpDir, recordTmpPattern, out.Bytes()); err != nil {
		return fmt.Errorf("node record: %w", err)
	}
	return nil
}
