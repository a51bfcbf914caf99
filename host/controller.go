package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/host/state"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
)

// Lock keys. One operation per volume, snapshot or name at a time; a second
// concurrent call gets ABORTED, as the spec recommends.
func volKey(id string) string  { return "vol/" + id }
func snapKey(id string) string { return "snap/" + id }
func vnameKey(n string) string { return "vname/" + n }
func snameKey(n string) string { return "sname/" + n }
func groupKey(n string) string { return "group/" + n }
func abortedf(what string) error {
	return errf(codes.Aborted, "an operation on %s is already in progress", what)
}

// lock takes every key or answers ABORTED.
func (s *Server) lock(keys ...string) (func(), error) {
	unlock, ok := s.locks.TryLock(keys...)
	if !ok {
		return nil, abortedf(fmt.Sprint(keys))
	}
	return unlock, nil
}

// backendFor resolves the backend named in an ID. ok is false when the ID is
// not one of ours or its backend is not loaded.
func (s *Server) backendFor(id string) (*backend, string, bool) {
	name, _, local, ok := splitID(id)
	if !ok {
		return nil, "", false
	}
	b, ok := s.backends.Load().get(name)
	return b, local, ok
}

// backendForParams picks the backend of a CreateVolume or GetCapacity from
// the StorageClass parameter, or the configured default.
func (s *Server) backendForParams(params map[string]string) (*backend, map[string]string, error) {
	name, ok := params[s.cfg.BackendParameter]
	if !ok || name == "" {
		name = s.cfg.DefaultBackend
	}
	if name == "" {
		return nil, nil, errf(codes.InvalidArgument, "parameter %q missing: it names the backend", s.cfg.BackendParameter)
	}
	b, ok := s.backends.Load().get(name)
	if !ok {
		return nil, nil, errf(codes.InvalidArgument, "backend %q is not loaded (loaded: %v)", name, s.backends.Load().names)
	}
	rest := make(map[string]string, len(params))
	for k, v := range params {
		if k != s.cfg.BackendParameter {
			rest[k] = v
		}
	}
	return b, rest, nil
}

func volumeRef(v *state.Volume) abi.VolumeRef {
	return abi.VolumeRef{LocalID: v.LocalID, Context: v.Context, CapacityBytes: v.CapacityBytes}
}

func snapshotRef(sn *state.Snapshot, src *state.Volume) abi.SnapshotRef {
	r := abi.SnapshotRef{LocalID: sn.LocalID, Context: sn.Context, SizeBytes: sn.SizeBytes}
	if src != nil {
		r.Source = volumeRef(src)
	}
	return r
}

func stateCaps(cs []abi.Capability) []state.Capability {
	out := make([]state.Capability, 0, len(cs))
	for _, c := range cs {
		out = append(out, state.Capability{Block: c.Block, FsType: c.FsType, MountFlags: c.MountFlags, AccessMode: int32(c.AccessMode)})
	}
	return out
}

func abiCaps(cs []state.Capability) []abi.Capability {
	out := make([]abi.Capability, 0, len(cs))
	for _, c := range cs {
		out = append(out, abi.Capability{Block: c.Block, FsType: c.FsType, MountFlags: c.MountFlags, AccessMode: abi.AccessMode(c.AccessMode)})
	}
	return out
}

func csiVolume(v *state.Volume) *csi.Volume {
	out := &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes, VolumeContext: v.Context}
	switch {
	case v.SourceSnapshotID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID}}}
	case v.SourceVolumeID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID}}}
	}
	for _, t := range v.Topology {
		out.AccessibleTopology = append(out.AccessibleTopology, &csi.Topology{Segments: t})
	}
	return out
}

