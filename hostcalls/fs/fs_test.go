package fs_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop/looptest"
)

const mib = 1 << 20

func requireTool(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			if _, err := os.Stat("/usr/sbin/" + name); err != nil {
				t.Skipf("needs %s (apt-get install e2fsprogs xfsprogs btrfs-progs): %v", name, err)
			}
		}
	}
}

// mount mounts dev on a fresh folder and unmounts it when the test ends.
func mount(t *testing.T, dev, fstype string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(dev, dir, fstype, 0, ""); err != nil {
		t.Fatalf("mount %s %s: %v", fstype, dev, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// blkidValue reads one tag of a device with blkid, independently of Probe.
func blkidValue(t *testing.T, dev, tag string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-o", "value", "-s", tag, dev).Output()
	if err != nil {
		t.Fatalf("blkid %s %s: %v", tag, dev, err)
	}
	return strings.TrimSpace(string(out))
}

func TestMakeProbeGrowStats(t *testing.T) {
	looptest.Require(t)
	requireTool(t, "blkid")
	ctx := context.Background()
	for _, tc := range []struct {
		fstype string
		tools  []string
		size   int64
		label  string
		inodes bool
	}{
		{fs.Ext4, []string{"mkfs.ext4", "resize2fs"}, 64 * mib, "ext4-volume-16ch", true},
		{fs.XFS, []string{"mkfs.xfs", "xfs_growfs"}, 320 * mib, "xfs-vol-12ch", true},
		{fs.Btrfs, []string{"mkfs.btrfs", "btrfs"}, 128 * mib, "btrfs volume", false},
	} {
		t.Run(tc.fstype, func(t *testing.T) {
			requireTool(t, tc.tools...)
			dev, file := looptest.Device(t, tc.size)

			if got, err := fs.Probe(ctx, dev); err != nil || got != "" {
				t.Fatalf("probe blank = %q, %v; want \"\"", got, err)
			}
			if got, err := fs.DeviceSize(ctx, dev); err != nil || got != tc.size {
				t.Fatalf("device size = %d, %v; want %d", got, err, tc.size)
			}
			const uuid = "0b6e4c4e-4d8a-4b57-9a57-5a1d4c1f7d2e"
			if err := fs.Make(ctx, dev, tc.fstype, fs.MakeOptions{Label: tc.label, UUID: uuid}); err != nil {
				t.Fatal(err)
			}
			if got, err := fs.Probe(ctx, dev); err != nil || got != tc.fstype {
				t.Fatalf("probe after make = %q, %v; want %q", got, err, tc.fstype)
			}
			if got := blkidValue(t, dev, "LABEL"); got != tc.label {
				t.Errorf("label = %q, want %q", got, tc.label)
			}
			if got := blkidValue(t, dev, "UUID"); got != uuid {
				t.Errorf("uuid = %q, want %q", got, uuid)
			}
			if err := fs.Make(ctx, dev, fs.Ext4, fs.MakeOptions{}); abi.CodeOf(err) != abi.FailedPrecondition {
				t.Fatalf("make over a filesystem = %v, want FAILED_PRECONDITION", err)
			}

			mnt := mount(t, dev, tc.fstype)
			before, err := fs.Stats(ctx, mnt)
			if err != nil {
				t.Fatal(err)
			}
			checkUsage(t, before, tc.size, tc.inodes)

			// Usage follows what is written.
			data := make([]byte, 8*mib)
			for i := range data {
				data[i] = byte(i*7 + i>>12)
			}
			if err := os.WriteFile(filepath.Join(mnt, "data"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			syncFS(t, mnt)
			written, err := fs.Stats(ctx, mnt)
			if err != nil {
				t.Fatal(err)
			}
			if grew := written.UsedBytes - before.UsedBytes; grew < 6*mib {
				t.Errorf("used grew by %d bytes after writing 8 MiB", grew)
			}

			// Grow the file, then the device, then the filesystem, online.
			if err := os.Truncate(file, 2*tc.size); err != nil {
				t.Fatal(err)
			}
			if size, err := loop.Resize(ctx, dev); err != nil || size != 2*tc.size {
				t.Fatalf("loop resize = %d, %v", size, err)
			}
			if tc.fstype == fs.Ext4 && !hasCapability(t, unix.CAP_SYS_RESOURCE) {
				t.Skip("needs CAP_SYS_RESOURCE: ext4 online resize (offline grow is TestGrowExt4Offline)")
			}
			if err := fs.Grow(ctx, dev, mnt, tc.fstype); err != nil {
				t.Fatal(err)
			}
			after, err := fs.Stats(ctx, mnt)
			if err != nil {
				t.Fatal(err)
			}
			checkUsage(t, after, 2*tc.size, tc.inodes)
			if after.TotalBytes < before.TotalBytes*3/2 {
				t.Fatalf("total after grow = %d, before %d: did not grow", after.TotalBytes, before.TotalBytes)
			}
			if got, err := os.ReadFile(filepath.Join(mnt, "data")); err != nil || string(got) != string(data) {
				t.Fatalf("data changed by grow: %v", err)
			}
		})
	}
}

// TestGrowExt4Offline grows an unmounted ext4, the path for a volume that
// is not staged, and also the only one in a sandbox without CAP_SYS_RESOURCE.
func TestGrowExt4Offline(t *testing.T) {
	looptest.Require(t)
	requireTool(t, "blkid", "mkfs.ext4", "e2fsck", "resize2fs")
	ctx := context.Background()
	dev, file := looptest.Device(t, 32*mib)
	if err := fs.Make(ctx, dev, fs.Ext4, fs.MakeOptions{}); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, fs.Ext4, 0, ""); err != nil {
		t.Fatal(err)
	}
	before, err := fs.Stats(ctx, mnt)
	unix.Unmount(mnt, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 96*mib); err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Resize(ctx, dev); err != nil {
		t.Fatal(err)
	}
	if err := fs.Grow(ctx, dev, "", fs.Ext4); err != nil {
		t.Fatal(err)
	}
	mnt = mount(t, dev, fs.Ext4)
	after, err := fs.Stats(ctx, mnt)
	if err != nil {
		t.Fatal(err)
	}
	checkUsage(t, after, 96*mib, true)
	if after.TotalBytes < 2*before.TotalBytes {
		t.Fatalf("total after offline grow = %d, before %d", after.TotalBytes, before.TotalBytes)
	}
	// Offline grow of a mounted filesystem is refused by the check.
	if err := fs.Grow(ctx, dev, "", fs.Ext4); err == nil {
		t.Fatal("offline grow of a mounted ext4 succeeded")
	}
}

func hasCapability(t *testing.T, c int) bool {
	t.Helper()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

func checkUsage(t *testing.T, u fs.Usage, size int64, inodes bool) {
	t.Helper()
	if u.TotalBytes <= size/2 || u.TotalBytes > size {
		t.Errorf("total %d bytes on a %d-byte device", u.TotalBytes, size)
	}
	if u.AvailableBytes <= 0 || u.AvailableBytes > u.TotalBytes || u.UsedBytes < 0 || u.UsedBytes > u.TotalBytes {
		t.Errorf("inconsistent usage %+v", u)
	}
	if inodes && (u.TotalInodes <= 0 || u.UsedInodes <= 0 || u.UsedInodes+u.FreeInodes != u.TotalInodes) {
		t.Errorf("inconsistent inodes %+v", u)
	}
}

func syncFS(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

func TestProbeFindsPartitionTable(t *testing.T) {
	looptest.Require(t)
	requireTool(t, "blkid", "mkfs.ext4")
	ctx := context.Background()
	dev, _ := looptest.Device(t, 16*mib)
	// An MBR with one Linux partition from sector 2048 to the end.
	var mbr [512]byte
	entry := mbr[446:]
	entry[4] = 0x83
	putLE32(entry[8:], 2048)
	putLE32(entry[12:], 16*mib/512-2048)
	mbr[510], mbr[511] = 0x55, 0xaa
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(mbr[:], 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, err := fs.Probe(ctx, dev); err != nil || got != "dos" {
		t.Fatalf("probe = %q, %v; want dos", got, err)
	}
	if err := fs.Make(ctx, dev, fs.Ext4, fs.MakeOptions{}); abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("make over a partition table = %v, want FAILED_PRECONDITION", err)
	}
}

func putLE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func TestMakeRefusesSmallDevice(t *testing.T) {
	looptest.Require(t)
	requireTool(t, "blkid")
	dev, _ := looptest.Device(t, 64*mib)
	if err := fs.Make(context.Background(), dev, fs.XFS, fs.MakeOptions{}); abi.CodeOf(err) != abi.OutOfRange {
		t.Fatalf("xfs on 64 MiB = %v, want OUT_OF_RANGE", err)
	}
	if got, err := fs.Probe(context.Background(), dev); err != nil || got != "" {
		t.Fatalf("refused make wrote %q (%v)", got, err)
	}
}

func TestArguments(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "regular")
	if err := os.WriteFile(file, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func() error
		want abi.Code
	}{
		{"make unknown type", func() error { return fs.Make(ctx, "/dev/null", "ntfs", fs.MakeOptions{}) }, abi.InvalidArgument},
		{"make empty type", func() error { return fs.Make(ctx, "/dev/null", "", fs.MakeOptions{}) }, abi.InvalidArgument},
		{"make type with junk", func() error { return fs.Make(ctx, "/dev/null", "ext4 -O x", fs.MakeOptions{}) }, abi.InvalidArgument},
		{"make xfs label too long", func() error {
			return fs.Make(ctx, "/dev/null", fs.XFS, fs.MakeOptions{Label: "thirteen-char"})
		}, abi.InvalidArgument},
		{"make label with newline", func() error {
			return fs.Make(ctx, "/dev/null", fs.Ext4, fs.MakeOptions{Label: "a\nb"})
		}, abi.InvalidArgument},
		{"make bad uuid", func() error {
			return fs.Make(ctx, "/dev/null", fs.Ext4, fs.MakeOptions{UUID: "-O ^has_journal"})
		}, abi.InvalidArgument},
		{"make on regular file", func() error { return fs.Make(ctx, file, fs.Ext4, fs.MakeOptions{}) }, abi.InvalidArgument},
		{"make on missing device", func() error {
			return fs.Make(ctx, "/dev/does-not-exist", fs.Ext4, fs.MakeOptions{})
		}, abi.NotFound},
		{"make on relative path", func() error { return fs.Make(ctx, "dev/loop0", fs.Ext4, fs.MakeOptions{}) }, abi.InvalidArgument},
		{"probe regular file", func() error { _, err := fs.Probe(ctx, file); return err }, abi.InvalidArgument},
		{"probe unclean path", func() error { _, err := fs.Probe(ctx, "/dev/../dev/null"); return err }, abi.InvalidArgument},
		{"grow unknown type", func() error { return fs.Grow(ctx, "/dev/null", "/mnt", "zfs") }, abi.InvalidArgument},
		{"grow xfs without mount path", func() error { return fs.Grow(ctx, "/dev/null", "", fs.XFS) }, abi.InvalidArgument},
		{"grow btrfs relative mount path", func() error { return fs.Grow(ctx, "/dev/null", "mnt", fs.Btrfs) }, abi.InvalidArgument},
		{"grow btrfs mount path is a file", func() error { return fs.Grow(ctx, "/dev/null", file, fs.Btrfs) }, abi.InvalidArgument},
		{"grow ext4 on regular file", func() error { return fs.Grow(ctx, file, "", fs.Ext4) }, abi.InvalidArgument},
		{"stats of missing path", func() error { _, err := fs.Stats(ctx, file+".missing"); return err }, abi.NotFound},
		{"device size of regular file", func() error { _, err := fs.DeviceSize(ctx, file); return err }, abi.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := abi.CodeOf(tc.run()); got != tc.want {
				t.Fatalf("code = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMinimumSize(t *testing.T) {
	for _, tc := range []struct {
		fstype string
		want   int64
		code   abi.Code
	}{
		{fs.Ext4, 1 * mib, abi.OK},
		{fs.XFS, 300 * mib, abi.OK},
		{fs.Btrfs, 114294784, abi.OK},
		{"vfat", 0, abi.InvalidArgument},
	} {
		got, err := fs.MinimumSize(tc.fstype)
		if got != tc.want || abi.CodeOf(err) != tc.code {
			t.Errorf("MinimumSize(%q) = %d, %v; want %d, %v", tc.fstype, got, err, tc.want, tc.code)
		}
	}
}

func TestStatsOfTempDir(t *testing.T) {
	dir := t.TempDir()
	u, err := fs.Stats(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if u.TotalBytes != int64(st.Blocks)*st.Frsize || u.TotalBytes <= 0 ||
		u.AvailableBytes > u.TotalBytes || u.UsedBytes > u.TotalBytes {
		t.Fatalf("usage %+v does not match statfs %+v", u, st)
	}
}
