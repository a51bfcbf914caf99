package dm

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// SectorSize is the unit of every start, length and offset in a table.
const SectorSize = 512

// Target is one line of a device-mapper table: the sectors [Start,
// Start+Length) of the device are served by target Type with Params, e.g.
// {0, 2048, "linear", "7:0 0"}.
type Target struct {
	Start  uint64 // first sector
	Length uint64 // sectors
	Type   string // target type: linear, thin-pool, thin, zero, error, ...
	Params string // the target's constructor arguments
}

// String formats t the way `dmsetup table` prints it.
func (t Target) String() string {
	s := strconv.FormatUint(t.Start, 10) + " " + strconv.FormatUint(t.Length, 10) + " " + t.Type
	if t.Params != "" {
		s += " " + t.Params
	}
	return s
}

// TargetStatus is one target's line of a status answer: what
// `dmsetup status` prints. Status is the target's own status text.
type TargetStatus struct {
	Start  uint64
	Length uint64
	Type   string
	Status string
}

// ParseTable reads a table in dmsetup's text form, one target per line;
// blank lines and lines starting with # are skipped.
func ParseTable(text string) ([]Target, error) {
	var out []Target
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, abi.Errorf(abi.InvalidArgument, "table line %d: want <start> <length> <type> [params], got %q", i+1, line)
		}
		start, err1 := strconv.ParseUint(f[0], 10, 64)
		length, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, abi.Errorf(abi.InvalidArgument, "table line %d: start and length must be sector counts, got %q", i+1, line)
		}
		out = append(out, Target{Start: start, Length: length, Type: f[2], Params: strings.Join(f[3:], " ")})
	}
	if err := validTable(out); err != nil {
		return nil, err
	}
	return out, nil
}

// validTable checks what the kernel would refuse with a bare EINVAL, so that
// the caller learns which target is wrong: at least one target, targets
// contiguous from sector 0, non-empty lengths, type names that fit, no NUL
// or newline in parameters.
func validTable(table []Target) error {
	if len(table) == 0 {
		return abi.Errorf(abi.InvalidArgument, "table has no targets")
	}
	var next uint64
	for i, t := range table {
		switch {
		case t.Start != next:
			return abi.Errorf(abi.InvalidArgument, "target %d starts at sector %d, want %d (no gaps or overlaps)", i, t.Start, next)
		case t.Length == 0:
			return abi.Errorf(abi.InvalidArgument, "target %d has length 0", i)
		case t.Start+t.Length < t.Start:
			return abi.Errorf(abi.InvalidArgument, "target %d overflows the sector range", i)
		case t.Type == "" || len(t.Type) >= typeLen || strings.ContainsAny(t.Type, "\x00 \t\n"):
			return abi.Errorf(abi.InvalidArgument, "target %d has a bad type %q", i, t.Type)
		case strings.ContainsAny(t.Params, "\x00\n"):
			return abi.Errorf(abi.InvalidArgument, "target %d parameters contain NUL or newline", i)
		}
		next = t.Start + t.Length
	}
	return nil
}

// Size returns the number of sectors table covers.
func Size(table []Target) uint64 {
	if len(table) == 0 {
		return 0
	}
	last := table[len(table)-1]
	return last.Start + last.Length
}

// ValidName reports whether name may name a device-mapper device here:
// 1 to 127 bytes of [A-Za-z0-9#+-.:=@_] (libdevmapper's unmangled set),
// not "." or "..". Anything else would need mangling in /dev/mapper and in
// udev, or could walk out of /dev/mapper.
func ValidName(name string) error {
	if name == "" || len(name) >= nameLen {
		return abi.Errorf(abi.InvalidArgument, "dm name %q must have 1 to %d bytes", name, nameLen-1)
	}
	if name == "." || name == ".." {
		return abi.Errorf(abi.InvalidArgument, "dm name %q is not allowed", name)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return abi.Errorf(abi.InvalidArgument, "dm name %q: byte %q is outside [A-Za-z0-9#+-.:=@_]", name, name[i])
		}
	}
	return nil
}

func nameByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("#+-.:=@_", c) >= 0
}

// Confine returns nil when name is valid and starts with one of prefixes,
// the device-name grants of the caller; PermissionDenied otherwise. It is
// the device-mapper counterpart of hostcalls.Confine: every name this
// package handles passes through it.
func Confine(prefixes []string, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	for _, p := range prefixes {
		if p != "" && strings.HasPrefix(name, p) {
			return nil
		}
	}
	return abi.Errorf(abi.PermissionDenied, "dm name %q is outside the granted prefixes %q", name, prefixes)
}