// CreateVolume validates the request, serializes on the name, answers an
// identical repeat with the recorded volume (and a different one with
// ALREADY_EXISTS), lets the backend place and provision the volume, and
// records it durably before answering.
func (s *Server) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, errf(codes.InvalidArgument, "name missing")
	}
	caps, err := capabilitiesFromCSI(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	b, params, err := s.backendForParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	for _, c := range caps {
		if err := b.supportsCapability(c); err != nil {
			return nil, errf(codes.InvalidArgument, "%v", err)
		}
	}
	mutable := req.GetMutableParameters()
	if err := b.checkMutable(mutable); err != nil {
		return nil, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 {
		return nil, errf(codes.InvalidArgument, "negative capacity range")
	}
	if limit > 0 && required > limit {
		return nil, errf(codes.InvalidArgument, "required_bytes %d above limit_bytes %d", required, limit)
	}
	keys := []string{vnameKey(name)}
	srcSnap, srcVol := req.GetVolumeContentSource().GetSnapshot().GetSnapshotId(), req.GetVolumeContentSource().GetVolume().GetVolumeId()
	if req.GetVolumeContentSource() != nil && srcSnap == "" && srcVol == "" {
		return nil, errf(codes.InvalidArgument, "volume content source names no snapshot or volume")
	}
	if srcSnap != "" {
		keys = append(keys, snapKey(srcSnap))
	}
	if srcVol != "" {
		keys = append(keys, volKey(srcVol))
	}
	unlock, err := s.lock(keys...)
	if err != nil {
		return nil, err
	}
	defer unlock()

	// A deletion of a volume of this name that is not settled yet holds
	// the name: settle it first.
	if old, err := s.store.VolumeRecordByName(name); err == nil && old.Deleting {
		if err := s.settleDeletion(ctx, old); err != nil {
			return nil, err
		}
	}
	requisite := topologiesFromCSI(req.GetAccessibilityRequirements().GetRequisite())
	if old, err := s.store.VolumeByName(name); err == nil {
		if err := sameVolume(&old, b.name, required, limit, caps, params, mutable, srcSnap, srcVol, requisite); err != nil {
			return nil, errf(codes.AlreadyExists, "volume %q exists with other arguments: %v", name, err)
		}
		return &csi.CreateVolumeResponse{Volume: csiVolume(&old)}, nil
	} else if !errors.Is(err, state.ErrNotFound) {
		return nil, err
	}
	// After the records: a name taken with other parameters is
	// ALREADY_EXISTS whatever they are.
	if err := b.checkParameters(params); err != nil {
		return nil, err
	}

	mreq := abi.CreateVolumeRequest{
		Name: name, Parameters: params, Capabilities: caps,
		Requisite:         requisite,
		Preferred:         topologiesFromCSI(req.GetAccessibilityRequirements().GetPreferred()),
		MutableParameters: mutable,
	}
	var sourceSize int64
	switch {
	case srcSnap != "":
		if !b.info.Restore {
			return nil, errf(codes.InvalidArgument, "backend %q cannot restore snapshots", b.name)
		}
		sn, err := s.store.GetSnapshot(srcSnap)
		if err != nil {
			return nil, s.sourceAbsent(err, "snapshot", srcSnap)
		}
		if sn.Backend != b.name {
			return nil, errf(codes.InvalidArgument, "snapshot %q belongs to backend %q, not %q", srcSnap, sn.Backend, b.name)
		}
		var src *state.Volume
		if v, err := s.store.GetVolume(sn.SourceVolumeID); err == nil {
			src = &v
		}
		ref := snapshotRef(&sn, src)
		mreq.Source = &abi.VolumeSource{Snapshot: &ref}
		sourceSize = sn.SizeBytes
	case srcVol != "":
		if !b.info.Clone {
			return nil, errf(codes.InvalidArgument, "backend %q cannot clone volumes", b.name)
		}
		v, err := s.store.GetVolume(srcVol)
		if err != nil {
			return nil, s.sourceAbsent(err, "volume", srcVol)
		}
		if v.Backend != b.name {
			return nil, errf(codes.InvalidArgument, "volume %q belongs to backend %q, not %q", srcVol, v.Backend, b.name)
		}
		if err := s.flushSource(ctx, &v); err != nil {
			return nil, err
		}
		ref := volumeRef(&v)
		mreq.Source = &abi.VolumeSource{Volume: &ref}
		sourceSize = v.CapacityBytes
	}
	size, err := b.sizeFor(required, limit, sourceSize)
	if err != nil {
		return nil, err
	}
	mreq.RequiredBytes, mreq.LimitBytes = size, limit

	// The intent is the one sync the CO waits for; the module's pool
	// changes and the volume's record become durable after it, and
	// start-up finishes the create if a crash loses them (RATIONALE.md,
	// "Records").
	intent := state.Intent{
		Key: state.VolumeIntentKey(name), Op: string(abi.OpCreateVolume), Backend: b.name,
		Request: mreq.AppendWire(nil), SourceSnapshotID: srcSnap, SourceVolumeID: srcVol,
		CreatedAt: time.Now().UTC(),
	}
	if err := s.store.LogIntent(intent); err != nil {
		return nil, fmt.Errorf("log the create of %q: %w", name, err)
	}
	var dirs hostcalls.DirSyncs
	v, err := s.createAndRecord(s.deferSyncs(ctx, b, &dirs), b, &intent, &mreq)
	// Whatever the outcome, the intent goes once the pool changes are
	// durable, after the record if there is one.
	source := ""
	if srcs := copySources(&intent); len(srcs) > 0 {
		source = srcs[0]
	}
	s.settle.addCopy(intent.Key, source, dirs.Dirs(), func() error { return s.store.DropIntentSoon(intent.Key, intent.CreatedAt) })
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(&v)}, nil
}

// createAndRecord calls the module's create_volume with the request an
// intent logged, checks its answer and records the volume, without
// waiting for the disk: the intent stays until the record is durable.
func (s *Server) createAndRecord(ctx context.Context, b *backend, intent *state.Intent, mreq *abi.CreateVolumeRequest) (state.Volume, error) {
	var resp abi.CreateVolumeResponse
	if err := b.call(ctx, abi.OpCreateVolume, mreq, &resp); err != nil {
		return state.Volume{}, err
	}
	tag := s.tagFor(b)
	if err := checkCreatedVolume(b.name, tag, &resp); err != nil {
		return state.Volume{}, err
	}
	size, limit := mreq.RequiredBytes, mreq.LimitBytes
	if resp.CapacityBytes < size || (limit > 0 && resp.CapacityBytes > limit) {
		return state.Volume{}, errf(codes.Internal, "backend %q provisioned %d bytes for a request of %d..%d", b.name, resp.CapacityBytes, size, limit)
	}
	name := mreq.Name
	v := state.Volume{
		ID: tag.id(b.name, resp.LocalID), Name: name, Backend: b.name, LocalID: resp.LocalID,
		CapacityBytes: resp.CapacityBytes, Parameters: mreq.Parameters, Context: resp.Context,
		Capabilities: stateCaps(mreq.Capabilities), SourceSnapshotID: intent.SourceSnapshotID, SourceVolumeID: intent.SourceVolumeID,
		CreatedAt: intent.CreatedAt, MutableParameters: mreq.MutableParameters,
	}
	for _, t := range resp.Topology {
		v.Topology = append(v.Topology, t.Segments)
	}
	if err := s.checkVolumeIDFree(b.name, resp.LocalID, name, false); err != nil {
		return state.Volume{}, err
	}
	if old, err := s.store.VolumeByName(name); err == nil {
		// A start-up replay of a create whose record survived.
		if old.ID != v.ID {
			return state.Volume{}, errf(codes.Internal, "backend %q answered volume ID %q for %q, recorded as %q: a repeated create_volume must answer the same",
				b.name, v.ID, name, old.ID)
		}
		return old, nil
	}
	if err := s.store.InsertVolumeSoon(v); errors.Is(err, state.ErrIDTaken) {
		return state.Volume{}, s.idTaken(b.name, "volume", v.ID, name, func() (string, error) {
			old, err := s.store.VolumeRecord(v.ID)
			return old.Name, err
		})
	} else if err != nil {
		return state.Volume{}, fmt.Errorf("record volume %s: %w", v.ID, err)
	}
	return v, nil
}

