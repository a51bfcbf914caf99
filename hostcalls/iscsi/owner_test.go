package iscsi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// fakeDisks makes a sysfs tree with a local disk sda (8:0) and two disks
// of an iSCSI session to 192.0.2.1:3260, sdq (8:16) and sdr (8:32), which
// a device-mapper device holds, and block nodes of the three in nodes/.
func fakeDisks(t *testing.T) (sys Sysfs, nodes string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes block device nodes")
	}
	root := t.TempDir()
	nodes = filepath.Join(root, "nodes")
	write := func(path, v string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disk := func(name, dir string, major, minor uint32, holder string) {
		t.Helper()
		d := filepath.Join(root, dir, "block", name)
		write(filepath.Join(d, "dev"), fmtDev(major, minor))
		write(filepath.Join(d, "device", "wwid"), "naa.6001405"+name)
		if err := os.MkdirAll(filepath.Join(d, "holders"), 0o755); err != nil {
			t.Fatal(err)
		}
		if holder != "" {
			write(filepath.Join(d, "holders", holder), "")
		}
		cls := filepath.Join(root, "class", "block")
		if err := os.MkdirAll(cls, 0o755); err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(cls, d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(rel, filepath.Join(cls, name)); err != nil {
			t.Fatal(err)
		}
		node(t, filepath.Join(nodes, name), major, minor)
	}
	disk("sda", "devices/pci0000:00/ata1/host0/target0:0:0/0:0:0:0", 8, 0, "")
	disk("sdq", "devices/platform/host3/session3/target3:0:0/3:0:0:0", 8, 16, "")
	disk("sdr", "devices/platform/host3/session3/target3:0:0/3:0:0:1", 8, 32, "dm-0")
	conn := filepath.Join(root, "class", "iscsi_connection", "connection3:0")
	write(filepath.Join(conn, "persistent_address"), "192.0.2.1")
	write(filepath.Join(conn, "persistent_port"), "3260")
	return Sysfs{Root: root}, nodes
}

func fmtDev(major, minor uint32) string { return fmt.Sprintf("%d:%d", major, minor) }

func node(t *testing.T, path string, major, minor uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Skipf("cannot make a device node here: %v", err)
	}
}

// TestOwnsDeviceByNumber: an iSCSI disk is claimed by the device number of
// the node named and the session sysfs places it in; a node that only
// bears the disk's name, a by-path name that leads to a local disk, and a
// disk a device-mapper device holds are not, unless the disk is a recorded
// stage's checked again: then a holder (multipathd, a workload's LVM) does
// not make it another's.
func TestOwnsDeviceByNumber(t *testing.T) {
	sys, nodes := fakeDisks(t)
	o := owner{sys}
	planted := filepath.Join(t.TempDir(), "sdq")
	node(t, planted, 8, 0) // named sdq, but the local disk
	byPath := "/dev/disk/by-path/ip-192.0.2.1:3260-iscsi-iqn.2024-01.test:t-lun-0"
	granted := []string{"192.0.2.1:3260"}
	for _, c := range []struct {
		what  string
		d     hostcalls.Device
		roots []string
		want  bool
		id    string
	}{
		{"a disk of a granted portal", hostcalls.Device{Path: byPath, Real: filepath.Join(nodes, "sdq")}, granted, true, "wwid:naa.6001405sdq"},
		{"a disk of a portal not granted", hostcalls.Device{Path: byPath, Real: filepath.Join(nodes, "sdq")}, []string{"192.0.2.2:3260"}, false, ""},
		{"a root that only starts like the portal", hostcalls.Device{Path: filepath.Join(nodes, "sdq"), Real: filepath.Join(nodes, "sdq")}, []string{"192.0.2.1:326"}, false, ""},
		{"a node named like the disk, of another device", hostcalls.Device{Path: planted, Real: planted}, granted, false, ""},
		{"a by-path name leading to a local disk", hostcalls.Device{Path: byPath, Real: filepath.Join(nodes, "sda")}, granted, false, ""},
		{"a disk a pool is built on", hostcalls.Device{Path: filepath.Join(nodes, "sdr"), Real: filepath.Join(nodes, "sdr")}, granted, false, ""},
		{"asked by name", hostcalls.Device{Path: byPath}, granted, false, ""},
		{"a staged disk, held (multipathd, a workload's LVM)", hostcalls.Device{Path: filepath.Join(nodes, "sdr"), Real: filepath.Join(nodes, "sdr"), Staged: true}, granted, true, "wwid:naa.6001405sdr"},
		{"a staged disk, held, of a portal not granted", hostcalls.Device{Path: filepath.Join(nodes, "sdr"), Real: filepath.Join(nodes, "sdr"), Staged: true}, []string{"192.0.2.2:3260"}, false, ""},
		{"a staged disk, its node of another device", hostcalls.Device{Path: planted, Real: planted, Staged: true}, granted, false, ""},
	} {
		id, owned, err := o.OwnsDevice(context.Background(), c.d, c.roots)
		if err != nil || owned != c.want || id != c.id {
			t.Errorf("%s: %q, owned %v, %v; want %q, %v", c.what, id, owned, err, c.id, c.want)
		}
	}
}

// TestOwnsDeviceIdentityWithoutWWID: a target that reports no WWID still
// gives each disk an identity of its own, its portal, target and LUN, so
// that a staged disk's check again tells it from another volume's disk a
// reboot put under the same name (with an empty identity any disk of the
// portal would pass).
func TestOwnsDeviceIdentityWithoutWWID(t *testing.T) {
	sys, nodes := fakeDisks(t)
	for _, name := range []string{"sdq", "sdr"} {
		link, err := os.Readlink(filepath.Join(sys.Root, "class", "block", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(sys.Root, "class", "block", link, "device", "wwid")); err != nil {
			t.Fatal(err)
		}
	}
	sess := filepath.Join(sys.Root, "class", "iscsi_session", "session3")
	if err := os.MkdirAll(sess, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sess, "targetname"), []byte("iqn.2024-01.test:t\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := owner{sys}
	granted := []string{"192.0.2.1:3260"}
	for _, c := range []struct {
		name string
		want string
	}{{"sdq", "lun:192.0.2.1:3260,iqn.2024-01.test:t,0"}, {"sdr", "lun:192.0.2.1:3260,iqn.2024-01.test:t,1"}} {
		id, owned, err := o.OwnsDevice(context.Background(), hostcalls.Device{Path: filepath.Join(nodes, c.name), Real: filepath.Join(nodes, c.name), Staged: true}, granted)
		if err != nil || !owned || id != c.want {
			t.Errorf("%s without a WWID: %q, owned %v, %v; want %q", c.name, id, owned, err, c.want)
		}
	}
}
