package mount

import (
	"context"
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