// checkCreatedVolume checks a create_volume answer before anything of it
// is recorded: its local ID (with the node tag its ID gets, nil for none),
// its volume_context and its topology.
func checkCreatedVolume(backend string, tag *nodeTag, resp *abi.CreateVolumeResponse) error {
	if err := checkLocalID(backend, tag, "volume", resp.LocalID); err != nil {
		return err
	}
	if err := checkContext(backend, "volume_context", resp.Context); err != nil {
		return err
	}
	for _, t := range resp.Topology {
		if err := checkTopology(backend, "accessible_topology", t.Segments); err != nil {
			return err
		}
	}
	return nil
}

// checkVolumeIDFree refuses (idTaken) a volume local ID a module answered
// for the create_volume name name when a record of another volume holds
// it: a volume record, or an inline ephemeral volume's (inline says which
// kind name is), under any spelling of its ID on this node (idSpellings).
// A volume record's name and an inline volume's create_volume name live
// in different namespaces, so a record of the other kind holds the ID for
// another volume whatever its name. CreateVolume and the ephemeral inline
// volumes both check here; InsertVolume checks volume records again in
// its transaction (for the spelling it records).
func (s *Server) checkVolumeIDFree(backend, local, name string, inline bool) error {
	spellings := s.idSpellings(backend, local)
	holder, holderID, holderInline := "", "", false
	for _, id := range spellings {
		if v, err := s.store.GetVolume(id); err == nil {
			holder, holderID = v.Name, id
			break
		} else if !errors.Is(err, state.ErrNotFound) {
			return err
		}
	}
	for _, id := range spellings {
		if holder != "" {
			break
		}
		if e, err := s.store.EphemeralByVolumeID(id); err == nil {
			holder, holderID, holderInline = e.Name, id, true
		} else if !errors.Is(err, state.ErrNotFound) {
			return err
		}
	}
	if holder == "" || (holder == name && holderInline == inline) {
		return nil
	}
	return s.idTaken(backend, "volume", holderID, name, func() (string, error) { return holder, nil })
}

// idSpellings are the IDs a backend's local ID can have on this node:
// untagged, and tagged with either form of this node's tag. They name the
// same storage, so one of them recorded for another name makes the local
// ID taken (records made before IDs were tagged, or in another role).
func (s *Server) idSpellings(backend, local string) []string {
	out := []string{makeID(backend, "", local), makeID(backend, s.tag.hashed, local)}
	if s.tag.readable != "" {
		out = append(out, makeID(backend, s.tag.readable, local))
	}
	return out
}

// idTaken answers a create whose module returned, for a new name, an ID
// recorded for another one. Nothing is recorded and nothing is undone: the
// only handle on what the module made is that ID, and deleting through it
// would destroy the recorded volume or snapshot.
func (s *Server) idTaken(backend, what, id, name string, owner func() (string, error)) error {
	other, err := owner()
	if err != nil {
		other = "?"
	}
	s.log.Error("backend answered an ID it already gave another name; refused, nothing recorded or deleted",
		"backend", backend, "kind", what, "id", id, "name", name, "recorded_name", other)
	return errf(codes.Internal, "backend %q answered %s ID %q for name %q, but that ID is recorded for %q: refused; nothing was recorded or deleted",
		backend, what, id, name, other)
}

// sizeFor applies the backend's default, minimum, granularity and maximum
// to a requested range.
func (b *backend) sizeFor(required, limit, sourceSize int64) (int64, error) {
	size := required
	if size == 0 {
		size = max(sourceSize, b.info.DefaultSizeBytes)
		if fit := limit - limit%max(b.info.Granularity, 1); limit > 0 && size > limit && fit > 0 {
			// Only a limit, below the default: the largest size it allows.
			size = max(sourceSize, fit)
		}
	}
	if sourceSize > 0 && size < sourceSize {
		return 0, errf(codes.OutOfRange, "requested %d bytes, smaller than the source's %d", size, sourceSize)
	}
	size = max(size, b.info.MinSizeBytes)
	size = roundUp(size, b.info.Granularity)
	if limit > 0 && size > limit {
		return 0, errf(codes.OutOfRange, "backend %q allocates in units of %d bytes (min %d): no size fits %d..%d", b.name, b.info.Granularity, b.info.MinSizeBytes, required, limit)
	}
	if b.info.MaxSizeBytes > 0 && size > b.info.MaxSizeBytes {
		return 0, errf(codes.OutOfRange, "backend %q volumes are at most %d bytes", b.name, b.info.MaxSizeBytes)
	}
	return size, nil
}

