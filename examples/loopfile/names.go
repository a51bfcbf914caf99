package main

import (
	"crypto/sha256"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// File names in the pool: "<local ID>.img" for volumes, "<local ID>.snap"
// for snapshots.
const (
	volumeSuffix   = ".img"
	snapshotSuffix = ".snap"
)

// slugMax bounds the readable part of a local ID; the hash after it keeps
// IDs unique, so a long name loses only readability.
const slugMax = 40

// hashHex is the length of the hash part of a local ID: 64 bits, so that
// two names of one pool collide with odds of about n²/2⁶⁵.
const hashHex = 16

// localIDFor derives a volume's or snapshot's local ID from its CSI name:
// a readable slug of the name in [a-z0-9-] (fallback when the name has no
// letter or digit), a dash, and the first 64 bits of the name's SHA-256 in
// hex. Different names give different IDs even when their slugs agree
// ("PVC_1" and "pvc-1"), and a repeated name always gives the same ID, so
// CreateVolume and CreateSnapshot are idempotent without any record.
func localIDFor(name, fallback string) string {
	slug := make([]byte, 0, slugMax)
	dash := false
	for i := 0; i < len(name) && len(slug) < slugMax; i++ {
		c := name[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		default:
			dash = len(slug) > 0
			continue
		}
		if dash {
			if len(slug)+1 >= slugMax {
				break
			}
			slug = append(slug, '-')
			dash = false
		}
		slug = append(slug, c)
	}
	if len(slug) == 0 {
		slug = append(slug, fallback...)
	}
	sum := sha256.Sum256([]byte(name))
	const digits = "0123456789abcdef"
	out := make([]byte, 0, len(slug)+1+hashHex)
	out = append(out, slug...)
	out = append(out, '-')
	for _, b := range sum[:hashHex/2] {
		out = append(out, digits[b>>4], digits[b&0x0f])
	}
	return string(out)
}

// validLocalID reports whether id can be one of ours: [a-z0-9-], not
// starting with a dash, and short. Anything else never named a file here.
func validLocalID(id string) bool {
	if id == "" || len(id) > slugMax+1+hashHex || id[0] == '-' {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
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
func baseOf(path string) string {
	return path[strings.LastIndexByte(path, '/')+1:]
}

// cleanRoot checks that a granted root is an absolute folder path and drops
// trailing slashes.
func cleanRoot(root string) (string, error) {
	if !strings.HasPrefix(root, "/") {
		return "", abi.Errorf(abi.InvalidArgument, "pool folder "+strconv.Quote(root)+" is not an absolute path")
	}
	for len(root) > 1 && strings.HasSuffix(root, "/") {
		root = root[:len(root)-1]
	}
	if root == "/" {
		return "", abi.Errorf(abi.InvalidArgument, "the root folder cannot be a pool folder")
	}
	return root, nil
}

// Size units.
const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
	tib = int64(1) << 40
)

// parseSize reads a byte count: a plain number of bytes, or a number with a
// binary suffix (Ki, Mi, Gi, Ti, optionally followed by B).
func parseSize(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	unit := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", kib}, {"MiB", mib}, {"GiB", gib}, {"TiB", tib}, {"Ki", kib}, {"Mi", mib}, {"Gi", gib}, {"Ti", tib}} {
		if strings.HasSuffix(s, u.suffix) {
			s, unit = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/unit {
		return 0, false
	}
	return n * unit, true
}

// roundUp rounds n up to a multiple of unit (unit > 0).
func roundUp(n, unit int64) int64 {
	if r := n % unit; r != 0 {
		return n + unit - r
	}
	return n
}

// roundDown rounds n down to a multiple of unit (unit > 0).
func roundDown(n, unit int64) int64 { return n - n%unit }

// itoa formats an int64 without fmt.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// sizeString formats a byte count for messages: "314572800 bytes (300 MiB)".
func sizeString(n int64) string {
	s := itoa(n) + " bytes"
	switch {
	case n >= gib && n%gib == 0:
		s += " (" + itoa(n/gib) + " GiB)"
	case n >= mib && n%mib == 0:
		s += " (" + itoa(n/mib) + " MiB)"
	}
	return s
}

// errorf builds an *abi.Error from message parts.
func errorf(code abi.Code, parts ...string) error {
	return abi.Errorf(code, strings.Join(parts, ""))
}

// wrap adds what the module was doing to a host call's error and keeps its
// code, so the CO sees the host call's verdict (NOT_FOUND, ALREADY_EXISTS,
// RESOURCE_EXHAUSTED...) with the module's context.
func wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	code := abi.CodeOf(err)
	msg := err.Error()
	if e, ok := err.(*abi.Error); ok {
		msg = e.Message
	}
	if code == abi.Unknown {
		code = abi.Internal
	}
	return abi.Errorf(code, what+": "+msg)
}
