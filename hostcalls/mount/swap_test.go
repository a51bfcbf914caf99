package mount_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// TestBindingsSwappedLink: a module binds a folder inside a volume whose
// content a workload writes, and the workload keeps swapping that folder
// for a symlink to "/" (renameat2 RENAME_EXCHANGE, atomic). Whatever the
// moment of the swap, mount_bind either binds the folder or refuses:
// never "/" on the target. The check reads paths; the mount must go by a
// descriptor opened beneath the root. The same holds for a folder on the
// target's way. It holds as well where openat2 is missing or filtered and
// paths are walked one component at a time.
func TestBindingsSwappedLink(t *testing.T) {
	mounttest.RequireRoot(t)
	t.Run("openat2", swappedLink)
	t.Run("walk", func(t *testing.T) {
		mount.WithoutOpenat2(t)
		swappedLink(t)
	})
}

func swappedLink(t *testing.T) {
	pool := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{pool}}
	vol := filepath.Join(pool, "vol")
	for _, d := range []string{filepath.Join(vol, "sub"), filepath.Join(vol, "tdir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"sublink", "tlink"} {
		if err := os.Symlink("/", filepath.Join(vol, l)); err != nil {
			t.Fatal(err)
		}
	}
	var rootSt unix.Stat_t
	if err := unix.Stat("/", &rootSt); err != nil {
		t.Fatal(err)
	}

	// Whatever is left mounted below the pool goes when the test ends,
	// also when it fails half-way; so do folders a bind made at "/".
	var outside []string
	t.Cleanup(func() {
		ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(pool))
		slices.SortFunc(ms, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
		for _, m := range ms {
			_ = unix.Unmount(m.Mountpoint, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
		for _, o := range outside {
			_ = unix.Unmount(o, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
			_ = os.Remove(o)
		}
	})

	// The workload: swap sub <-> sublink and tdir <-> tlink, over and over.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, pair := range [][2]string{{"sub", "sublink"}, {"tdir", "tlink"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_ = unix.Renameat2(unix.AT_FDCWD, filepath.Join(vol, pair[0]), unix.AT_FDCWD, filepath.Join(vol, pair[1]), unix.RENAME_EXCHANGE)
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	if err := os.MkdirAll(filepath.Join(pool, "ok"), 0o755); err != nil {
		t.Fatal(err)
	}

	var ch abi.MountChange
	bound, refused := 0, 0
	deadline := time.Now().Add(4 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		name := "wasmcsi-swap-test-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(i)
		for _, tc := range []struct{ src, target string }{
			{filepath.Join(vol, "sub"), filepath.Join(pool, "t", name)},
			{filepath.Join(pool, "ok"), filepath.Join(vol, "tdir", name)},
		} {
			err := hostCall(t, env, abi.HostCallMountBind, &abi.MountBindRequest{Source: tc.src, Target: tc.target}, &ch)
			if _, serr := os.Lstat(filepath.Join("/", name)); serr == nil {
				outside = append(outside, filepath.Join("/", name))
				t.Fatalf("mount_bind %s on %s made %s, outside the pool (err %v)", tc.src, tc.target, filepath.Join("/", name), err)
			}
			if err != nil {
				refused++
				continue
			}
			bound++
			if tc.target == filepath.Join(pool, "t", name) {
				var st unix.Stat_t
				escaped := unix.Stat(tc.target, &st) == nil && st.Dev == rootSt.Dev && st.Ino == rootSt.Ino
				_ = unix.Unmount(tc.target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
				if escaped {
					t.Fatalf("after %d binds: mount_bind %s bound \"/\" on %s", bound, tc.src, tc.target)
				}
			}
		}
	}
	t.Logf("%d binds, %d refused while the links were swapped", bound, refused)
	if bound == 0 {
		t.Error("no bind succeeded: the test exercised nothing")
	}
}