// sameVolume decides whether a repeated CreateVolume asks for the volume
// that exists; the error says what differs.
func sameVolume(v *state.Volume, backend string, required, limit int64, caps []abi.Capability, params, mutable map[string]string, srcSnap, srcVol string, requisite []abi.Topology) error {
	switch {
	case v.Backend != backend:
		return fmt.Errorf("backend %q, not %q", v.Backend, backend)
	case required > 0 && v.CapacityBytes < required:
		return fmt.Errorf("capacity %d below required %d", v.CapacityBytes, required)
	case limit > 0 && v.CapacityBytes > limit:
		return fmt.Errorf("capacity %d above limit %d", v.CapacityBytes, limit)
	case v.SourceSnapshotID != srcSnap || v.SourceVolumeID != srcVol:
		return fmt.Errorf("another content source")
	case !maps.Equal(v.Parameters, params) && !(len(v.Parameters) == 0 && len(params) == 0):
		return fmt.Errorf("other parameters")
	case !maps.Equal(v.MutableParameters, mutable) && !(len(v.MutableParameters) == 0 && len(mutable) == 0):
		return fmt.Errorf("other mutable parameters")
	case !meetsRequisite(v.Topology, requisite):
		return fmt.Errorf("accessible from %v, which the requisite topology %v excludes", v.Topology, requisite)
	}
	have := abiCaps(v.Capabilities)
	for _, c := range caps {
		if !slices.ContainsFunc(have, func(h abi.Capability) bool { return sameCapability(h, c) }) {
			return fmt.Errorf("capability %+v was not requested at creation", c)
		}
	}
	return nil
}

// meetsRequisite reports whether a volume accessible from the segments
// accessible satisfies a requisite topology: some accessible segment agrees
// with some requisite one on every key the two share. A volume with no
// recorded topology is accessible everywhere; no requisite asks nothing.
// The preferred list is a wish, which a repeat may state differently.
func meetsRequisite(accessible []map[string]string, requisite []abi.Topology) bool {
	if len(accessible) == 0 || len(requisite) == 0 {
		return true
	}
	for _, a := range accessible {
		for _, r := range requisite {
			agree := true
			for k, v := range r.Segments {
				if av, ok := a[k]; ok && av != v {
					agree = false
					break
				}
			}
			if agree {
				return true
			}
		}
	}
	return false
}

func sameCapability(a, b abi.Capability) bool {
	return a.Block == b.Block && a.FsType == b.FsType && a.AccessMode == b.AccessMode && slices.Equal(a.MountFlags, b.MountFlags)
}

func notFoundOr(err error, format string, args ...any) error {
	if errors.Is(err, state.ErrNotFound) {
		return errf(codes.NotFound, format+" not found", args...)
	}
	return err
}

// DeleteVolume deletes a volume; one that does not exist is success. The
// volume is marked deleting, durably, before the module runs: the one
// sync the CO waits for. The record goes once the module's pool changes
// are durable, and start-up finishes a deletion a crash cut short
// (RATIONALE.md, "Records").
func (s *Server) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := s.store.VolumeRecord(id)
	if errors.Is(err, state.ErrNotFound) {
		// Success only for a volume that does not exist: one another
		// node's daemon made is not gone because this one lacks it.
		if err := s.elsewhere(codes.FailedPrecondition, "volume", id); err != nil {
			return nil, err
		}
		return &csi.DeleteVolumeResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	if v.Deleting && s.settle.settling(id) {
		// The module deleted it; only the record's removal waits.
		return &csi.DeleteVolumeResponse{}, nil
	}
	if use, err := s.volumeInUse(&v); err != nil {
		return nil, err
	} else if use != "" {
		return nil, errf(codes.FailedPrecondition, "volume %q is in use: %s; unpublish and unstage it first", id, use)
	}
	b, ok := s.backends.Load().get(v.Backend)
	if !ok {
		return nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", v.Backend, id)
	}
	if err := s.settleCopiesOf(ctx, volKey(id), "volume", id); err != nil {
		return nil, err
	}
	if !v.Deleting {
		if err := s.store.MarkVolumeDeleting(id); err != nil {
			return nil, fmt.Errorf("mark volume %s deleting: %w", id, err)
		}
	}
	var dirs hostcalls.DirSyncs
	if err := b.call(s.deferSyncs(ctx, b, &dirs), abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: volumeRef(&v)}, &abi.Empty{}); err != nil {
		// The volume is still there: show it again. Should that fail,
		// the mark stays and the next DeleteVolume or start-up repeats
		// the module's delete.
		v.Deleting = false
		if perr := s.store.PutVolume(v); perr != nil {
			s.log.Error("unmark a volume whose deletion failed", "volume", id, "err", perr)
		}
		return nil, err
	}
	s.settle.add(id, dirs.Dirs(), func() error {
		// The intent of the create that made the volume goes with it: one
		// start-up could not complete would make the volume again at the
		// next start.
		if err := s.store.DropIntentSoon(state.VolumeIntentKey(v.Name), v.CreatedAt); err != nil {
			return err
		}
		return ignoreNotFound(s.store.DeleteVolumeSoon(id))
	})
	return &csi.DeleteVolumeResponse{}, nil
}

// settleCopiesOf makes the clones or restores of a volume or snapshot
// (key: its volKey or snapKey) durable before it is deleted. A copy's pool
// entry is synced by the settler, after its answer; until then a power
// loss may take it, and start-up makes it again from its logged request,
// which needs the source. So a source is never removed while a copy of it
// depends on it (RATIONALE.md, "Records"): a deletion waits for the
// settler's batch, or answers ABORTED while the copy's folder does not
// sync. The wait happens only within the settle delay after a copy. A
// copy whose create start-up could not finish, and which is still logged,
// holds its source: FAILED_PRECONDITION (in use by another resource)
// until a CreateVolume of its name or a start finishes it.
func (s *Server) settleCopiesOf(ctx context.Context, key, what, id string) error {
	for _, in := range s.unfinishedCopies[key] {
		if cur, err := s.store.GetIntent(in.Key); err == nil && cur.CreatedAt.Equal(in.CreatedAt) {
			return errf(codes.FailedPrecondition, "%s %q is the source of volume %q, whose create start-up could not finish: CreateVolume of that name, or a restart, finishes it first",
				what, id, strings.TrimPrefix(in.Key, state.VolumeIntentKey("")))
		} else if err != nil && !errors.Is(err, state.ErrNotFound) {
			return err
		}
	}
	if !s.settle.copying(key) {
		return nil
	}
	if err := s.settle.flush(ctx); err != nil {
		return err
	}
	if s.settle.copying(key) {
		return errf(codes.Aborted, "a copy of %s %q is not durable yet: its deletion waits for it", what, id)
	}
	return nil
}

