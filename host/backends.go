package host

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/modules"
)

// backend is one loaded module as the CSI services see it: its decoded
// BackendInfo and the operations it implements.
type backend struct {
	name string
	mod  *modules.Module
	info abi.BackendInfo
	ops  map[abi.Op]bool
}

// has reports whether the backend implements op: exported and, when its
// BackendInfo lists operations, listed.
func (b *backend) has(op abi.Op) bool { return b.ops[op] }

// supportsCapability checks one requested capability against what the
// backend declared, and says what is wrong in words for INVALID_ARGUMENT.
func (b *backend) supportsCapability(c abi.Capability) error {
	if c.Block && !b.info.Block {
		return fmt.Errorf("backend %q does not offer block access", b.name)
	}
	if !c.Block && !b.info.Mount {
		return fmt.Errorf("backend %q does not offer mount access", b.name)
	}
	if !b.supportsMode(c.AccessMode) {
		return fmt.Errorf("backend %q does not support access mode %d", b.name, c.AccessMode)
	}
	if !c.Block && c.FsType != "" && len(b.info.FsTypes) > 0 && !contains(b.info.FsTypes, c.FsType) {
		return fmt.Errorf("backend %q does not support fs_type %q (supported: %s)", b.name, c.FsType, strings.Join(b.info.FsTypes, ", "))
	}
	return nil
}

// checkParameters refuses, for a module that declares its parameters
// (BackendInfo.DeclaresParameters), an unknown key or a bad value with
// INVALID_ARGUMENT naming it, before the module runs.
func (b *backend) checkParameters(params map[string]string) error {
	if !b.info.DeclaresParameters {
		return nil
	}
	if err := abi.CheckParameters(b.info.Parameters, params); err != nil {
		return errf(codes.InvalidArgument, "backend %q: %s", b.name, err.(*abi.Error).Message)
	}
	return nil
}

// checkMutable refuses mutable parameters the backend cannot change:
// every key must be one its module lists in BackendInfo.MutableParameters
// and implements modify_volume for.
func (b *backend) checkMutable(params map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if !b.has(abi.OpModifyVolume) || !contains(b.info.MutableParameters, k) {
			known := "none"
			if b.has(abi.OpModifyVolume) && len(b.info.MutableParameters) > 0 {
				known = strings.Join(b.info.MutableParameters, ", ")
			}
			return errf(codes.InvalidArgument, "mutable parameter %q: backend %q cannot change it (mutable: %s)", k, b.name, known)
		}
		if s, ok := b.paramSpec(k); ok {
			if err := s.Check(params[k]); err != nil {
				return errf(codes.InvalidArgument, "backend %q: mutable %s", b.name, err.(*abi.Error).Message)
			}
		}
	}
	return nil
}

// paramSpec is the declared spec of parameter name, if the module declares
// its parameters.
func (b *backend) paramSpec(name string) (abi.ParameterSpec, bool) {
	if !b.info.DeclaresParameters {
		return abi.ParameterSpec{}, false
	}
	for _, s := range b.info.Parameters {
		if s.Name == name {
			return s, true
		}
	}
	return abi.ParameterSpec{}, false
}

func (b *backend) supportsMode(m abi.AccessMode) bool {
	modes := b.info.AccessModes
	if len(modes) == 0 {
		modes = []int64{int64(abi.AccessSingleNodeWriter)}
	}
	for _, x := range modes {
		if abi.AccessMode(x) == m {
			return true
		}
		// A backend with either single-node writer mode MUST accept the
		// older SINGLE_NODE_WRITER (CSI spec, SINGLE_NODE_MULTI_WRITER).
		if m == abi.AccessSingleNodeWriter && (abi.AccessMode(x) == abi.AccessSingleNodeSingleWriter || abi.AccessMode(x) == abi.AccessSingleNodeMultiWriter) {
			return true
		}
	}
	return false
}

// backendSet is an immutable snapshot of the loaded backends; a module
// reload builds a new set and swaps it in atomically.
type backendSet struct {
	byName map[string]*backend
	names  []string
}

func (s *backendSet) get(name string) (*backend, bool) {
	if s == nil {
		return nil, false
	}
	b, ok := s.byName[name]
	return b, ok
}

func (s *backendSet) all() []*backend {
	if s == nil {
		return nil
	}
	out := make([]*backend, 0, len(s.names))
	for _, n := range s.names {
		out = append(out, s.byName[n])
	}
	return out
}

// any reports whether some backend satisfies f.
func (s *backendSet) any(f func(*backend) bool) bool {
	for _, b := range s.all() {
		if f(b) {
			return true
		}
	}
	return false
}

