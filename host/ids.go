package host

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	// maxMapLen is CSI's general limit for a map<string, string>
	// (volume_context, publish_context, a topology's segments), counted
	// as the bytes of its keys and values.
	maxMapLen = 4 << 10
	// maxTopologyPart bounds a topology key's prefix, its name, and a value.
	maxTopologyPart = 63
)

var (
	backendNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	// A local ID starts with a letter or digit, so it is never "." or "..",
	// a hidden name or an option ("-x") when a module uses it as a path
	// element or a program argument; it never holds a "/".
	localIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	// CSI's topology rules: a key is an optional DNS-style prefix, "/",
	// and a name; a name and a value begin and end with an alphanumeric.
	topologyNameRE   = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
	topologyPrefixRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)
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

// mapLen is the size of a map as CSI's limits count it.
func mapLen(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v)
	}
	return n
}

// checkContext checks a map a module answered for the CO (field names it,
// e.g. "volume_context") against CSI's 4 KiB: an oversized one could push
// a ListVolumes past gRPC's 4 MiB message limit.
func checkContext(backend, field string, m map[string]string) error {
	if n := mapLen(m); n > maxMapLen {
		return errf(codes.Internal, "backend %q answered a %s of %d bytes, over CSI's %d: refused; nothing was recorded", backend, field, n, maxMapLen)
	}
	return nil
}

// checkTopology checks the segments of a topology a module answered
// against CSI's rules for keys and values and its 4 KiB for a map.
func checkTopology(backend, field string, segs map[string]string) error {
	if err := checkContext(backend, field, segs); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return errf(codes.Internal, "backend %q answered a %s %s: refused; nothing was recorded", backend, field, fmt.Sprintf(format, args...))
	}
	lower := make(map[string]bool, len(segs))
	for k, v := range segs {
		prefix, name, ok := strings.Cut(k, "/")
		if !ok {
			prefix, name = "", k
		}
		switch {
		case ok && (len(prefix) > maxTopologyPart || !topologyPrefixRE.MatchString(prefix)):
			return bad("key %q whose prefix is not a DNS name of at most %d characters", truncate(k, 200), maxTopologyPart)
		case len(name) > maxTopologyPart || !topologyNameRE.MatchString(name):
			return bad("key %q whose name is not %d alphanumerics, '-', '_' or '.' at most, beginning and ending with an alphanumeric", truncate(k, 200), maxTopologyPart)
		case len(v) > maxTopologyPart || !topologyNameRE.MatchString(v):
			return bad("value %q for key %q: want at most %d alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric", truncate(v, 200), truncate(k, 200), maxTopologyPart)
		case lower[strings.ToLower(k)]:
			return bad("key %q twice, ignoring case", truncate(k, 200))
		}
		lower[strings.ToLower(k)] = true
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
