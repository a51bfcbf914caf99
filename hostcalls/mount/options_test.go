package mount

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    []string
		flags uintptr
		data  string
		err   bool
	}{
		{"none", nil, 0, "", false},
		{"generic flags", []string{"ro", "noatime", "nodev", "nosuid", "noexec", "sync"},
			unix.MS_RDONLY | unix.MS_NOATIME | unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_SYNCHRONOUS, "", false},
		{"filesystem data kept in order", []string{"nouuid", "ro", "discard", "size=1g"}, unix.MS_RDONLY, "nouuid,discard,size=1g", false},
		{"later option wins", []string{"ro", "rw", "noexec", "exec", "relatime"}, unix.MS_RELATIME, "", false},
		{"fstab-only options dropped", []string{"defaults", "nofail", "_netdev", "x-systemd.automount", "comment=x", "noatime"}, unix.MS_NOATIME, "", false},
		{"comma smuggled", []string{"ro,exec"}, 0, "", true},
		{"NUL smuggled", []string{"a\x00b"}, 0, "", true},
		{"empty option", []string{""}, 0, "", true},
		{"bind is not Mount's", []string{"bind"}, 0, "", true},
		{"remount is not Mount's", []string{"remount"}, 0, "", true},
		{"propagation is not Mount's", []string{"rshared"}, 0, "", true},
		{"data over a page", []string{strings.Repeat("x", 4096)}, 0, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags, data, err := parseOptions(tc.in)
			if tc.err {
				if abi.CodeOf(err) != abi.InvalidArgument {
					t.Fatalf("parseOptions(%q) = %v, want InvalidArgument", tc.in, err)
				}
				return
			}
			if err != nil || flags != tc.flags || data != tc.data {
				t.Fatalf("parseOptions(%q) = %#x, %q, %v; want %#x, %q", tc.in, flags, data, err, tc.flags, tc.data)
			}
		})
	}
}