// deferSyncs returns ctx with d, so that the module's pool folder changes
// are left to the settler, for a backend granted no other family: a module
// that also keeps state elsewhere (device-mapper, an iSCSI target) may
// record what it chose there in pool files (dmthin's thin ID claims,
// iscsi's LUN), which a power loss must not take while the state they
// describe stays, so its calls sync as they go.
func (s *Server) deferSyncs(ctx context.Context, b *backend, d *hostcalls.DirSyncs) context.Context {
	m, ok := s.cfg.Modules[b.name]
	if !ok {
		return ctx
	}
	for _, f := range m.HostCalls {
		if !catalog.DefersSyncs(f) {
			return ctx
		}
	}
	return hostcalls.WithDirSyncs(ctx, d)
}

// settleDeletion finishes the deletion of v, marked deleting, before its
// name is used again: it waits for the settler's batch, or, when no batch
// holds it (the module's delete failed, or start-up could not finish it),
// deletes it again, syncs the backend's pool folders (the rmdir may be
// an earlier call's, its sync still to come) and removes its record,
// waiting for the disk.
func (s *Server) settleDeletion(ctx context.Context, v state.Volume) error {
	if s.settle.settling(v.ID) {
		if err := s.settle.flush(ctx); err != nil {
			return err
		}
		if _, err := s.store.VolumeRecord(v.ID); errors.Is(err, state.ErrNotFound) {
			return nil
		}
	}
	// A DeleteVolume of it may be at work: not two module deletes at once.
	unlock, err := s.lock(volKey(v.ID))
	if err != nil {
		return err
	}
	defer unlock()
	// Read it again under the lock: that DeleteVolume may have removed
	// it, or unmarked it after the module's delete failed.
	v, err = s.store.VolumeRecord(v.ID)
	if errors.Is(err, state.ErrNotFound) || (err == nil && !v.Deleting) {
		return nil
	} else if err != nil {
		return err
	}
	if s.settle.settling(v.ID) {
		// A batch holds the removal of its record by ID (its folder sync
		// failed, or a DeleteVolume queued it since): removed here, the
		// record of the volume this name gets next, under the same ID,
		// would go with that batch.
		return errf(codes.Aborted, "the deletion of volume %q of this name is not settled yet", v.ID)
	}
	b, ok := s.backends.Load().get(v.Backend)
	if !ok {
		return errf(codes.FailedPrecondition, "volume %q of this name is being deleted and its backend %q is not loaded", v.ID, v.Backend)
	}
	var dirs hostcalls.DirSyncs
	if err := b.call(s.deferSyncs(ctx, b, &dirs), abi.OpDeleteVolume, &abi.DeleteVolumeRequest{Volume: volumeRef(&v)}, &abi.Empty{}); err != nil {
		return fmt.Errorf("finish the deletion of volume %s of this name: %w", v.ID, err)
	}
	if err := s.syncPools(dirs.Dirs(), b.name); err != nil {
		return fmt.Errorf("finish the deletion of volume %s of this name: %w", v.ID, err)
	}
	if err := s.store.DeleteVolume(v.ID); err != nil && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("finish the deletion of volume %s of this name: %w", v.ID, err)
	}
	return nil
}

// ControllerPublishVolume makes a volume reachable from a node. Backends
// without controller_publish need nothing from the controller; the host
// still checks the volume, the node and the access mode, and records the
// publication.
func (s *Server) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if nodeID == "" {
		return nil, errf(codes.InvalidArgument, "node_id missing")
	}
	c, err := capabilityFromCSI(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := s.store.GetVolume(id)
	if err != nil {
		return nil, s.absent(err, "volume", id)
	}
	nodeName, nodeCtx, ok := parseNodeID(nodeID)
	if !ok {
		return nil, errf(codes.NotFound, "node %q not found: not a node ID issued by NodeGetInfo", nodeID)
	}
	b, ok := s.backends.Load().get(v.Backend)
	if !ok {
		return nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", v.Backend, id)
	}
	if err := b.supportsCapability(c); err != nil {
		return nil, errf(codes.InvalidArgument, "%v", err)
	}
	if !slices.ContainsFunc(abiCaps(v.Capabilities), func(h abi.Capability) bool { return h.Block == c.Block }) {
		return nil, errf(codes.InvalidArgument, "volume %q was not created for this access type", id)
	}
	p, again := v.Published[nodeID]
	if again {
		if p.ReadOnly != req.GetReadonly() {
			return nil, errf(codes.AlreadyExists, "volume %q is published to %q with readonly=%v", id, nodeID, p.ReadOnly)
		}
		if p.Capability != nil && !samePublishCapability(*p.Capability, c) {
			return nil, errf(codes.AlreadyExists, "volume %q is published to %q with another capability (%s access, mode %d)", id, nodeID, accessType(p.Capability.Block), p.Capability.AccessMode)
		}
		if !b.has(abi.OpControllerPublish) {
			return &csi.ControllerPublishVolumeResponse{PublishContext: withPublishedNode(p.Context, nodeName)}, nil
		}
		// A repeat still reaches the module, whose publish is idempotent:
		// what it set up may be gone (a storage host's target
		// configuration does not survive its reboot) and a repeat is how
		// the CO asks for it again.
	} else if !multiNode(c.AccessMode) && len(v.Published) > 0 {
		return nil, errf(codes.FailedPrecondition, "volume %q is published to another node and its access mode allows one", id)
	}
	var resp abi.ControllerPublishResponse
	if b.has(abi.OpControllerPublish) {
		mreq := abi.ControllerPublishRequest{Volume: volumeRef(&v), NodeID: nodeID, ReadOnly: req.GetReadonly(), Capability: c, NodeContext: nodeCtx}
		if err := b.call(ctx, abi.OpControllerPublish, &mreq, &resp); err != nil {
			return nil, err
		}
		// The CO gets the context with the host's key added.
		if err := checkContext(b.name, "publish_context", withPublishedNode(resp.PublishContext, nodeName)); err != nil {
			return nil, err
		}
	}
	if v.Published == nil {
		v.Published = map[string]state.PublishedNode{}
	}
	v.Published[nodeID] = state.PublishedNode{ReadOnly: req.GetReadonly(), Context: resp.PublishContext, Capability: &stateCaps([]abi.Capability{c})[0]}
	if err := s.store.PutVolume(v); err != nil {
		return nil, fmt.Errorf("record publication of %s: %w", id, err)
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: withPublishedNode(resp.PublishContext, nodeName)}, nil
}

