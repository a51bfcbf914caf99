package oci

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// Size bounds of what a pull reads.
const (
	// MaxModuleSize bounds the module layer (modules.MaxModuleSize).
	MaxModuleSize = 64 << 20
	maxManifest   = 4 << 20
	maxPayload    = 64 << 10
	maxSignatures = 16
)

// Refusal reasons, the reason label of wasmcsi_module_verify_failures_total.
const (
	ReasonUnsigned = "unsigned" // no signature at all
	ReasonKey      = "key"      // signatures, none by the configured key
	ReasonDigest   = "digest"   // content or a signature names another digest
	ReasonGrants   = "grants"   // the module asks for host calls beyond its grant
	ReasonLayout   = "layout"   // not a wasm artifact this daemon reads
	ReasonLoad     = "load"     // verified, but the runtime refused to load it
)

// Source is one module the operator names by OCI reference.
type Source struct {
	// Name is the module's name (its configuration key).
	Name string
	// Ref is oci://REGISTRY/REPO:TAG or oci://REGISTRY/REPO@sha256:HEX.
	Ref string
	// Key is the public key a signature must verify with.
	Key *ecdsa.PublicKey
	// Grant are the host-call families the operator granted the module; a
	// module importing a call of any other family is refused.
	Grant []string
	// Pin, when set, is the lower-case sha256 hex the module itself must
	// have.
	Pin string
}

// Options configure a Puller.
type Options struct {
	// Dir is the cache folder (created 0700): verified modules by digest
	// and, per module, the record of its last verified version.
	Dir     string
	Sources []Source
	// PlainHTTP lists the registries (host:port) reached over plain HTTP.
	PlainHTTP []string
	// AuthFile is a Docker config.json with registry credentials; ""
	// pulls anonymously.
	AuthFile string
	// Timeout bounds one module's resolution and pull (0: 2 minutes).
	Timeout time.Duration
	// Transport is the HTTP transport (nil: http.DefaultTransport).
	Transport http.RoundTripper
	Log       *slog.Logger
	Metrics   prometheus.Registerer
}

// Puller keeps, for every Source, the last version that passed every
// check. Its methods are safe for concurrent use; Sync calls are
// serialized.
type Puller struct {
	opt     Options
	log     *slog.Logger
	client  remote.Client
	sources []*source
	files   atomic.Pointer[map[string]string]

	mu sync.Mutex // serializes Sync

	verifyFailures *prometheus.CounterVec
	pullFailures   *prometheus.CounterVec
}

type source struct {
	Source
	ref   Ref
	keyID string
	cur   *record // serving
	// prev is the version cur replaced, kept until the runtime has
	// loaded cur (Revert takes it back when it could not).
	prev *record
	// refused is the manifest digest and reason last refused: a version
	// refused again for the same reason is logged at debug level and not
	// counted again, unless a Sync is forced.
	refused       digest.Digest
	refusedReason string
}

// record is the cache's note of a module's last verified version.
type record struct {
	Ref      string    `json:"ref"`
	Manifest string    `json:"manifest"`
	Layer    string    `json:"layer"`
	KeyID    string    `json:"key"`
	Verified time.Time `json:"verified"`
}

// refusal is a version that failed a check.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }

func refuse(reason string, format string, args ...any) error {
	return &refusal{reason: reason, err: fmt.Errorf(format, args...)}
}

