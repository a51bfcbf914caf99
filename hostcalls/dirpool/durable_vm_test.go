package dirpool

import (
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// TestQuotaDurableBeforeAnswer: a quota Create or SetQuota answered
// survives a power loss right after, on xfs and ext4, also when SetQuota
// found the limit already set by an earlier call cut off before its sync
// (the CO's retry after a daemon crash). Before, the limit waited for the
// next journal commit, and an expansion the CO had been told of came back
// as the old size.
func TestQuotaDurableBeforeAnswer(t *testing.T) {
	mounttest.RequireRoot(t)
	if vmtest.InVM() {
		vmtest.Require(t, "loop", "xfs", "ext4")
	}
	for _, tc := range []struct {
		fstype string
		mkfs   []string
	}{
		{"xfs", []string{"-q"}},
		{"ext4", []string{"-q", "-O", "quota,project"}},
	} {
		t.Run(tc.fstype, func(t *testing.T) {
			ctx := context.Background()
			dev := mounttest.Loop(t, fsBytes)
			mounttest.Mkfs(t, tc.fstype, dev, tc.mkfs...)
			mnt, err := mounttest.Mount(t, dev, tc.fstype, "prjquota")
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ESRCH) {
				t.Skipf("needs a kernel with %s project quotas: %v", tc.fstype, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			// Each step answers, then the power goes: the volume keeps
			// the quota it answered.
			steps := []struct {
				what string
				do   func(p *Pool) error
				want int64
			}{
				{"create with a quota", func(p *Pool) error {
					_, err := p.Create(ctx, "vol", 8*mib)
					return err
				}, 8 * mib},
				{"expansion", func(p *Pool) error { return p.SetQuota(ctx, "vol", 16*mib) }, 16 * mib},
				{"repeated expansion", func(p *Pool) error {
					// The cut-off call: its limit, without its sync.
					fd, err := p.openVolume("vol")
					if err != nil {
						return err
					}
					err = p.setQuotaLocked(ctx, "vol", fd, 24*mib)
					unix.Close(fd)
					if err != nil {
						return err
					}
					return p.SetQuota(ctx, "vol", 24*mib)
				}, 24 * mib},
			}
			for _, step := range steps {
				p, err := Open(mnt)
				must(t, err)
				if !p.QuotaSupported() {
					p.Close()
					t.Fatalf("no quota support: %s", p.noQuota)
				}
				err = step.do(p)
				p.Close()
				must(t, err)

				mounttest.PowerCut(t, dev, mnt, tc.fstype, "prjquota")
				p, err = Open(mnt)
				must(t, err)
				st, err := p.VolumeStatfs(ctx, "vol")
				p.Close()
				must(t, err)
				if st.TotalBytes != step.want {
					t.Errorf("%s, then a power cut: quota %d bytes, want the %d answered", step.what, st.TotalBytes, step.want)
				}
			}
		})
	}
}