// samePublishCapability decides whether a repeated ControllerPublish asks
// for the publication that exists: the same access type and access mode,
// which is what the controller step depends on (a grant read-write or
// read-only, to one node or many). The fs type and mount flags concern the
// node's mount, which NodeStage and NodePublish check.
func samePublishCapability(have state.Capability, c abi.Capability) bool {
	return have.Block == c.Block && abi.AccessMode(have.AccessMode) == c.AccessMode
}

// ControllerUnpublishVolume revokes a node's access (every node's when
// node_id is empty). A volume or node that is gone is success.
func (s *Server) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := s.store.GetVolume(id)
	if errors.Is(err, state.ErrNotFound) {
		if err := s.elsewhere(codes.FailedPrecondition, "volume", id); err != nil {
			return nil, err
		}
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	nodes := []string{nodeID}
	if nodeID == "" {
		nodes = slices.Sorted(maps.Keys(v.Published))
	}
	b, loaded := s.backends.Load().get(v.Backend)
	for _, n := range nodes {
		if _, ok := v.Published[n]; !ok {
			continue
		}
		if loaded && b.has(abi.OpControllerUnpublish) {
			_, nodeCtx, _ := parseNodeID(n)
			mreq := abi.ControllerUnpublishRequest{Volume: volumeRef(&v), NodeID: n, NodeContext: nodeCtx}
			if err := b.call(ctx, abi.OpControllerUnpublish, &mreq, &abi.Empty{}); err != nil {
				return nil, err
			}
		} else if !loaded {
			return nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", v.Backend, id)
		}
		delete(v.Published, n)
		if err := s.store.PutVolume(v); err != nil {
			return nil, fmt.Errorf("record unpublication of %s: %w", id, err)
		}
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms capabilities the volume's backend
// supports and that match how the volume was created.
func (s *Server) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	caps, err := capabilitiesFromCSI(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	v, err := s.store.GetVolume(id)
	if err != nil {
		return nil, s.absent(err, "volume", id)
	}
	b, ok := s.backends.Load().get(v.Backend)
	if !ok {
		return nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", v.Backend, id)
	}
	created := abiCaps(v.Capabilities)
	for _, c := range caps {
		if err := b.supportsCapability(c); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
		if !slices.ContainsFunc(created, func(h abi.Capability) bool { return h.Block == c.Block }) {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: "volume was created for another access type"}, nil
		}
	}
	if why := s.differsFromRecord(&v, req); why != "" {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: why}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters(), MutableParameters: req.GetMutableParameters(),
	}}, nil
}

// differsFromRecord compares the volume context, parameters and mutable
// parameters a ValidateVolumeCapabilities names with the volume's record
// and says what differs. Confirmed echoes what the plugin validated, and
// the CO reads anything echoed as supported, so nothing is echoed that was
// not checked: parameters (with the backend parameter, which selects the
// backend) must be those the volume was created with, a volume context
// the one it was given, and mutable parameters its current values.
func (s *Server) differsFromRecord(v *state.Volume, req *csi.ValidateVolumeCapabilitiesRequest) string {
	if vc := req.GetVolumeContext(); len(vc) > 0 && !maps.Equal(vc, v.Context) {
		return "volume_context differs from the volume's"
	}
	if params := req.GetParameters(); len(params) > 0 {
		backend, ok := params[s.cfg.BackendParameter]
		if !ok || backend == "" {
			backend = s.cfg.DefaultBackend
		}
		rest := maps.Clone(params)
		delete(rest, s.cfg.BackendParameter)
		if backend != v.Backend {
			return fmt.Sprintf("parameters select backend %q; the volume is %q's", backend, v.Backend)
		}
		if !maps.Equal(rest, v.Parameters) && !(len(rest) == 0 && len(v.Parameters) == 0) {
			return "parameters differ from those the volume was created with"
		}
	}
	for k, val := range req.GetMutableParameters() {
		if have, ok := v.MutableParameters[k]; !ok || have != val {
			return fmt.Sprintf("mutable parameter %q is not %q on this volume", k, val)
		}
	}
	return ""
}

// ListVolumes pages through the records in ID order.
func (s *Server) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, errf(codes.InvalidArgument, "max_entries is negative")
	}
	publish := s.advertisesPublish()
	entries, next, err := listPage(req.GetStartingToken(), int(req.GetMaxEntries()), func(token string, max int) ([]*csi.ListVolumesResponse_Entry, string, error) {
		vols, next, err := s.store.ListVolumes(token, max)
		if err != nil {
			return nil, "", err
		}
		out := make([]*csi.ListVolumesResponse_Entry, 0, len(vols))
		for i := range vols {
			e := &csi.ListVolumesResponse_Entry{Volume: csiVolume(&vols[i])}
			if publish {
				e.Status = &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: slices.Sorted(maps.Keys(vols[i].Published))}
			}
			out = append(out, e)
		}
		return out, next, nil
	})
	if errors.Is(err, state.ErrBadToken) {
		return nil, errf(codes.Aborted, "starting_token %q is not valid", req.GetStartingToken())
	} else if err != nil {
		return nil, err
	}
	return &csi.ListVolumesResponse{Entries: entries, NextToken: next}, nil
}