// infoCache keeps each module's decoded BackendInfo from its load, keyed
// by digest, so that building a backendSet never calls into a module.
type infoCache struct {
	mu    sync.Mutex
	infos map[string]abi.BackendInfo
}

func (c *infoCache) put(digest string, info abi.BackendInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.infos == nil {
		c.infos = map[string]abi.BackendInfo{}
	}
	c.infos[digest] = info
}

func (c *infoCache) get(digest string) (abi.BackendInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.infos[digest]
	return i, ok
}

// onLoad is the modules.Config.OnLoad hook: it runs the module's configure
// with the operator's config (so that what the module reports may depend on
// it, e.g. whether its pool enforces quotas), then reads and checks
// backend_info. An error refuses the module.
func (s *Server) onLoad(ctx context.Context, m *modules.Module) error {
	if m.Has(abi.OpConfigure) {
		g := m.Grant()
		req := abi.ConfigureRequest{Config: g.Config, Roots: g.Roots, NodeID: s.cfg.NodeID, Role: s.cfg.Role}
		switch err := callModule(ctx, m, abi.OpConfigure, &req, &abi.Empty{}); {
		case err == nil:
			// Every later instance starts unconfigured: replay it there.
			m.SetInstanceSetup(abi.OpConfigure, req.AppendWire(nil))
		case abi.CodeOf(err) == abi.Unimplemented:
			// An SDK module without a Configurer exports configure and
			// answers UNIMPLEMENTED: it has nothing to replay.
		default:
			return fmt.Errorf("configure: %w", err)
		}
	}
	var info abi.BackendInfo
	if err := callModule(ctx, m, abi.OpInfo, &abi.Empty{}, &info); err != nil {
		return fmt.Errorf("backend_info: %w", err)
	}
	if err := checkInfo(&info); err != nil {
		return fmt.Errorf("backend_info: %w", err)
	}
	s.infos.put(m.Digest(), info)
	m.Describe("version", info.Version, "ops", offeredOps(m, &info), "modes", modeNames(info.AccessModes))
	return nil
}

// offeredOps lists the operations m offers: exported and, when info
// lists Ops, listed there.
func offeredOps(m *modules.Module, info *abi.BackendInfo) []string {
	var ops []string
	for _, op := range abi.AllOps {
		if m.Has(op) && (len(info.Ops) == 0 || contains(info.Ops, string(op))) {
			ops = append(ops, string(op))
		}
	}
	return ops
}

// modeNames names access modes as the CSI spec does; none means
// SINGLE_NODE_WRITER (abi.BackendInfo.AccessModes).
func modeNames(modes []int64) []string {
	if len(modes) == 0 {
		return []string{csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()}
	}
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = csi.VolumeCapability_AccessMode_Mode(m).String()
	}
	return names
}

