package sdk

import (
	"strconv"
	"strings"
)

// Size units.
const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30
	TiB = int64(1) << 40
)

// ParseSize reads a byte count from configuration or a parameter: a plain
// number of bytes, or a number with a binary suffix (Ki, Mi, Gi, Ti,
// optionally followed by B). Negative or overflowing values are refused.
func ParseSize(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	unit := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", KiB}, {"MiB", MiB}, {"GiB", GiB}, {"TiB", TiB}, {"Ki", KiB}, {"Mi", MiB}, {"Gi", GiB}, {"Ti", TiB}} {
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

// RoundUp rounds n up to a multiple of unit (unit > 0).
func RoundUp(n, unit int64) int64 {
	if r := n % unit; r != 0 {
		return n + unit - r
	}
	return n
}

// RoundDown rounds n down to a multiple of unit (unit > 0).
func RoundDown(n, unit int64) int64 { return n - n%unit }

// FormatSize formats a byte count for messages: "314572800 bytes (300 MiB)".
func FormatSize(n int64) string {
	s := strconv.FormatInt(n, 10) + " bytes"
	switch {
	case n >= GiB && n%GiB == 0:
		s += " (" + strconv.FormatInt(n/GiB, 10) + " GiB)"
	case n >= MiB && n%MiB == 0:
		s += " (" + strconv.FormatInt(n/MiB, 10) + " MiB)"
	}
	return s
}
