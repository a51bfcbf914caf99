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
// the module and checked by the host (checkLocalID). An ID a daemon of role
// all made for a node-local backend also names that daemon's node, the
// only one holding its records: "<backend>@<node tag>:<local ID>"
// (RATIONALE.md, "Node-local volumes across nodes").
const (
	idSeparator  = ":"
	tagSeparator = "@"
)

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
	// maxReadableTag bounds a node name used as an ID's node tag as it is.
	maxReadableTag = 63
	// hashedTagLen is the length of a node tag made from a digest: "_"
	// and 64 bits of the node name's SHA-256 in hex.
	hashedTagLen = 1 + 16
)

var (
	backendNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	// A local ID starts with a letter or digit, so it is never "." or "..",
	// a hidden name or an option ("-x") when a module uses it as a path
	// element or a program argument; it never holds a "/".
	localIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	// A node tag is a node name of the local ID's characters, or "_" and
	// a digest, which no node name used as it is can equal.
	nodeTagRE = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9._-]{0,62}|_[0-9a-f]{16})$`)
	// CSI's topology rules: a key is an optional DNS-style prefix, "/",
	// and a name; a name and a value begin and end with an alphanumeric.
	topologyNameRE   = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
	topologyPrefixRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)
)

// makeID joins a backend, a node tag ("" for none) and a local ID.
func makeID(backend, tag, local string) string {
	if tag == "" {
		return backend + idSeparator + local
	}
	return backend + tagSeparator + tag + idSeparator + local
}

// nodeTag is the two forms a node's tag can take in an ID: the node name
// as it is, when its characters and length allow (else ""), and a digest
// of it. An ID takes the readable form when it fits CSI's 128 bytes, else
// the digest, so a long node name costs a module at most hashedTagLen+1
// bytes of its local ID.
type nodeTag struct{ readable, hashed string }

func newNodeTag(node string) nodeTag {
	var t nodeTag
	if len(node) <= maxReadableTag && localIDRE.MatchString(node) {
		t.readable = node
	}
	sum := sha256.Sum256([]byte(node))
	t.hashed = "_" + hex.EncodeToString(sum[:(hashedTagLen-1)/2])
	return t
}

// is reports whether tag names this node.
func (t nodeTag) is(tag string) bool { return tag != "" && (tag == t.readable || tag == t.hashed) }

// id makes the ID of a new volume or snapshot: tagged with the node when
// tag is set, in the first form that fits CSI's 128 bytes.
func (t *nodeTag) id(backend, local string) string {
	if t == nil {
		return makeID(backend, "", local)
	}
	if id := makeID(backend, t.readable, local); t.readable != "" && len(id) <= maxIDLen {
		return id
	}
	return makeID(backend, t.hashed, local)
}

// checkLocalID checks a local ID a module answered for a new volume or
// snapshot: its characters, and that the whole ID, with the node tag the
// daemon adds (tag, nil for none), fits CSI's 128 bytes.
func checkLocalID(backend string, tag *nodeTag, what, local string) error {
	switch {
	case !localIDRE.MatchString(local):
		return errf(codes.Internal, "backend %q answered an invalid %s local ID %q: want %s", backend, what, truncate(local, 200), localIDRE)
	case len(tag.id(backend, local)) > maxIDLen:
		id := tag.id(backend, local)
		return errf(codes.Internal, "backend %q answered a %s local ID of %d bytes: %q is longer than CSI's %d bytes", backend, what, len(local), truncate(id, 200), maxIDLen)
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
// tag is the node tag of a tagged ID, "" for an untagged one.
func splitID(id string) (backend, tag, local string, ok bool) {
	head, local, ok := strings.Cut(id, idSeparator)
	if !ok || len(id) > maxIDLen || !localIDRE.MatchString(local) {
		return "", "", "", false
	}
	backend, tag, tagged := strings.Cut(head, tagSeparator)
	if !backendNameRE.MatchString(backend) || (tagged && !nodeTagRE.MatchString(tag)) {
		return "", "", "", false
	}
	return backend, tag, local, true
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
