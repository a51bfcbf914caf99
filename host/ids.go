package host

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
)

// Volume and snapshot IDs name their backend so that every call after
// CreateVolume routes without a lookup: "<backend>:<local ID>". Backend
// names are module file names ([a-z0-9][a-z0-9_-]*); local IDs are chosen by
// the module and checked by the host (checkLocalID).
const idSeparator = ":"

// CSI's size limits for what the plugin hands the CO: 128 bytes for any
// string (volume, snapshot and group snapshot IDs), 256 for node_id.
const (
	maxIDLen     = 128
	maxNodeIDLen = 256
)

var (
	backendNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	// A local ID starts with a letter or digit, so it is never "." or "..",
	// a hidden name or an option ("-x") when a module uses it as a path
	// element or a program argument; it never holds a "/".
	localIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

func makeID(backend, local string) string { return backend + idSeparator + local }

// checkLocalID checks a local ID a module answered for a new volume or
// snapshot: its characters, and that the whole ID fits CSI's 128 bytes.
func checkLocalID(backend, what, local string) error {
	switch {
	case !localIDRE.MatchString(local):
		return errf(codes.Internal, "backend %q answered an invalid %s local ID %q: want %s", backend, what, truncate(local, 200), localIDRE)
	case len(makeID(backend, local)) > maxIDLen:
		return errf(codes.Internal, "backend %q answered a %s local ID of %d bytes: %q is longer than CSI's %d bytes", backend, what, len(local), truncate(makeID(backend, local), 200), maxIDLen)
	}
	return nil
}

// splitID parses an ID; ok is false for an ID wasmcsi cannot have issued.
func splitID(id string) (backend, local string, ok bool) {
	backend, local, ok = strings.Cut(id, idSeparator)
	if !ok || len(id) > maxIDLen || !backendNameRE.MatchString(backend) || !localIDRE.MatchString(local) {
		return "", "", false
	}
	return backend, local, true
}

// groupID is the ID of the group snapshot with the CO's name: readable
// while it fits CSI's 128 bytes, else a digest of the name (under another
// prefix, so it never equals a readable one).
func groupID(name string) string {
	if id := "group:" + name; len(id) <= maxIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(name))
	return "group#" + hex.EncodeToString(sum[:])
}

// Node IDs carry what the node's backends reported about it (e.g. an iSCSI
// initiator name) so the controller can act on it without a registry:
// "<node name>;<url-encoded context>". The separator is always present, so a
// node ID wasmcsi did not issue is recognised and answered NOT_FOUND.
const nodeSeparator = ";"

func makeNodeID(name string, ctx map[string]string) string {
	v := url.Values{}
	for k, val := range ctx {
		v.Set(k, val)
	}
	return name + nodeSeparator + v.Encode()
}

func parseNodeID(id string) (name string, ctx map[string]string, ok bool) {
	name, enc, ok := strings.Cut(id, nodeSeparator)
	if !ok || name == "" {
		return "", nil, false
	}
	v, err := url.ParseQuery(enc)
	if err != nil {
		return "", nil, false
	}
	ctx = map[string]string{}
	for k := range v {
		ctx[k] = v.Get(k)
	}
	return name, ctx, true
}
