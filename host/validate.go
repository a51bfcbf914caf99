package host

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls/node"
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

// nodePath checks a path the CO names on the node (a staging or target
// path, a volume path): present, absolute and clean. A relative path would
// resolve against the daemon's working directory; one with "..", ".",
// doubled or trailing slashes can resolve somewhere else than it reads — a
// ".." onto an existing directory would be mounted over — and would not
// match the records, which are keyed by the path as written.
func nodePath(field, p string) error {
	if p == "" {
		return errf(codes.InvalidArgument, "%s missing", field)
	}
	return optionalNodePath(field, p)
}

// nodePath checks a staging or target path the node service mounts at
// or unmounts: nodePath's checks, then the configured roots
// (node.path_roots) when there are any.
func (s *Server) nodePath(field, p string) error {
	if err := nodePath(field, p); err != nil {
		return err
	}
	return s.inPathRoots(field, p)
}

// teardownPath checks a staging or target path the node service takes
// down (NodeUnstage, NodeUnpublish): nodePath's checks, the roots only
// when no record names exactly that path for the volume. A recorded path
// was accepted when it was set up; roots configured or changed since (a
// kubelet root folder that differs) must not keep its teardown from ever
// succeeding.
func (s *Server) teardownPath(field, p string, recorded func() (bool, error)) error {
	if err := nodePath(field, p); err != nil {
		return err
	}
	if len(s.cfg.Node.PathRoots) == 0 {
		return nil
	}
	ok, err := recorded()
	if err != nil || ok {
		return err
	}
	return s.inPathRoots(field, p)
}

// inPathRoots refuses a path outside the configured node.path_roots (none
// configured: any path). p is absolute and clean. Both p and the roots are
// compared with their links resolved, so that a link inside a root cannot
// lead a mount outside the roots.
func (s *Server) inPathRoots(field, p string) error {
	roots := s.cfg.Node.PathRoots
	if p == "" || len(roots) == 0 || slices.Contains(roots, "/") {
		return nil
	}
	real, err := resolveExisting(p)
	if err != nil && (errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENAMETOOLONG) ||
		strings.Contains(err.Error(), "too many links")) { // filepath.EvalSymlinks' own ELOOP
		// The path itself cannot lead anywhere: a file where a folder
		// must be, a loop of links, too long. Asking again cannot help.
		return errf(codes.InvalidArgument, "%s %q: %v", field, p, err)
	}
	if err != nil {
		return errf(codes.Unavailable, "%s %q: %v", field, p, err)
	}
	if node.Within(roots, p) && node.Within(roots, real) {
		return nil
	}
	for _, r := range roots {
		if rr, err := filepath.EvalSymlinks(r); err == nil && node.Within([]string{rr}, real) {
			return nil
		}
	}
	return errf(codes.InvalidArgument, "%s %q is outside the node's path roots %q", field, p, roots)
}

// resolveExisting resolves the links of the longest part of the absolute,
// clean path p that exists and joins the rest to it: where p leads, or
// would lead once the missing folders are made.
func resolveExisting(p string) (string, error) {
	rest := ""
	for cur := p; ; cur = filepath.Dir(cur) {
		real, err := filepath.EvalSymlinks(cur)
		if err == nil {
			return filepath.Join(real, rest), nil
		}
		if !errors.Is(err, os.ErrNotExist) || cur == "/" {
			return "", err
		}
		rest = filepath.Join(filepath.Base(cur), rest)
	}
}

// lookupNodePath checks a volume_path that the node service only looks up
// among its records (NodeGetVolumeStats, NodeExpandVolume, which act on
// the recorded paths, never on this one): one that is not absolute and
// clean cannot be a recorded path, so the volume is not there, and that is
// NOT_FOUND, the spec's code for a volume that does not exist on
// volume_path (csi-sanity asks exactly this with "some/path").
func lookupNodePath(id, p string) error {
	if p == "" {
		return errf(codes.InvalidArgument, "volume_path missing")
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return errf(codes.NotFound, "volume %q is not at %q: not an absolute, clean path", id, p)
	}
	return nil
}

// optionalNodePath checks a path field the CO may leave empty.
func optionalNodePath(field, p string) error {
	if p != "" && (!filepath.IsAbs(p) || filepath.Clean(p) != p) {
		return errf(codes.InvalidArgument, "%s %q is not an absolute, clean path (no \"..\", \".\", \"//\" or trailing \"/\")", field, p)
	}
	return nil
}
