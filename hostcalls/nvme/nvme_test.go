package nvme

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestHostNQN(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, v string) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	in := New(Config{Sysfs: filepath.Join(dir, "sys"), HostNQNFile: filepath.Join(dir, "nvme", "hostnqn"),
		HostIDFile: filepath.Join(dir, "nvme", "hostid"), MachineIDFile: filepath.Join(dir, "machine-id")})
	if _, err := in.HostNQN(); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("no source = %v, want FAILED_PRECONDITION", err)
	}
	write("machine-id", "0123456789abcdef0123456789abcdef\n")
	fromMachine, err := in.HostNQN()
	if err != nil || !strings.HasPrefix(fromMachine, "nqn.2014-08.org.nvmexpress:uuid:") {
		t.Fatalf("from machine-id = %q, %v", fromMachine, err)
	}
	if again, _ := in.HostNQN(); again != fromMachine {
		t.Fatalf("machine-id NQN not stable: %q, %q", fromMachine, again)
	}
	write("sys/class/dmi/id/product_uuid", "4C4C4544-0042-3510-8044-B4C04F4A4B31\n")
	if nqn, err := in.HostNQN(); err != nil || nqn != "nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0042-3510-8044-b4c04f4a4b31" {
		t.Fatalf("from DMI = %q, %v", nqn, err)
	}
	write("nvme/hostnqn", "nqn.2014-08.org.nvmexpress:uuid:file\n")
	if nqn, err := in.HostNQN(); err != nil || nqn != "nqn.2014-08.org.nvmexpress:uuid:file" {
		t.Fatalf("from the file = %q, %v", nqn, err)
	}
	write("nvme/hostnqn", "not an nqn\n")
	if _, err := in.HostNQN(); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("bad file = %v, want INVALID_ARGUMENT", err)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		nqn string
		ok  bool
	}{
		{"nqn.2024-01.dev.wasmcsi:v1", true},
		{"nqn.2024-01.dev.wasmcsi:a,b", false},
		{"nqn.2024-01.dev.wasmcsi:a/b", false},
		{"nqn.2024-01.dev.wasmcsi:a b", false},
		{"iqn.2024-01.dev.wasmcsi:v1", false},
		{"nqn." + strings.Repeat("x", 220), false},
	} {
		if err := ValidNQN(tc.nqn); (err == nil) != tc.ok {
			t.Errorf("ValidNQN(%q) = %v, want ok=%v", tc.nqn, err, tc.ok)
		}
	}
	if u, err := ParseUUID("0B5E3C8A-3F7E-4C1E-9D2A-6F4B8E1A2C3D"); err != nil || u != "0b5e3c8a-3f7e-4c1e-9d2a-6f4b8e1a2c3d" {
		t.Errorf("ParseUUID = %q, %v", u, err)
	}
	for _, bad := range []string{"", "00000000-0000-0000-0000-000000000000", "0b5e3c8a3f7e4c1e9d2a6f4b8e1a2c3d", "0b5e3c8a-3f7e-4c1e-9d2a-6f4b8e1a2c3g"} {
		if _, err := ParseUUID(bad); err == nil {
			t.Errorf("ParseUUID(%q) accepted", bad)
		}
	}
	for name, want := range map[string]bool{"nvme0n1": true, "nvme12n3": true, "nvme0c1n1": false, "nvme0n1p1": false, "nvme0": false, "sda": false} {
		if isHeadDisk(name) != want {
			t.Errorf("isHeadDisk(%q) = %v", name, !want)
		}
	}
}