func checkInfo(i *abi.BackendInfo) error {
	if !i.Mount && !i.Block {
		return fmt.Errorf("offers neither mount nor block access")
	}
	if i.Granularity < 0 || i.MinSizeBytes < 0 || i.MaxSizeBytes < 0 || i.DefaultSizeBytes < 0 {
		return fmt.Errorf("negative size in %+v", *i)
	}
	if i.MaxSizeBytes > 0 && i.MinSizeBytes > i.MaxSizeBytes {
		return fmt.Errorf("min size %d above max size %d", i.MinSizeBytes, i.MaxSizeBytes)
	}
	for _, m := range i.AccessModes {
		if m <= 0 || m > int64(abi.AccessSingleNodeMultiWriter) {
			return fmt.Errorf("unknown access mode %d", m)
		}
	}
	if i.Mount && len(i.FsTypes) > 0 && i.DefaultFsType == "" {
		i.DefaultFsType = i.FsTypes[0]
	}
	for _, op := range i.Ops {
		if !knownOp(abi.Op(op)) {
			return fmt.Errorf("lists unknown operation %q", op)
		}
	}
	seen := map[string]bool{}
	for _, p := range i.Parameters {
		switch p.Type {
		case "", abi.ParamString, abi.ParamBool, abi.ParamInt, abi.ParamQuantity:
		default:
			return fmt.Errorf("parameter %q has unknown type %q", p.Name, p.Type)
		}
		if p.Name == "" || seen[p.Name] {
			return fmt.Errorf("parameter %q is empty or declared twice", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

func knownOp(op abi.Op) bool {
	for _, o := range abi.AllOps {
		if o == op {
			return true
		}
	}
	return false
}

// refreshBackends rebuilds the backend set from the runtime's modules.
func (s *Server) refreshBackends() {
	set := &backendSet{byName: map[string]*backend{}}
	for _, m := range s.rt.Modules() {
		info, ok := s.infos.get(m.Digest())
		if !ok {
			continue
		}
		b := &backend{name: m.Name(), mod: m, info: info, ops: map[abi.Op]bool{}}
		for _, op := range offeredOps(m, &info) {
			b.ops[abi.Op(op)] = true
		}
		set.byName[b.name] = b
		set.names = append(set.names, b.name)
	}
	sort.Strings(set.names)
	s.backends.Store(set)
}

// callModule encodes req, calls op on m and decodes the answer into resp.
// A module's error keeps its code; an answer that does not decode is the
// module's fault and becomes INTERNAL.
func callModule(ctx context.Context, m *modules.Module, op abi.Op, req, resp abi.Message) error {
	var out []byte
	var err error
	if r, ok := ctx.Value(reservedKey{m.Name()}).(*modules.Reservation); ok {
		out, err = r.Call(ctx, op, req.AppendWire(nil))
	} else {
		out, err = m.Call(ctx, op, req.AppendWire(nil))
	}
	if err != nil {
		return err
	}
	if err := resp.UnmarshalWire(out); err != nil {
		return abi.Errorf(abi.Internal, "module %s: %s answered garbage: %v", m.Name(), op, err)
	}
	return nil
}

// reservedKey keys the reservation of a module's instance in a context, by
// the module's name: a call through a backend looked up after a reload
// still finds it.
type reservedKey struct{ name string }

// reserve takes an instance of each backend's module for the calls made
// with the returned context, before a pause of writes that those calls
// must not spend waiting for an instance. The modules are reserved in
// name order, so that two callers reserving the same ones cannot each
// hold what the other waits for. release gives the instances back.
func reserve(ctx context.Context, backends []*backend) (_ context.Context, release func(), err error) {
	sorted := slices.SortedFunc(slices.Values(backends), func(a, b *backend) int { return strings.Compare(a.name, b.name) })
	var held []*modules.Reservation
	release = func() {
		for _, r := range held {
			r.Release()
		}
	}
	for _, b := range sorted {
		if ctx.Value(reservedKey{b.mod.Name()}) != nil {
			continue
		}
		r, err := b.mod.Reserve(ctx)
		if err != nil {
			release()
			return nil, nil, err
		}
		held = append(held, r)
		ctx = context.WithValue(ctx, reservedKey{b.mod.Name()}, r)
	}
	return ctx, release, nil
}

func (b *backend) call(ctx context.Context, op abi.Op, req, resp abi.Message) error {
	if !b.has(op) {
		return abi.Errorf(abi.Unimplemented, "backend %q does not implement %s", b.name, op)
	}
	return callModule(ctx, b.mod, op, req, resp)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Describe returns one line per loaded backend, what it is and offers,
// and a line "warning: ..." for each problem of the set as a whole.
func (s *Server) Describe() []string {
	var out []string
	for _, b := range s.backends.Load().all() {
		var ops []string
		for op := range b.ops {
			ops = append(ops, string(op))
		}
		slices.Sort(ops)
		out = append(out, fmt.Sprintf("%s %s %s sha256:%s mount=%v block=%v fs=%v modes=%s granularity=%d ops=%s",
			b.name, b.info.Version, b.mod.File(), b.mod.Digest(), b.info.Mount, b.info.Block, b.info.FsTypes,
			strings.Join(modeNames(b.info.AccessModes), ","), b.info.Granularity, strings.Join(ops, ",")))
	}
	if w := s.checkPublishAgreement(s.backends.Load()); w != "" {
		out = append(out, "warning: "+w)
	}
	return out
}

// checkPublishAgreement warns when a daemon of role all serves backends
// that disagree on controller_publish. CSI capabilities are plugin-wide:
// such a daemon advertises PUBLISH_UNPUBLISH_VOLUME for every backend, so
// the CO must call ControllerPublishVolume for node-local volumes too,
// which a deployment without an attacher for them (node-local layout)
// never does. Each driver name should serve one kind (deploy/README.md).
// It returns the warning, "" when there is none.
func (s *Server) checkPublishAgreement(set *backendSet) string {
	if s.cfg.Role != config.RoleAll {
		return ""
	}
	var with, without []string
	for _, b := range set.all() {
		if b.has(abi.OpControllerPublish) {
			with = append(with, b.name)
		} else {
			without = append(without, b.name)
		}
	}
	if len(with) == 0 || len(without) == 0 {
		return ""
	}
	return fmt.Sprintf("backends disagree on controller_publish (with: %s; without: %s): as capabilities are plugin-wide, this daemon advertises PUBLISH_UNPUBLISH_VOLUME for all of them; serve each kind under its own driver name (deploy/README.md)",
		strings.Join(with, ", "), strings.Join(without, ", "))
}
