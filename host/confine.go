package host

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/host/state"
)

// What a module's node_stage names is confined to its grants by the node
// seam (hostcalls/node, "ConfineDevice"): the host never takes it on trust.

func (s *Server) confineDirectory(b *backend, dir string) (string, error) {
	return s.node.ConfineDirectory(fmt.Sprintf("backend %q", b.name), b.mod.Grant().Roots, dir)
}

// bindDirectory binds dir, which confineDirectory accepted, at target by
// a descriptor opened beneath b's roots (node.BindDirectory).
func (s *Server) bindDirectory(ctx context.Context, b *backend, dir, target string, readOnly bool) error {
	return s.node.BindDirectory(ctx, fmt.Sprintf("backend %q", b.name), b.mod.Grant().Roots, dir, target, readOnly)
}

// confineDevice checks that dev is a device b's grants explain and
// returns its path and the identity the stage record keeps (a loop
// device's backing file "<st_dev>:<st_ino>", an iSCSI disk's WWID).
func (s *Server) confineDevice(ctx context.Context, b *backend, dev string) (real, file string, err error) {
	return s.node.ConfineDevice(ctx, fmt.Sprintf("backend %q", b.name), b.mod.Grant().Roots, dev)
}

// stagedDevice reports whether a recorded stage's device is still the
// volume's: granted, and for a loop device backed by the file it was
// staged with (a reboot frees loop devices, and the same /dev/loopN node
// may be unbound or back another file, even another volume's in the same
// pool). A device that something stacked on it now holds (a workload's
// dm-crypt or LVM on its raw block volume, multipathd) is still the
// volume's. A record without a device has none to lose.
func (s *Server) stagedDevice(ctx context.Context, b *backend, rec *state.Stage) bool {
	if rec.Device == "" {
		return true
	}
	return s.node.StagedDevice(ctx, fmt.Sprintf("backend %q", b.name), b.mod.Grant().Roots, rec.Device, rec.DeviceFile)
}

// stagePresent reports whether a recorded stage is still in place: its
// device must still be the volume's (stagedDevice), and for mount access
// the staging path must be mounted, from that device when there is one.
func (s *Server) stagePresent(ctx context.Context, rec *state.Stage) (bool, error) {
	b, ok := s.backends.Load().get(rec.Backend)
	if !ok {
		return false, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", rec.Backend, rec.VolumeID)
	}
	if !s.stagedDevice(ctx, b, rec) {
		return false, nil
	}
	if rec.Block {
		return rec.Device != "", nil
	}
	return s.node.StagedAt(rec.StagingPath, rec.Device), nil
}
