package dm

import (
	"bytes"
	"context"
	"testing"

	"golang.org/x/sys/unix"
)

// TestThinMessagesCommitBeforeReturn: what dm_thin_create,
// dm_thin_snapshot and dm_thin_delete change is committed to the pool's
// metadata device when the call returns, with no sync of ours: the roots
// of the pool's device and mapping trees in the superblock on the device,
// which the pool writes only at a commit, have changed. The host calls
// rely on this to answer durably (host/RATIONALE.md, "Durable before the
// answer").
func TestThinMessagesCommitBeforeReturn(t *testing.T) {
	p := newPool(t, "commit")
	ctx := context.Background()
	for _, step := range []struct {
		what string
		do   func() error
	}{
		{"create_thin", func() error { _, err := p.CreateThin(ctx, 1, 16*mib/SectorSize); return err }},
		{"create_snap", func() error { return p.Snapshot(ctx, 1, 2) }},
		{"delete", func() error { return p.DeleteThin(ctx, 2) }},
	} {
		before := superblockRoots(t, p.meta)
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		if after := superblockRoots(t, p.meta); bytes.Equal(before, after) {
			t.Errorf("%s returned, but the superblock on the metadata device still has the roots it had before", step.what)
		}
	}
}

// superblockRoots reads the data mapping and device details roots of the
// thin-pool superblock on dev (bytes 320 to 336), from the device itself
// (O_DIRECT: the pool writes past the page cache).
func superblockRoots(t *testing.T, dev string) []byte {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	if _, err := unix.Pread(fd, buf, 0); err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	if !parseSuperblock(buf).valid {
		t.Fatalf("%s holds no thin-pool superblock", dev)
	}
	return bytes.Clone(buf[320:336])
}