// New checks the sources and takes up the cache: a source whose cache
// record names its reference and key and whose cached module still has
// its digest and fits its grant serves that version until Sync finds
// another. New does not reach any registry.
func New(opt Options) (*Puller, error) {
	if opt.Dir == "" {
		return nil, errors.New("oci: no cache folder")
	}
	if opt.Timeout == 0 {
		opt.Timeout = 2 * time.Minute
	}
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, sub := range []string{"sha256", "modules"} {
		if err := os.MkdirAll(filepath.Join(opt.Dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("oci: cache: %w", err)
		}
	}
	tr := opt.Transport
	if tr == nil {
		tr = defaultTransport()
	}
	c := &auth.Client{Client: &http.Client{Transport: tr}, Cache: auth.NewCache()}
	c.SetUserAgent("wasmcsi")
	if opt.AuthFile != "" {
		store, err := credentials.NewStore(opt.AuthFile, credentials.StoreOptions{})
		if err != nil {
			return nil, fmt.Errorf("oci: credentials %s: %w", opt.AuthFile, err)
		}
		c.Credential = credentials.Credential(store)
	}
	p := &Puller{opt: opt, log: log, client: c}
	seen := map[string]bool{}
	for _, s := range opt.Sources {
		ref, err := ParseRef(s.Ref)
		if err != nil {
			return nil, fmt.Errorf("oci: module %q: %w", s.Name, err)
		}
		if s.Key == nil {
			return nil, fmt.Errorf("oci: module %q: no public key to verify %s with", s.Name, s.Ref)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("oci: module %q named twice", s.Name)
		}
		seen[s.Name] = true
		src := &source{Source: s, ref: ref, keyID: KeyID(s.Key)}
		src.cur = p.cached(src)
		p.sources = append(p.sources, src)
	}
	if opt.Metrics != nil {
		p.verifyFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmcsi_module_verify_failures_total",
			Help: "Module versions pulled from a registry and refused, by module and reason (unsigned, key, digest, grants, layout).",
		}, []string{"module", "reason"})
		p.pullFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmcsi_module_pull_failures_total",
			Help: "Failed attempts to reach a module's registry, by module.",
		}, []string{"module"})
		for _, c := range []prometheus.Collector{p.verifyFailures, p.pullFailures} {
			if err := opt.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("oci: metrics: %w", err)
			}
		}
	}
	p.publish()
	return p, nil
}

// defaultTransport gives up early on a registry that does not answer, so
// that a daemon starting while its registry is unreachable serves the
// cached versions within seconds rather than at the end of Timeout.
func defaultTransport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.ResponseHeaderTimeout = 30 * time.Second
	return t
}

// Files maps each module that has a verified version to its cached file.
func (p *Puller) Files() map[string]string { return *p.files.Load() }

func (p *Puller) publish() {
	m := map[string]string{}
	for _, s := range p.sources {
		if s.cur != nil {
			m[s.Name] = p.blobPath(s.cur.Layer)
		}
	}
	p.files.Store(&m)
}

func (p *Puller) blobPath(d string) string {
	return filepath.Join(p.opt.Dir, "sha256", strings.TrimPrefix(d, "sha256:")+".wasm")
}

func (p *Puller) recordPath(name string) string {
	return filepath.Join(p.opt.Dir, "modules", name+".json")
}

