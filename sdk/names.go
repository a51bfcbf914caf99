package sdk

import (
	"crypto/sha256"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// nameSlugMax bounds the readable part of a NameID; the hash after it keeps
// IDs unique, so a long name loses only readability.
const nameSlugMax = 40

// nameHashHex is the length of NameID's hash part: 64 bits, so two names
// of one pool collide with odds of about n²/2⁶⁵.
const nameHashHex = 16

// NameIDMax is the longest NameID.
const NameIDMax = nameSlugMax + 1 + nameHashHex

// NameID derives a storage name from a CO's volume or snapshot name: a
// readable slug of the name in [a-z0-9-] (fallback when the name has no
// letter or digit), a dash, and the first 64 bits of the name's SHA-256 in
// hex. Different names give different IDs even when their slugs agree
// ("PVC_1" and "pvc-1"), a repeated name gives the same ID — so create
// operations are idempotent without any record — and no name, however
// hostile ("../x", "/"), yields a path element other than a plain name.
func NameID(name, fallback string) string {
	slug := make([]byte, 0, nameSlugMax)
	dash := false
	for i := 0; i < len(name) && len(slug) < nameSlugMax; i++ {
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
			if len(slug)+1 >= nameSlugMax {
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
	out := make([]byte, 0, len(slug)+1+nameHashHex)
	out = append(out, slug...)
	out = append(out, '-')
	for _, b := range sum[:nameHashHex/2] {
		out = append(out, digits[b>>4], digits[b&0x0f])
	}
	return string(out)
}

// ValidNameID reports whether id has NameID's shape: [a-z0-9-], not
// starting with a dash, at most NameIDMax bytes. A module checks IDs it is
// handed back before it builds a path from them.
func ValidNameID(id string) bool {
	if id == "" || len(id) > NameIDMax || id[0] == '-' {
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

// PoolRoot checks that a granted root is an absolute folder path other
// than "/" and drops trailing slashes.
func PoolRoot(root string) (string, error) {
	if !strings.HasPrefix(root, "/") {
		return "", &abi.Error{Code: abi.InvalidArgument, Message: "pool folder " + strconv.Quote(root) + " is not an absolute path"}
	}
	for len(root) > 1 && strings.HasSuffix(root, "/") {
		root = root[:len(root)-1]
	}
	if root == "/" {
		return "", &abi.Error{Code: abi.InvalidArgument, Message: "the root folder cannot be a pool folder"}
	}
	return root, nil
}
