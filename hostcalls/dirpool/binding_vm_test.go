package dirpool_test

import (
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/vmtest"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount/mounttest"
)

// TestBindingQuota drives a quota through the host calls on xfs with
// prjquota; it needs a kernel with xfs quota support (the VM tier has it).
func TestBindingQuota(t *testing.T) {
	mounttest.RequireRoot(t)
	if vmtest.InVM() {
		vmtest.Require(t, "loop", "xfs")
	}
	dev := mounttest.Loop(t, 320<<20)
	mounttest.Mkfs(t, "xfs", dev, "-q")
	root, err := mounttest.Mount(t, dev, "xfs", "prjquota")
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("needs a kernel with xfs quota support: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	var qs abi.DirQuotaSupport
	if err := hostCall(t, env, abi.HostCallDirQuotaSupported, &abi.DirRequest{Path: root}, &qs); err != nil || !qs.Supported {
		t.Fatalf("dir_quota_supported = %+v, %v", qs, err)
	}
	vol := filepath.Join(root, "vol")
	var empty abi.Empty
	if err := hostCall(t, env, abi.HostCallDirCreate, &abi.DirCreateRequest{Path: vol, QuotaBytes: 8 << 20}, &empty); err != nil {
		t.Fatal(err)
	}
	var sfs abi.DirStatfs
	if err := hostCall(t, env, abi.HostCallDirStatfs, &abi.DirRequest{Path: vol}, &sfs); err != nil || sfs.TotalBytes != 8<<20 {
		t.Fatalf("dir_statfs of a quota'd directory = %+v, %v; want 8 MiB total", sfs, err)
	}
	if err := hostCall(t, env, abi.HostCallDirSetQuota, &abi.DirQuotaRequest{Path: vol, QuotaBytes: 16 << 20}, &empty); err != nil {
		t.Fatal(err)
	}
	if err := hostCall(t, env, abi.HostCallDirStatfs, &abi.DirRequest{Path: vol}, &sfs); err != nil || sfs.TotalBytes != 16<<20 {
		t.Fatalf("dir_statfs after dir_set_quota = %+v, %v; want 16 MiB total", sfs, err)
	}
	if err := hostCall(t, env, abi.HostCallDirRemove, &abi.DirRequest{Path: vol}, &empty); err != nil {
		t.Fatal(err)
	}
}