// unpagedBudget bounds the answer to a List call without max_entries, in
// bytes of its entries: past it the answer ends with a next_token, which
// the spec allows ("no restriction" on the number returned) and every CO
// must follow. Without the bound, a listing of some 22,000 volumes
// outgrows the 4 MiB message that gRPC clients accept by default and the
// CO gets nothing at all. A variable for the tests.
var unpagedBudget = 2 << 20

// unpagedChunk (a variable for the tests) is how many records an unpaged
// listing reads at a time; it also bounds how far past unpagedBudget an
// answer goes (a chunk of entries, each at most a few KiB).
var unpagedChunk = 128

// listPage answers a List call: max entries from token when the CO asked
// for a page, else chunks of unpagedChunk until the listing ends or
// unpagedBudget is spent, so every answer costs O(its size).
func listPage[E proto.Message](token string, max int, list func(token string, max int) ([]E, string, error)) ([]E, string, error) {
	if max > 0 {
		return list(token, max)
	}
	var out []E
	size := 0
	for {
		page, next, err := list(token, unpagedChunk)
		if err != nil {
			return nil, "", err
		}
		out = append(out, page...)
		for _, e := range page {
			size += proto.Size(e)
		}
		if next == "" || size >= unpagedBudget {
			return out, next, nil
		}
		token = next
	}
}

// ControllerGetVolume returns one volume with the nodes it is published to.
func (s *Server) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	v, err := s.store.GetVolume(id)
	if err != nil {
		return nil, s.absent(err, "volume", id)
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: csiVolume(&v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: slices.Sorted(maps.Keys(v.Published))},
	}, nil
}

// GetCapacity asks the backend the parameters select.
func (s *Server) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	b, params, err := s.backendForParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	if err := b.checkParameters(params); err != nil {
		return nil, err
	}
	mreq := abi.GetCapacityRequest{Parameters: params}
	if req.GetVolumeCapabilities() != nil {
		caps, err := capabilitiesFromCSI(req.GetVolumeCapabilities())
		if err != nil {
			return nil, err
		}
		for _, c := range caps {
			if err := b.supportsCapability(c); err != nil {
				return &csi.GetCapacityResponse{}, nil // no capacity for what this backend cannot serve
			}
		}
		mreq.Capability = &caps[0]
	}
	if t := req.GetAccessibleTopology(); t != nil {
		mreq.Topology = &abi.Topology{Segments: t.GetSegments()}
	}
	var resp abi.GetCapacityResponse
	if err := b.call(ctx, abi.OpGetCapacity, &mreq, &resp); err != nil {
		return nil, err
	}
	s.metrics.availableCapacity(b.name, resp.AvailableBytes)
	out := &csi.GetCapacityResponse{AvailableCapacity: resp.AvailableBytes}
	if resp.MaximumVolumeSize > 0 {
		out.MaximumVolumeSize = wrapperspb.Int64(resp.MaximumVolumeSize)
	}
	if resp.MinimumVolumeSize > 0 {
		out.MinimumVolumeSize = wrapperspb.Int64(resp.MinimumVolumeSize)
	}
	return out, nil
}

// advertisesPublish says whether the CO must call ControllerPublishVolume.
// A controller-only daemon always asks for it: its publications are how it
// knows that a volume is in use on a node (RATIONALE.md).
func (s *Server) advertisesPublish() bool {
	return s.cfg.Role == config.RoleController || s.backends.Load().any(func(b *backend) bool { return b.has(abi.OpControllerPublish) })
}

// ControllerGetCapabilities follows from what the loaded backends implement.
// CSI capabilities are plugin-wide while backends differ: an operation on a
// volume whose backend lacks it answers UNIMPLEMENTED (see RATIONALE.md).
func (s *Server) ControllerGetCapabilities(ctx context.Context, _ *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	set := s.backends.Load()
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	}
	has := func(op abi.Op) bool { return set.any(func(b *backend) bool { return b.has(op) }) }
	add := func(ok bool, t ...csi.ControllerServiceCapability_RPC_Type) {
		if ok {
			types = append(types, t...)
		}
	}
	add(s.advertisesPublish(), csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY, csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES)
	add(has(abi.OpGetCapacity), csi.ControllerServiceCapability_RPC_GET_CAPACITY)
	add(has(abi.OpCreateSnapshot), csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS, csi.ControllerServiceCapability_RPC_GET_SNAPSHOT)
	add(set.any(func(b *backend) bool { return b.info.Clone }), csi.ControllerServiceCapability_RPC_CLONE_VOLUME)
	add(has(abi.OpExpandVolume), csi.ControllerServiceCapability_RPC_EXPAND_VOLUME)
	add(has(abi.OpModifyVolume), csi.ControllerServiceCapability_RPC_MODIFY_VOLUME)
	add(set.any(func(b *backend) bool {
		return b.supportsMode(abi.AccessSingleNodeMultiWriter) || b.supportsMode(abi.AccessSingleNodeSingleWriter)
	}), csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	sort.Slice(types, func(i, j int) bool { return types[i] < types[j] })
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return resp, nil
}

