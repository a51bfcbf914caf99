package main

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/sdk"
)

// Names. A volume's local ID is its name ID (sdk.NameID of the CSI name),
// its file in the pool "<local ID>.img" and its subsystem
// "<subsystem prefix><local ID>" with one namespace, NSID 1, whose UUID is
// derived from the subsystem's NQN. A snapshot's local ID is its name ID
// and its file "<local ID>.snap". Everything follows from the name, so a
// repeated CreateVolume finds the file and the subsystem of the first
// call, and nothing needs a record of its own.
const (
	volumeSuffix   = ".img"
	snapshotSuffix = ".snap"
	nsid           = 1
)

// subsystemNQN is a volume's subsystem.
func subsystemNQN(prefix, id string) string { return prefix + id }

// namespaceUUID derives a namespace's UUID (version 8, RFC 9562) from its
// subsystem's NQN: stable, so a re-created export has the same identity
// and the node finds the same disk.
func namespaceUUID(subsystem string) string {
	sum := sha256.Sum256([]byte("wasmcsi nvmeof namespace\x00" + subsystem))
	sum[6] = sum[6]&0x0f | 0x80
	sum[8] = sum[8]&0x3f | 0x80
	h := hex.EncodeToString(sum[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
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

// grantedPrefix reports whether a granted NQN prefix root leads to p (or
// is p).
func grantedPrefix(roots []string, p string) bool {
	for _, r := range roots {
		if strings.HasPrefix(r, "nqn.") && strings.HasPrefix(p, r) {
			return true
		}
	}
	return false
}

// checkNQNPrefix checks the form of a subsystem NQN prefix: "nqn.", then
// printable ASCII without spaces, commas, slashes or '=', leaving room for
// a volume ID within the 223 bytes of an NQN; it answers why not, or "".
func checkNQNPrefix(s string) string {
	if !strings.HasPrefix(s, "nqn.") || len(s) < len("nqn.yyyy-mm.x") {
		return "want nqn.yyyy-mm.reversed.domain:..., e.g. nqn.2024-01.com.example:volumes."
	}
	if len(s)+sdk.NameIDMax > 223 {
		return "too long: a volume's subsystem NQN (prefix and volume ID) must fit 223 bytes"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == ',' || c == '/' || c == '=' {
			return "character " + strconv.QuoteRune(rune(c)) + " is not allowed"
		}
	}
	return ""
}

// itoa formats an int64 without fmt.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
