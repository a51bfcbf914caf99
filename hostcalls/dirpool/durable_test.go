package dirpool

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// TestRepeatDurableBeforeAnswer: a Create or Remove that finds the folder
// already made or gone, by an earlier call cut off before its sync (the
// retry after a daemon crash), answers only once that is on disk: a power
// loss right after the answer leaves the folder made or gone.
func TestRepeatDurableBeforeAnswer(t *testing.T) {
	mounttest.RequireRoot(t)
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			ctx := context.Background()
			dev := mounttest.Loop(t, fsBytes)
			mounttest.Mkfs(t, fstype, dev, "-q")
			mnt, err := mounttest.Mount(t, dev, fstype, "")
			if err != nil {
				t.Fatal(err)
			}
			p, err := Open(mnt)
			must(t, err)
			_, err = p.Create(ctx, "removed", 0)
			must(t, err)
			// The cut-off calls: the mkdir and the rmdir, without their sync.
			must(t, os.Mkdir(filepath.Join(mnt, "created"), dirMode))
			must(t, os.Remove(filepath.Join(mnt, "removed")))
			_, err = p.Create(ctx, "created", 0)
			must(t, err)
			must(t, p.Remove(ctx, "removed"))
			p.Close()

			mounttest.PowerCut(t, dev, mnt, fstype, "")
			if _, err := os.Stat(filepath.Join(mnt, "created")); err != nil {
				t.Errorf("a repeated Create answered, then a power cut: %v", err)
			}
			if _, err := os.Stat(filepath.Join(mnt, "removed")); !os.IsNotExist(err) {
				t.Errorf("a repeated Remove answered, then a power cut: the folder is back (%v)", err)
			}
		})
	}
}