// ControllerExpandVolume grows a volume. Asking for no more than it has is
// success with the current size.
func (s *Server) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	if req.GetCapacityRange() == nil {
		return nil, errf(codes.InvalidArgument, "capacity_range missing")
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 || (limit > 0 && required > limit) {
		return nil, errf(codes.InvalidArgument, "bad capacity range %d..%d", required, limit)
	}
	var capability *abi.Capability
	if req.GetVolumeCapability() != nil {
		c, err := capabilityFromCSI(req.GetVolumeCapability())
		if err != nil {
			return nil, err
		}
		capability = &c
	}
	v, b, unlock, err := s.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c := capability; c != nil {
		// "Exceeds capabilities" is INVALID_ARGUMENT on the expand RPCs.
		if err := b.supportsCapability(*c); err != nil {
			return nil, errf(codes.InvalidArgument, "exceeds the volume's capabilities: %v", err)
		}
		if !slices.ContainsFunc(v.Capabilities, func(h state.Capability) bool { return h.Block == c.Block }) {
			return nil, errf(codes.InvalidArgument, "exceeds the volume's capabilities: volume %q was not created for %s access", id, accessType(c.Block))
		}
	}
	nodeExpansion := b.info.NodeExpansion
	if required <= v.CapacityBytes {
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: nodeExpansion}, nil
	}
	if !b.has(abi.OpExpandVolume) {
		return nil, errf(codes.Unimplemented, "backend %q cannot expand volumes", b.name)
	}
	if b.info.ExpandOffline {
		if use, err := s.volumeInUse(&v); err != nil {
			return nil, err
		} else if use != "" {
			return nil, errf(codes.FailedPrecondition, "backend %q expands only volumes not in use; %q is %s", b.name, id, use)
		}
	}
	size := roundUp(required, b.info.Granularity)
	if limit > 0 && size > limit {
		return nil, errf(codes.OutOfRange, "no size in units of %d bytes fits %d..%d", b.info.Granularity, required, limit)
	}
	if b.info.MaxSizeBytes > 0 && size > b.info.MaxSizeBytes {
		return nil, errf(codes.OutOfRange, "backend %q volumes are at most %d bytes", b.name, b.info.MaxSizeBytes)
	}
	if err := s.recordDurable(id); err != nil {
		return nil, err
	}
	var resp abi.ExpandVolumeResponse
	if err := b.call(ctx, abi.OpExpandVolume, &abi.ExpandVolumeRequest{Volume: volumeRef(&v), RequiredBytes: size, LimitBytes: limit, Capability: capability}, &resp); err != nil {
		return nil, err
	}
	if resp.CapacityBytes < size {
		return nil, errf(codes.Internal, "backend %q grew volume %q to %d bytes, below the %d asked", b.name, id, resp.CapacityBytes, size)
	}
	if err := checkContext(b.name, "volume_context", resp.Context); err != nil {
		return nil, err
	}
	v.CapacityBytes = resp.CapacityBytes
	if len(resp.Context) > 0 {
		v.Context = resp.Context
	}
	if err := s.store.PutVolume(v); err != nil {
		return nil, fmt.Errorf("record expansion of %s: %w", id, err)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: resp.NodeExpansionRequired || nodeExpansion}, nil
}

// ControllerModifyVolume changes mutable parameters of a volume. Only keys
// its backend declares mutable are accepted; anything else is
// INVALID_ARGUMENT before the module runs, so nothing has changed. Keys the
// request does not name keep their value, and a request naming none has
// nothing to do.
func (s *Server) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume_id missing")
	}
	v, b, unlock, err := s.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	params := req.GetMutableParameters()
	if err := b.checkMutable(params); err != nil {
		return nil, err
	}
	if len(params) == 0 {
		return &csi.ControllerModifyVolumeResponse{}, nil
	}
	if err := s.recordDurable(id); err != nil {
		return nil, err
	}
	var resp abi.ModifyVolumeResponse
	mreq := abi.ModifyVolumeRequest{Volume: volumeRef(&v), MutableParameters: params, Secrets: req.GetSecrets()}
	if err := b.call(ctx, abi.OpModifyVolume, &mreq, &resp); err != nil {
		return nil, err
	}
	if err := checkContext(b.name, "volume_context", resp.Context); err != nil {
		return nil, err
	}
	if v.MutableParameters == nil {
		v.MutableParameters = make(map[string]string, len(params))
	}
	maps.Copy(v.MutableParameters, params)
	if len(resp.Context) > 0 {
		v.Context = resp.Context
	}
	if err := s.store.PutVolume(v); err != nil {
		return nil, fmt.Errorf("record modification of %s: %w", id, err)
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

// recordDurable makes the record of volume id durable before a call
// changes the volume's storage. A create's record is written without
// waiting, and until it is on disk a crash leaves start-up only the logged
// create_volume request to rebuild it from; once an expansion or a
// modification changed the storage, that request no longer describes it
// (a loopfile volume grown by an expansion cut off before its record was
// written lost its record for good: RATIONALE.md, "Records"). Nothing
// waits when the log has nothing unsynced.
func (s *Server) recordDurable(id string) error {
	if err := s.store.Sync(); err != nil {
		return fmt.Errorf("make the record of %s durable before changing it: %w", id, err)
	}
	return nil
}

// lockVolume takes the volume's lock and returns its record and its loaded
// backend: the start of every controller call that changes one volume.
func (s *Server) lockVolume(id string) (state.Volume, *backend, func(), error) {
	unlock, err := s.lock(volKey(id))
	if err != nil {
		return state.Volume{}, nil, nil, err
	}
	v, err := s.store.GetVolume(id)
	if err != nil {
		unlock()
		return state.Volume{}, nil, nil, s.absent(err, "volume", id)
	}
	b, ok := s.backends.Load().get(v.Backend)
	if !ok {
		unlock()
		return state.Volume{}, nil, nil, errf(codes.FailedPrecondition, "backend %q of volume %q is not loaded", v.Backend, id)
	}
	return v, b, unlock, nil
}
