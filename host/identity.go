package host

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
)

// GetPluginInfo names the driver and its version; the manifest lists the
// loaded backends with their module digests.
func (s *Server) GetPluginInfo(ctx context.Context, _ *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	manifest := map[string]string{}
	for _, b := range s.backends.Load().all() {
		manifest["backend/"+b.name] = b.mod.Digest()
	}
	return &csi.GetPluginInfoResponse{Name: s.cfg.DriverName, VendorVersion: Version, Manifest: manifest}, nil
}

// GetPluginCapabilities follows from the role and what the loaded backends
// implement.
func (s *Server) GetPluginCapabilities(ctx context.Context, _ *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	set := s.backends.Load()
	var caps []*csi.PluginCapability
	svc := func(t csi.PluginCapability_Service_Type) {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}})
	}
	if s.cfg.Role != config.RoleNode {
		svc(csi.PluginCapability_Service_CONTROLLER_SERVICE)
		if set.any(func(b *backend) bool { return b.has(abi.OpCreateSnapshot) }) {
			svc(csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE)
		}
		if set.any(func(b *backend) bool { return b.has(abi.OpSnapshotData) }) {
			svc(csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE)
		}
	}
	if set.any(func(b *backend) bool { return len(b.info.TopologyKeys) > 0 }) {
		svc(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS)
	}
	// SNAPSHOT_ACCESSIBILITY_CONSTRAINTS is not advertised (RATIONALE.md):
	// snapshot topologies are recorded but not yet returned.
	if set.any(func(b *backend) bool { return b.has(abi.OpExpandVolume) }) {
		t := csi.PluginCapability_VolumeExpansion_ONLINE
		if !set.any(func(b *backend) bool { return b.has(abi.OpExpandVolume) && !b.info.ExpandOffline }) {
			t = csi.PluginCapability_VolumeExpansion_OFFLINE
		}
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: t}}})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe is ready once at least one backend is loaded.
func (s *Server) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	// A pool folder whose sync failed holds its operations until the next
	// start (settle.go): not ready, so a liveness check restarts the daemon
	// and start-up finishes them, instead of their calls answering ABORTED
	// for as long as the process lives.
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(s.ready.Load() && !s.settle.Broken())}, nil
}
