// Package netaddr parses and grants the network addresses of the storage
// network families: iSCSI portals and NVMe/TCP addresses have the same
// shape ("ipv4[:port]", "[ipv6][:port]") and the same grants (an equal
// address, or an address prefix), only their default ports differ.
package netaddr

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Parse parses what ("portal", "address") s, "ipv4[:port]" or
// "[ipv6][:port]", into its canonical address and port, the port
// defaulting to def. Host names, zones, and unspecified, multicast or
// broadcast addresses are refused: the address names where a connection
// goes and must mean one thing. Errors are INVALID_ARGUMENT.
func Parse(what, s string, def uint16) (netip.AddrPort, error) {
	bad := func(why string) (netip.AddrPort, error) {
		return netip.AddrPort{}, abi.Errorf(abi.InvalidArgument, "%s %q: %s", what, s, why)
	}
	if s == "" {
		return bad("empty")
	}
	var host, port string
	switch {
	case s[0] == '[':
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return bad("missing ']'")
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if port[0] != ':' {
				return bad("junk after ']'")
			}
			port = port[1:]
			if port == "" {
				return bad("empty port")
			}
		}
		if !strings.Contains(host, ":") {
			return bad("brackets are only for IPv6 addresses")
		}
	case strings.Count(s, ":") > 1:
		return bad("IPv6 addresses must be written in brackets, e.g. [fd00::1]:" + strconv.Itoa(int(def)))
	default:
		var hasPort bool
		host, port, hasPort = strings.Cut(s, ":")
		if hasPort && port == "" {
			return bad("empty port")
		}
	}
	if strings.ContainsRune(host, '%') {
		return bad("zones are not allowed")
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return bad("not an IP address (host names are not allowed)")
	}
	if addr.Is4In6() {
		return bad("IPv4-mapped IPv6 addresses are not allowed; write the IPv4 address")
	}
	if addr.IsUnspecified() || addr.IsMulticast() || addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return bad("not a unicast address")
	}
	p := uint64(def)
	if port != "" {
		if !isDigits(port) || len(port) > 5 {
			return bad("port is not a number")
		}
		p, _ = strconv.ParseUint(port, 10, 32)
		if p == 0 || p > 65535 {
			return bad("port out of range")
		}
	}
	return netip.AddrPortFrom(addr, uint16(p)), nil
}

// ParseListen is Parse for an address a target listens on, which may
// also be the unspecified address of its family ("0.0.0.0:4420",
// "[::]:4420") with an explicit port.
func ParseListen(what, s string, def uint16) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().IsUnspecified() && ap.Port() != 0 {
		return ap, nil
	}
	return Parse(what, s, def)
}

// Granted reports whether one of roots allows ap: an equal address (the
// port defaulting to def), or an address prefix ("a.b.c.d/n", "x::/n")
// that contains its address. Roots that parse as neither allow nothing.
func Granted(roots []string, ap netip.AddrPort, def uint16) bool {
	for _, r := range roots {
		if strings.Contains(r, "/") {
			if p, err := netip.ParsePrefix(r); err == nil && p.Contains(ap.Addr()) {
				return true
			}
			continue
		}
		if rp, err := Parse("", r, def); err == nil && rp == ap {
			return true
		}
	}
	return false
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
