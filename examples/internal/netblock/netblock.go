// Package netblock holds what the network block modules (iscsi over LIO,
// nvmeof over nvmet) share: both export a file of a pool folder to nodes
// at a network address the operator granted, and both read that address
// from their configuration the same way; only the default port differs
// (3260 for iSCSI, 4420 for NVMe/TCP). It compiles with TinyGo: no fmt,
// no reflection.
package netblock

import (
	"strconv"
	"strings"
)

// CanonicalAddr reads "a.b.c.d[:port]" or "[ipv6][:port]" and answers
// "a.b.c.d:port" / "[ipv6]:port", with port def when omitted. It checks
// the form only; the host checks the address for real.
func CanonicalAddr(s, def string) (string, bool) {
	host, port := s, def
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", false
		}
		host = strings.ToLower(s[1:end])
		if rest := s[end+1:]; rest != "" {
			if rest[0] != ':' {
				return "", false
			}
			port = rest[1:]
		}
		if !strings.Contains(host, ":") || strings.Trim(host, "0123456789abcdef:.") != "" {
			return "", false
		}
		host = "[" + host + "]"
	} else {
		if i := strings.IndexByte(s, ':'); i >= 0 {
			host, port = s[:i], s[i+1:]
		}
		parts := strings.Split(host, ".")
		if len(parts) != 4 {
			return "", false
		}
		for i, p := range parts {
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 || n > 255 || p == "" || (len(p) > 1 && p[0] == '0') {
				return "", false
			}
			parts[i] = strconv.Itoa(n)
		}
		host = strings.Join(parts, ".")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || port[0] == '0' {
		return "", false
	}
	return host + ":" + port, true
}

// GrantedAddr reports whether a root names the canonical address p (roots
// written without a port get def).
func GrantedAddr(roots []string, p, def string) bool {
	for _, r := range roots {
		if c, ok := CanonicalAddr(r, def); ok && c == p {
			return true
		}
	}
	return false
}

// ListenAddrs reads a comma-separated list of addresses a target listens
// on, each granted; it answers the canonical addresses, or the bad entry.
func ListenAddrs(roots []string, list, def string) ([]string, string, bool) {
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		p, ok := CanonicalAddr(s, def)
		if !ok || !GrantedAddr(roots, p, def) {
			return nil, s, false
		}
		out = append(out, p)
	}
	return out, "", true
}
