package main

import (
	"crypto/sha256"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/examples/internal/netblock"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// Names. A volume's local ID is "<name ID>.<LUN>" and its file in the pool
// "<local ID>.img"; a snapshot's local ID is its name ID and its file
// "<local ID>.snap". The name ID (sdk.NameID) comes from the CSI name alone, so a
// repeated CreateVolume finds the file of the first call by trying the
// LUNs in the name's own order (lunOrder) — the pool folder is the record
// of which LUN belongs to which volume, and the volume ID says it too.
const (
	volumeSuffix   = ".img"
	snapshotSuffix = ".snap"
)

// lunOrder is the order in which a volume tries the target's LUNs: from a
// start derived from its name ID, upwards and around, so volumes spread
// over the LUNs and each name always probes the same sequence.
func lunOrder(nameID string) [maxLUN + 1]int {
	sum := sha256.Sum256([]byte(nameID))
	start := int(sum[0])<<8 | int(sum[1])
	var order [maxLUN + 1]int
	for i := range order {
		order[i] = (start + i) % (maxLUN + 1)
	}
	return order
}

// volumeID is a volume's local ID.
func volumeID(nameID string, lun int) string { return nameID + "." + strconv.Itoa(lun) }

// parseVolumeID splits a volume's local ID; ok is false for an ID this
// module cannot have made.
func parseVolumeID(id string) (nameID string, lun int, ok bool) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 {
		return "", 0, false
	}
	nameID, num := id[:i], id[i+1:]
	lun, ok = parseLUN(num)
	if !ok || !sdk.ValidNameID(nameID) {
		return "", 0, false
	}
	return nameID, lun, true
}

// parseLUN reads a LUN number: decimal, 0 to maxLUN, without leading zeros.
func parseLUN(s string) (int, bool) {
	if s == "" || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxLUN {
		return 0, false
	}
	return n, true
}

// joinPath puts a file name into a folder.
func joinPath(dir, name string) string {
	if strings.HasSuffix(dir, "/") {
		return dir + name
	}
	return dir + "/" + name
}

// dirOf is the folder part of an absolute path.
func dirOf(path string) string {
	i := strings.LastIndexByte(path, '/')
	if i <= 0 {
		return "/"
	}
	return path[:i]
}

// baseOf is the last element of a path.
func baseOf(path string) string { return path[strings.LastIndexByte(path, '/')+1:] }

// hasRoot reports whether folder is one of the granted roots.
func hasRoot(roots []string, folder string) bool {
	for _, r := range roots {
		if c, err := sdk.PoolRoot(r); err == nil && c == folder {
			return true
		}
	}
	return false
}

// canonicalPortal reads "a.b.c.d[:port]" or "[ipv6][:port]" and answers
// "a.b.c.d:port" / "[ipv6]:port" with port 3260 when omitted. It checks
// the form only; the host checks the address for real.
func canonicalPortal(s string) (string, bool) { return netblock.CanonicalAddr(s, "3260") }

// grantedPortal reports whether a root names the canonical portal p.
func grantedPortal(roots []string, p string) bool { return netblock.GrantedAddr(roots, p, "3260") }

// grantedTarget reports whether a granted IQN prefix root leads to iqn.
func grantedTarget(roots []string, iqn string) bool {
	for _, r := range roots {
		if (strings.HasPrefix(r, "iqn.") || strings.HasPrefix(r, "eui.") || strings.HasPrefix(r, "naa.")) &&
			strings.HasPrefix(iqn, r) && iqn != r {
			return true
		}
	}
	return false
}

// checkIQN checks the form of an "iqn." name (RFC 7143: lower case letters,
// digits, '-', '.' and ':', at most 223 bytes) and answers why it is not
// one, or "".
func checkIQN(s string) string {
	if len(s) > 223 {
		return "longer than 223 bytes"
	}
	if !strings.HasPrefix(s, "iqn.") || len(s) < len("iqn.yyyy-mm.x") || s[8] != '-' || s[11] != '.' {
		return "want iqn.yyyy-mm.reversed.domain[:name], e.g. iqn.2024-01.com.example:volumes"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == ':') {
			return "only lower case letters, digits, '-', '.' and ':' are allowed"
		}
	}
	return ""
}

// printableNoSpace reports whether s is printable ASCII without spaces.
func printableNoSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return s != ""
}

// itoa formats an int64 without fmt.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
