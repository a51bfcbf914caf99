package host

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
)

// capabilityFromCSI checks one CSI capability for the fields the spec
// requires and converts it.
func capabilityFromCSI(c *csi.VolumeCapability) (abi.Capability, error) {
	if c == nil {
		return abi.Capability{}, errf(codes.InvalidArgument, "volume capability missing")
	}
	var out abi.Capability
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		out.Block = true
	case *csi.VolumeCapability_Mount:
		out.FsType = t.Mount.GetFsType()
		out.MountFlags = t.Mount.GetMountFlags()
		out.MountGroup = t.Mount.GetVolumeMountGroup()
	default:
		return out, errf(codes.InvalidArgument, "volume capability has no access type")
	}
	if c.GetAccessMode() == nil || c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_UNKNOWN {
		return out, errf(codes.InvalidArgument, "volume capability has no access mode")
	}
	out.AccessMode = abi.AccessMode(c.GetAccessMode().GetMode())
	return out, nil
}

func capabilitiesFromCSI(cs []*csi.VolumeCapability) ([]abi.Capability, error) {
	if len(cs) == 0 {
		return nil, errf(codes.InvalidArgument, "volume capabilities missing")
	}
	out := make([]abi.Capability, 0, len(cs))
	for _, c := range cs {
		ac, err := capabilityFromCSI(c)
		if err != nil {
			return nil, err
		}
		out = append(out, ac)
	}
	return out, nil
}

// multiNode reports whether an access mode lets more than one node use the
// volume at once.
func multiNode(m abi.AccessMode) bool {
	return m == abi.AccessMultiNodeReadOnly || m == abi.AccessMultiNodeSingleWriter || m == abi.AccessMultiNodeMultiWriter
}

// readOnlyMode reports whether an access mode forbids writes.
func readOnlyMode(m abi.AccessMode) bool {
	return m == abi.AccessSingleNodeReadOnly || m == abi.AccessMultiNodeReadOnly
}

func topologiesFromCSI(ts []*csi.Topology) []abi.Topology {
	out := make([]abi.Topology, 0, len(ts))
	for _, t := range ts {
		out = append(out, abi.Topology{Segments: t.GetSegments()})
	}
	return out
}

// roundUp rounds n up to a multiple of g (g <= 1: unchanged).
func roundUp(n, g int64) int64 {
	if g <= 1 || n%g == 0 {
		return n
	}
	return (n/g + 1) * g
}
