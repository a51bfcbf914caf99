package mount

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// BenchmarkBindUnmount measures one bind mount plus its unmount: "api" is
// Bind and Unmount with their idempotency checks (open, stat, mount point
// probe, stacked-mount loop), "syscall" the two bare system calls.
func BenchmarkBindUnmount(b *testing.B) {
	mounttest.RequireRoot(b)
	ctx := context.Background()
	src := b.TempDir()
	target := filepath.Join(b.TempDir(), "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mounttest.Unmount(b, target) })

	b.Run("api", func(b *testing.B) {
		for b.Loop() {
			if _, err := Bind(ctx, src, target, false); err != nil {
				b.Fatal(err)
			}
			if _, err := Unmount(ctx, target); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("api-readonly", func(b *testing.B) {
		for b.Loop() {
			if _, err := Bind(ctx, src, target, true); err != nil {
				b.Fatal(err)
			}
			if _, err := Unmount(ctx, target); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("syscall", func(b *testing.B) {
		for b.Loop() {
			if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
				b.Fatal(err)
			}
			if err := unix.Unmount(target, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkInfo measures one Info of a tmpfs mount point by each path:
// "statmount" asks the kernel about that one mount, "mountinfo" reads the
// whole table. Each runs with the table as it is, then with 500 more
// mounts, as a Kubernetes node has.
func BenchmarkInfo(b *testing.B) {
	mounttest.RequireRoot(b)
	target := mounttest.Tmpfs(b, "size=1m")
	paths := infoPaths(b)
	run := func(b *testing.B, table string) {
		for _, p := range paths {
			b.Run(p.name+"/"+table, func(b *testing.B) {
				for b.Loop() {
					if _, err := p.info(target); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	run(b, "table-as-is")

	more := b.TempDir()
	for i := range 500 {
		dir := filepath.Join(more, fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { mounttest.Unmount(b, dir) })
		if err := unix.Mount(more, dir, "", unix.MS_BIND, ""); err != nil {
			b.Fatal(err)
		}
	}
	run(b, "500-more-mounts")
}