// cached returns the source's cached version, if it is still good.
func (p *Puller) cached(s *source) *record {
	b, err := os.ReadFile(p.recordPath(s.Name))
	if err != nil {
		return nil
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil || rec.Ref != s.Ref || rec.KeyID != s.keyID {
		p.log.Info("cached module version is for another reference or key: not used", "module", s.Name, "ref", s.Ref)
		return nil
	}
	if d, err := digest.Parse(rec.Layer); err != nil || d.Algorithm() != digest.SHA256 {
		p.log.Warn("cached module record names no sha256 digest: not used", "module", s.Name, "digest", rec.Layer)
		return nil
	}
	data, err := os.ReadFile(p.blobPath(rec.Layer))
	if err == nil {
		err = p.checkModule(s, digest.Digest(rec.Layer), data)
	}
	if err != nil {
		p.log.Warn("cached module version not used", "module", s.Name, "digest", rec.Layer, "err", err)
		return nil
	}
	return &rec
}

// Sync resolves every source and takes up each new version that passes
// every check; a version that fails one is refused (logged, counted) and
// the previous one keeps serving. A registry it cannot reach leaves the
// module's version as it was. A version refused again for the same reason
// is not counted again, and logged as an error again only when force is set
// (SIGHUP). It reports whether any module's version changed.
func (p *Puller) Sync(ctx context.Context, force bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for _, s := range p.sources {
		if p.sync(ctx, s, force) {
			changed = true
		}
	}
	if changed {
		prev := p.Files()
		p.publish()
		// A reload running now may still read the versions published
		// before: they go at the next change.
		p.collect(prev)
	}
	return changed
}

func (p *Puller) sync(ctx context.Context, s *source, force bool) bool {
	serving := "none"
	if s.cur != nil {
		serving = s.cur.Layer
	}
	if s.ref.IsDigest() && s.cur != nil && s.cur.Manifest == s.ref.Reference.Reference {
		return false // a digest never moves
	}
	ctx, cancel := context.WithTimeout(ctx, p.opt.Timeout)
	defer cancel()
	repo := p.repository(s.ref)
	desc, err := repo.Resolve(ctx, s.ref.Reference.Reference)
	if err != nil {
		p.pullFailed(s, serving, err)
		return false
	}
	if s.cur != nil && s.cur.Manifest == desc.Digest.String() {
		return false
	}
	if desc.Digest == s.refused && s.refusedReason == ReasonLoad && !force {
		return false // the runtime refused it; a forced Sync (SIGHUP) tries again
	}
	// A refused version is checked again each time: a signature may come
	// later.
	rec, data, err := p.verify(ctx, repo, s, desc)
	if re := (*refusal)(nil); errors.As(err, &re) {
		level := slog.LevelError
		if desc.Digest == s.refused && re.reason == s.refusedReason {
			if !force {
				level = slog.LevelDebug
			}
		} else if p.verifyFailures != nil {
			p.verifyFailures.WithLabelValues(s.Name, re.reason).Inc()
		}
		s.refused, s.refusedReason = desc.Digest, re.reason
		p.log.Log(ctx, level, "module version refused; previous version keeps serving", "module", s.Name, "ref", s.Ref,
			"manifest", desc.Digest, "reason", re.reason, "err", re.err, "serving", serving)
		return false
	} else if err != nil {
		p.pullFailed(s, serving, err)
		return false
	}
	if err := p.store(s, rec, data); err != nil {
		p.log.Error("cannot cache module version; previous version keeps serving", "module", s.Name, "err", err, "serving", serving)
		return false
	}
	s.prev, s.cur, s.refused, s.refusedReason = s.cur, rec, "", ""
	p.log.Info("module version verified", "module", s.Name, "ref", s.Ref, "manifest", rec.Manifest, "digest", rec.Layer, "key", s.keyID)
	return true
}

// Revert takes back the version of module name that the last Sync took
// up, when the runtime refused to load it (a compile or ABI error, a
// failed warm-up): the previous verified version is the cached one
// again, on disk too, so a restart serves it. It reports whether there
// was a version to go back to. The refused version is not taken up again
// until a forced Sync (SIGHUP) or a new version.
func (p *Puller) Revert(name string, cause error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sources {
		if s.Name != name || s.prev == nil || s.cur == nil {
			continue
		}
		bad := s.cur
		if p.verifyFailures != nil {
			p.verifyFailures.WithLabelValues(s.Name, ReasonLoad).Inc()
		}
		b, _ := json.MarshalIndent(s.prev, "", "  ")
		if err := writeFile(p.recordPath(s.Name), b); err != nil {
			p.log.Error("cannot restore the cached module version", "module", s.Name, "err", err)
			return false
		}
		s.cur, s.prev = s.prev, nil
		s.refused, s.refusedReason = digest.Digest(bad.Manifest), ReasonLoad
		p.log.Error("module version refused; previous version keeps serving", "module", s.Name, "ref", s.Ref,
			"manifest", bad.Manifest, "reason", ReasonLoad, "err", cause, "serving", s.cur.Layer)
		prev := p.Files()
		p.publish()
		p.collect(prev)
		return true
	}
	return false
}

func (p *Puller) pullFailed(s *source, serving string, err error) {
	if p.pullFailures != nil {
		p.pullFailures.WithLabelValues(s.Name).Inc()
	}
	p.log.Warn("module registry unreachable; last verified version keeps serving", "module", s.Name, "ref", s.Ref, "err", err, "serving", serving)
}

func (p *Puller) repository(ref Ref) *remote.Repository {
	return &remote.Repository{
		Client:    p.client,
		Reference: ref.Reference,
		PlainHTTP: slices.Contains(p.opt.PlainHTTP, ref.Registry),
	}
}

// verify fetches and checks one version: the manifest's digest and layout,
// a signature by the key that signs that digest, the module's digest, pin
// and requested host calls. Nothing here compiles the module.
func (p *Puller) verify(ctx context.Context, repo *remote.Repository, s *source, desc ocispec.Descriptor) (*record, []byte, error) {
	if s.ref.IsDigest() && desc.Digest.String() != s.ref.Reference.Reference {
		return nil, nil, refuse(ReasonDigest, "registry answered manifest %s for %s", desc.Digest, s.ref.Reference.Reference)
	}
	if desc.Size > maxManifest {
		return nil, nil, refuse(ReasonLayout, "manifest of %d bytes", desc.Size)
	}
	raw, err := fetch(ctx, repo, desc)
	if err != nil {
		return nil, nil, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, nil, refuse(ReasonLayout, "manifest: %v", err)
	}
	switch {
	case desc.MediaType != ocispec.MediaTypeImageManifest:
		return nil, nil, refuse(ReasonLayout, "manifest media type %q, want %q", desc.MediaType, ocispec.MediaTypeImageManifest)
	case m.Config.MediaType != MediaTypeWasmConfig:
		return nil, nil, refuse(ReasonLayout, "config media type %q, want %q", m.Config.MediaType, MediaTypeWasmConfig)
	case len(m.Layers) != 1 || m.Layers[0].MediaType != MediaTypeWasmLayer:
		return nil, nil, refuse(ReasonLayout, "want exactly one layer of media type %q", MediaTypeWasmLayer)
	case m.Layers[0].Size > MaxModuleSize:
		return nil, nil, refuse(ReasonLayout, "module layer of %d bytes, over %d", m.Layers[0].Size, MaxModuleSize)
	}
	if err := p.verifySignature(ctx, repo, s, desc); err != nil {
		return nil, nil, err
	}
	layer := m.Layers[0]
	data, err := fetch(ctx, repo, layer)
	if err != nil {
		return nil, nil, err
	}
	if err := p.checkModule(s, layer.Digest, data); err != nil {
		return nil, nil, err
	}
	return &record{Ref: s.Ref, Manifest: desc.Digest.String(), Layer: layer.Digest.String(), KeyID: s.keyID, Verified: time.Now().UTC()}, data, nil
}

// fetch reads a blob or manifest whole and checks its size and digest; a
// mismatch is a refusal, anything else an error reaching the registry.
func fetch(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor) ([]byte, error) {
	rc, err := repo.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := content.ReadAll(rc, desc)
	if errors.Is(err, content.ErrMismatchedDigest) || errors.Is(err, content.ErrTrailingData) {
		return nil, refuse(ReasonDigest, "%s %s: %v", desc.MediaType, desc.Digest, err)
	}
	return b, err
}

// checkModule checks a module's bytes against its digest, the pin and the
// grant.
func (p *Puller) checkModule(s *source, d digest.Digest, data []byte) error {
	sum := sha256.Sum256(data)
	hexSum := hex.EncodeToString(sum[:])
	if d.String() != "sha256:"+hexSum {
		return refuse(ReasonDigest, "module bytes have sha256 %s, not %s", hexSum, d)
	}
	if s.Pin != "" && s.Pin != hexSum {
		return refuse(ReasonDigest, "module sha256 %s does not match pin %s", hexSum, s.Pin)
	}
	fams, err := RequestedFamilies(data)
	if err != nil {
		return refuse(ReasonLayout, "module: %v", err)
	}
	var beyond []string
	for _, f := range fams {
		if !slices.Contains(s.Grant, f) {
			beyond = append(beyond, f)
		}
	}
	if len(beyond) > 0 {
		return refuse(ReasonGrants, "module asks for host-call families %v its grant %v lacks (grant them in the module's hostcalls to accept it)", beyond, s.Grant)
	}
	return nil
}

// verifySignature finds the signatures of desc (the cosign tag
// sha256-HEX.sig, else the referrers API) and accepts desc when one
// verifies with the key and signs desc's digest.
func (p *Puller) verifySignature(ctx context.Context, repo *remote.Repository, s *source, desc ocispec.Descriptor) error {
	var sigs []ocispec.Descriptor
	tagDesc, err := repo.Resolve(ctx, SignatureTag(desc.Digest))
	switch {
	case err == nil:
		sigs = append(sigs, tagDesc)
	case errors.Is(err, errdef.ErrNotFound):
		err = repo.Referrers(ctx, desc, ArtifactTypeSignature, func(rs []ocispec.Descriptor) error {
			sigs = append(sigs, rs...)
			return nil
		})
		if err != nil && !errors.Is(err, errdef.ErrNotFound) && !errors.Is(err, errdef.ErrUnsupported) {
			return fmt.Errorf("signatures of %s: %w", desc.Digest, err)
		}
	default:
		return fmt.Errorf("signature tag of %s: %w", desc.Digest, err)
	}
	var wrongKey, other []string
	n := 0
	for _, sd := range sigs {
		if sd.Size > maxManifest {
			continue
		}
		raw, err := fetch(ctx, repo, sd)
		if err != nil {
			return err
		}
		var m ocispec.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			continue
		}
		for _, l := range m.Layers {
			if l.MediaType != MediaTypeSimpleSigning || l.Size > maxPayload {
				continue
			}
			if n++; n > maxSignatures {
				break
			}
			payload, err := fetch(ctx, repo, l)
			if err != nil {
				return err
			}
			signed, err := verifyPayload(s.Key, payload, l.Annotations[AnnotationSignature])
			switch {
			case errors.Is(err, errWrongKey):
				wrongKey = append(wrongKey, l.Digest.String())
			case err != nil:
				wrongKey = append(wrongKey, fmt.Sprintf("%s (%v)", l.Digest, err))
			case signed != desc.Digest.String():
				other = append(other, signed)
			default:
				return nil
			}
		}
	}
	switch {
	case len(other) > 0:
		return refuse(ReasonDigest, "a signature by key %s signs manifest %s, not %s", s.keyID, strings.Join(other, ", "), desc.Digest)
	case len(wrongKey) > 0:
		return refuse(ReasonKey, "%d signature(s), none verifies with key %s", len(wrongKey), s.keyID)
	}
	return refuse(ReasonUnsigned, "no signature (neither tag %s nor a referrer)", SignatureTag(desc.Digest))
}

// SignatureTag is the tag cosign gives the signatures of manifest d.
func SignatureTag(d digest.Digest) string {
	return d.Algorithm().String() + "-" + d.Encoded() + ".sig"
}

// store writes the module into the cache, then its record.
func (p *Puller) store(s *source, rec *record, data []byte) error {
	if err := writeFile(p.blobPath(rec.Layer), data); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(rec, "", "  ")
	return writeFile(p.recordPath(s.Name), b)
}

// writeFile writes a file whole and syncs it before it takes its name.
func writeFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// collect removes the cached modules neither published now nor in prev.
func (p *Puller) collect(prev map[string]string) {
	keep := map[string]bool{}
	for _, path := range p.Files() {
		keep[filepath.Base(path)] = true
	}
	for _, path := range prev {
		keep[filepath.Base(path)] = true
	}
	dir := filepath.Join(p.opt.Dir, "sha256")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
