package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// Volume and storage health (CSI v1.13). The host reports what it can see
// itself (a backend that is not loaded, a staged mount or device that is
// gone) and adds what the backend's volume_health or storage_health says.

func healthEntries(es []abi.HealthEntry) []*csi.VolumeHealth_VolumeHealthEntry {
	out := make([]*csi.VolumeHealth_VolumeHealthEntry, 0, len(es))
	for _, e := range es {
		out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType(e.Status), Reason: e.Reason, Message: e.Message})
	}
	return out
}

// volumeHealth asks the backend about one volume (when it can) and adds the
// host's own findings.
func (s *Server) volumeHealth(ctx context.Context, id string, mreq abi.VolumeHealthRequest, backendName string) *csi.VolumeHealth {
	vh := &csi.VolumeHealth{VolumeId: id}
	b, ok := s.backends.Load().get(backendName)
	if !ok {
		vh.HealthStatuses = append(vh.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "BackendNotLoaded",
			Message: "backend " + backendName + " is not loaded",
		})
		return vh
	}
	vh.HealthStatuses = append(vh.HealthStatuses, rootsHealth(b.mod.Grant().Roots)...)
	if !b.has(abi.OpVolumeHealth) {
		return vh
	}
	var resp abi.HealthResponse
	if err := b.call(ctx, abi.OpVolumeHealth, &mreq, &resp); err != nil {
		vh.HealthStatuses = append(vh.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_UNKNOWN_VOLUME_HEALTH_TYPE, Reason: "HealthCheckFailed", Message: err.Error(),
		})
		return vh
	}
	vh.HealthStatuses = append(vh.HealthStatuses, healthEntries(resp.Entries)...)
	return vh
}

// rootsHealth reports what the host sees of a backend's folders: one whose
// filesystem the kernel made read-only (an I/O error aborted its journal,
// or an operator remounted it) keeps every volume in it from being
// written, and a backend that only stats its files would call it healthy.
// Device roots (/dev/...) and names (a device-mapper prefix) are the
// backend's to judge.
func rootsHealth(roots []string) []*csi.VolumeHealth_VolumeHealthEntry {
	var out []*csi.VolumeHealth_VolumeHealthEntry
	for _, r := range roots {
		if !filepath.IsAbs(r) || strings.HasPrefix(r, "/dev/") {
			continue
		}
		var st unix.Statfs_t
		switch err := unix.Statfs(r, &st); {
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
			continue
		case err != nil:
			out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_INACCESSIBLE,
				Reason: "PoolUnreachable", Message: fmt.Sprintf("statfs %s: %v", r, err)})
		case st.Flags&unix.ST_RDONLY != 0:
			out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_DEGRADED,
				Reason: "PoolReadOnly", Message: "the filesystem of " + r + " is read-only (an I/O error stopped the kernel writing it, or it was remounted read-only): the volume's data cannot change"})
		case st.Type == unix.EXT4_SUPER_MAGIC:
			if dev, n := ext4Errors(r); n > 0 {
				out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_DEGRADED,
					Reason: "PoolFilesystemErrors", Message: fmt.Sprintf("the ext4 filesystem of %s (%s) recorded %d errors: after a failed write the kernel stops writing it; check the disk, unmount and fsck", r, dev, n)})
			}
		}
	}
	return out
}

// ext4Errors returns the device of the ext4 filesystem holding dir and the
// errors the kernel counted on it (/sys/fs/ext4/<dev>/errors_count): after
// a write error aborts the journal, writes fail with EROFS while statfs
// may not yet say read-only.
func ext4Errors(dir string) (string, int) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", 0
	}
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return "", 0
	}
	dev := filepath.Base(link)
	b, err := os.ReadFile(filepath.Join("/sys/fs/ext4", dev, "errors_count"))
	if err != nil {
		return dev, 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return dev, n
}

// ControllerGetVolumeHealth reports one volume's health.
func (s *Server) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	v, err := s.store.GetVolume(id)
	if err != nil {
		return nil, s.absent(err, "volume", id)
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: s.volumeHealth(ctx, id, abi.VolumeHealthRequest{Volume: volumeRef(&v)}, v.Backend)}, nil
}

// ControllerListVolumeHealth pages through every volume's health.
func (s *Server) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, errf(codes.InvalidArgument, "max_entries is negative")
	}
	vols, next, err := s.store.ListVolumes(req.GetStartingToken(), int(req.GetMaxEntries()))
	if errors.Is(err, state.ErrBadToken) {
		return nil, errf(codes.Aborted, "starting_token %q is not valid", req.GetStartingToken())
	} else if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for i := range vols {
		resp.Entries = append(resp.Entries, s.volumeHealth(ctx, vols[i].ID, abi.VolumeHealthRequest{Volume: volumeRef(&vols[i])}, vols[i].Backend))
	}
	return resp, nil
}

// NodeGetVolumeHealth reports a volume's health on this node: its staging
// mount or device must be present, and the backend may add more.
func (s *Server) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	// The module sees the publish path: absolute and clean or refused.
	if err := optionalNodePath("volume_publish_path", req.GetVolumePublishPath()); err != nil {
		return nil, err
	}
	if err := optionalNodePath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	rec, err := s.store.GetStage(s.ephemeralVolumeID(id))
	if errors.Is(err, state.ErrNotFound) {
		return nil, errf(codes.NotFound, "volume %q is not on this node", id)
	} else if err != nil {
		return nil, err
	}
	mreq := abi.VolumeHealthRequest{
		Volume: nodeVolumeRef(rec.VolumeID, rec.VolumeContext), OnNode: true, Device: rec.Device,
		StagingPath: rec.StagingPath, PublishPath: req.GetVolumePublishPath(),
	}
	vh := s.volumeHealth(ctx, id, mreq, rec.Backend)
	if ok, err := s.stagePresent(ctx, &rec); err != nil || !ok {
		msg := "staging mount or device is gone"
		if err != nil {
			msg = err.Error()
		}
		vh.HealthStatuses = append(vh.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "StagingLost", Message: msg})
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: vh}, nil
}

// NodeGetStorageHealth gathers every backend's storage_health.
func (s *Server) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	for _, b := range s.backends.Load().all() {
		if !b.has(abi.OpStorageHealth) {
			continue
		}
		var hr abi.HealthResponse
		if err := b.call(ctx, abi.OpStorageHealth, &abi.Empty{}, &hr); err != nil {
			resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
				Status: csi.StorageHealthErrorType_UNKNOWN_STORAGE_HEALTH_ERROR_TYPE, Reason: "HealthCheckFailed", Message: b.name + ": " + err.Error(),
			})
			continue
		}
		for _, e := range hr.Entries {
			resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
				Status: csi.StorageHealthErrorType(e.Status), Reason: e.Reason, Message: b.name + ": " + e.Message,
			})
		}
	}
	return resp, nil
}
