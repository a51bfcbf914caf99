package iscsi

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/netaddr"
)

// DefaultPort is the iSCSI port a portal without one uses (RFC 7143).
const DefaultPort = 3260

// MaxLUN is the highest LUN this package addresses. LUNs up to 255 use SCSI
// peripheral addressing, in which the kernel's LUN number (the last field of
// H:C:T:L in sysfs) equals the target's LUN; above that the encodings differ.
const MaxLUN = 255

// maxNameLen is the longest iSCSI name in bytes (RFC 7143, section 4.2.7.1).
const maxNameLen = 223

// ValidateName checks that name is an iSCSI name in one of the three forms
// of RFC 7143: "iqn.YYYY-MM.reversed.domain[:anything]" (lower case letters,
// digits, '-', '.' and ':' only, as stringprep leaves them), "eui." followed
// by 16 hex digits, or "naa." followed by 16 or 32 hex digits.
func ValidateName(name string) error {
	if err := validateName(name); err != "" {
		return abi.Errorf(abi.InvalidArgument, "iSCSI name %q: %s", name, err)
	}
	return nil
}

func validateName(name string) string {
	if len(name) > maxNameLen {
		return "longer than 223 bytes"
	}
	switch {
	case strings.HasPrefix(name, "iqn."):
		return validateIQN(name[len("iqn."):])
	case strings.HasPrefix(name, "eui."):
		if !isHex(name[4:]) || len(name[4:]) != 16 {
			return "eui. must be followed by 16 hex digits"
		}
		return ""
	case strings.HasPrefix(name, "naa."):
		if n := len(name[4:]); !isHex(name[4:]) || (n != 16 && n != 32) {
			return "naa. must be followed by 16 or 32 hex digits"
		}
		return ""
	}
	return "must start with iqn., eui. or naa."
}

// validateIQN checks what follows "iqn.": a date, a reversed domain name
// and an optional ":"-separated unique part.
func validateIQN(s string) string {
	// YYYY-MM.
	if len(s) < 8 || s[4] != '-' || s[7] != '.' || !isDigits(s[:4]) || !isDigits(s[5:7]) {
		return "iqn. must be followed by a date YYYY-MM and a dot"
	}
	if m, _ := strconv.Atoi(s[5:7]); m < 1 || m > 12 {
		return "month out of range"
	}
	rest := s[8:]
	domain, unique, hasUnique := strings.Cut(rest, ":")
	if domain == "" {
		return "missing naming authority"
	}
	for _, label := range strings.Split(domain, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return "naming authority " + strconv.Quote(domain) + " is not a reversed domain name"
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !isLowerAlnum(c) && c != '-' {
				return "naming authority " + strconv.Quote(domain) + " has an invalid character"
			}
		}
	}
	if hasUnique {
		if unique == "" {
			return "empty unique part after ':'"
		}
		for i := 0; i < len(unique); i++ {
			if c := unique[i]; !isLowerAlnum(c) && c != '-' && c != '.' && c != ':' {
				return "character " + strconv.QuoteRune(rune(c)) + " is not allowed (lower case letters, digits, '-', '.', ':')"
			}
		}
	}
	return ""
}

// ParsePortal parses a portal "ipv4[:port]" or "[ipv6][:port]" into its
// canonical address and port. Host names, zones, and unspecified, multicast
// or broadcast addresses are refused: the portal names where a session goes
// and must mean one thing.
func ParsePortal(s string) (netip.AddrPort, error) {
	return netaddr.Parse("portal", s, DefaultPort)
}

// CHAP holds one-way CHAP credentials: the initiator proves itself to the
// target.
type CHAP struct {
	User   string
	Secret string
}

// Validate checks CHAP credentials: a user name of 1 to 255 printable ASCII
// characters without spaces, and a secret of 12 to 255 of them. RFC 7143
// asks for secrets of at least 12 bytes and targets such as LIO store both
// verbatim, so a trailing newline or space would silently change them.
func (c *CHAP) Validate() error {
	if n := len(c.User); n < 1 || n > 255 || !isPrintableNoSpace(c.User) {
		return abi.Errorf(abi.InvalidArgument, "CHAP user must be 1-255 printable ASCII characters without spaces")
	}
	if n := len(c.Secret); n < 12 || n > 255 || !isPrintableNoSpace(c.Secret) {
		return abi.Errorf(abi.InvalidArgument, "CHAP secret must be 12-255 printable ASCII characters without spaces")
	}
	return nil
}

// Target names one LUN behind an iSCSI target and how to log in to it.
type Target struct {
	// Portal is "ipv4[:port]" or "[ipv6][:port]"; the port defaults to 3260.
	Portal string
	// IQN is the target's iSCSI name (iqn., eui. or naa. form).
	IQN string
	// LUN is the logical unit, 0 to MaxLUN.
	LUN int
	// CHAP, when set, is used for the session's login.
	CHAP *CHAP
}

// sessionKey identifies one session: a target reached through one portal.
type sessionKey struct {
	Portal netip.AddrPort
	IQN    string
}

func (k sessionKey) String() string { return k.IQN + "@" + k.Portal.String() }

// portalArg is the portal as iscsiadm's -p wants it.
func (k sessionKey) portalArg() string { return k.Portal.String() }

// check validates t and returns its session key.
func (t *Target) check() (sessionKey, error) {
	ap, err := ParsePortal(t.Portal)
	if err != nil {
		return sessionKey{}, err
	}
	if err := ValidateName(t.IQN); err != nil {
		return sessionKey{}, err
	}
	if t.LUN < 0 || t.LUN > MaxLUN {
		return sessionKey{}, abi.Errorf(abi.InvalidArgument, "LUN %d out of range 0-%d", t.LUN, MaxLUN)
	}
	if t.CHAP != nil {
		if err := t.CHAP.Validate(); err != nil {
			return sessionKey{}, err
		}
	}
	return sessionKey{Portal: ap, IQN: t.IQN}, nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return s != ""
}

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isPrintableNoSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
