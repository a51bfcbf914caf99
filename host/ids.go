package host

import (
	"net/url"
	"regexp"
	"strings"
)

// Volume and snapshot IDs name their backend so that every call after
// CreateVolume routes without a lookup: "<backend>:<local ID>". Backend
// names are module file names ([a-z0-9][a-z0-9-]*); local IDs are chosen by
// the module from [A-Za-z0-9._-].
const idSeparator = ":"

var (
	backendNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	localIDRE     = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
)

func makeID(backend, local string) string { return backend + idSeparator + local }

// splitID parses an ID; ok is false for an ID wasmcsi cannot have issued.
func splitID(id string) (backend, local string, ok bool) {
	backend, local, ok = strings.Cut(id, idSeparator)
	if !ok || !backendNameRE.MatchString(backend) || !localIDRE.MatchString(local) {
		return "", "", false
	}
	return backend, local, true
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
