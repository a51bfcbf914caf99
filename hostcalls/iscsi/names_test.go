package iscsi

import (
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"iqn.2024-01.dev.wasmcsi:t1", true},
		{"iqn.1993-08.org.debian:01:vmtest-guest", true},
		{"iqn.2003-01.org.linux-iscsi.host.x8664:sn.1234abcd", true},
		{"iqn.2024-12.com.example", true},
		{"iqn.2024-01.com.example:a.b-c:d", true},
		{"eui.02004567A425678D", true},
		{"eui.02004567a425678d", true},
		{"naa.52004567BA64678D", true},
		{"naa.62004567BA64678D0123456789ABCDEF", true},
		{"iqn." + "2024-01.com.example:" + strings.Repeat("a", 223-len("iqn.2024-01.com.example:")), true},

		{"", false},
		{"iqn.", false},
		{"IQN.2024-01.com.example", false},
		{"iqn.2024-01.Com.example", false},        // upper case
		{"iqn.2024-01.com.example:Target", false}, // upper case in unique part
		{"iqn.2024-13.com.example", false},        // month
		{"iqn.2024-00.com.example", false},
		{"iqn.24-01.com.example", false},
		{"iqn.2024-01com.example", false},
		{"iqn.2024-01.", false},
		{"iqn.2024-01..example", false},
		{"iqn.2024-01.-com.example", false},
		{"iqn.2024-01.com.example:", false},
		{"iqn.2024-01.com.example:a b", false},
		{"iqn.2024-01.com.example:a/b", false},
		{"iqn.2024-01.com.example:a_b", false},
		{"iqn.2024-01.com.example:a\n", false},
		{"iqn.2024-01.com.exa$mple", false},
		{"eui.02004567A425678", false},   // 15 digits
		{"eui.02004567A425678DD", false}, // 17 digits
		{"eui.02004567A425678G", false},
		{"naa.52004567BA64678", false},
		{"naa.52004567BA64678D0", false},
		{"iqn." + "2024-01.com.example:" + strings.Repeat("a", 224-len("iqn.2024-01.com.example:")), false},
		{"-iqn.2024-01.com.example", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateName(tc.name)
			if tc.ok && err != nil {
				t.Fatalf("ValidateName(%q) = %v, want nil", tc.name, err)
			}
			if !tc.ok {
				if err == nil {
					t.Fatalf("ValidateName(%q) = nil, want error", tc.name)
				}
				if abi.CodeOf(err) != abi.InvalidArgument {
					t.Fatalf("code = %v, want INVALID_ARGUMENT", abi.CodeOf(err))
				}
			}
		})
	}
}

func TestParsePortal(t *testing.T) {
	tests := []struct {
		in   string
		want string // canonical; "" means error
	}{
		{"127.0.0.1", "127.0.0.1:3260"},
		{"127.0.0.1:3260", "127.0.0.1:3260"},
		{"192.0.2.10:860", "192.0.2.10:860"},
		{"[fd00::1]", "[fd00::1]:3260"},
		{"[fd00::1]:3261", "[fd00::1]:3261"},
		{"[FD00:0::1]:3261", "[fd00::1]:3261"},
		{"[::1]:3260", "[::1]:3260"},

		{"", ""},
		{"example.com", ""},
		{"example.com:3260", ""},
		{"fd00::1", ""},
		{"fd00::1:3260", ""},
		{"[fd00::1", ""},
		{"[fd00::1]3260", ""},
		{"[fd00::1]:", ""},
		{"[127.0.0.1]:3260", ""},
		{"[fe80::1%eth0]:3260", ""},
		{"[::ffff:127.0.0.1]:3260", ""},
		{"127.0.0.1:", ""},
		{"127.0.0.1:0", ""},
		{"127.0.0.1:65536", ""},
		{"127.0.0.1:+80", ""},
		{"127.0.0.1:3260x", ""},
		{"127.0.0.1:003260", ""},
		{"0.0.0.0:3260", ""},
		{"[::]:3260", ""},
		{"224.0.0.1:3260", ""},
		{"255.255.255.255:3260", ""},
		{"1.2.3:3260", ""},
		{" 127.0.0.1:3260", ""},
		{"127.0.0.1:3260 ", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			ap, err := ParsePortal(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("ParsePortal(%q) = %v, want error", tc.in, ap)
				}
				if abi.CodeOf(err) != abi.InvalidArgument {
					t.Fatalf("code = %v, want INVALID_ARGUMENT", abi.CodeOf(err))
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePortal(%q): %v", tc.in, err)
			}
			if ap.String() != tc.want {
				t.Fatalf("ParsePortal(%q) = %s, want %s", tc.in, ap, tc.want)
			}
		})
	}
}

func TestCHAPValidate(t *testing.T) {
	tests := []struct {
		name string
		c    CHAP
		ok   bool
	}{
		{"good", CHAP{User: "user1", Secret: "secret123456"}, true},
		{"long secret", CHAP{User: "u", Secret: strings.Repeat("s", 255)}, true},
		{"empty user", CHAP{User: "", Secret: "secret123456"}, false},
		{"short secret", CHAP{User: "u", Secret: "secret12345"}, false},
		{"secret too long", CHAP{User: "u", Secret: strings.Repeat("s", 256)}, false},
		{"space in user", CHAP{User: "a b", Secret: "secret123456"}, false},
		{"newline in secret", CHAP{User: "u", Secret: "secret123456\n"}, false},
		{"non-ascii", CHAP{User: "ü", Secret: "secret123456"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && strings.Contains(err.Error(), tc.c.Secret) {
				t.Fatalf("error %q leaks the secret", err)
			}
		})
	}
}

func TestTargetCheck(t *testing.T) {
	good := Target{Portal: "127.0.0.1", IQN: "iqn.2024-01.dev.wasmcsi:t1", LUN: 3}
	k, err := good.check()
	if err != nil {
		t.Fatal(err)
	}
	if k.String() != "iqn.2024-01.dev.wasmcsi:t1@127.0.0.1:3260" {
		t.Fatalf("key = %s", k)
	}
	for _, lun := range []int{-1, MaxLUN + 1} {
		bad := good
		bad.LUN = lun
		if _, err := bad.check(); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("LUN %d: err = %v, want INVALID_ARGUMENT", lun, err)
		}
	}
	bad := good
	bad.CHAP = &CHAP{User: "u", Secret: "short"}
	if _, err := bad.check(); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("bad CHAP: err = %v, want INVALID_ARGUMENT", err)
	}
}
