// Package oci pulls backend modules from an OCI registry and publishes them
// there: a module is an artifact in the CNCF wasm layout (config
// application/vnd.wasm.config.v0+json, one application/wasm layer) signed in
// the cosign simple signing format with an ECDSA P-256 key. The Puller
// resolves each configured reference, verifies the signature, the digests
// and the module's requested host-call families before anything compiles
// it, and keeps every verified module in a cache folder by digest, from
// which the module runtime loads it; a registry that cannot be reached
// leaves the last verified version serving.
package oci

import (
	"errors"
	"fmt"
	"strings"

	"oras.land/oras-go/v2/registry"
)

// Scheme prefixes a module source that is an OCI reference.
const Scheme = "oci://"

// Media types of the CNCF wasm OCI artifact layout
// (tag-runtime.github.io/wasm-oci, "Wasm Artifact Layout").
const (
	MediaTypeWasmConfig = "application/vnd.wasm.config.v0+json"
	MediaTypeWasmLayer  = "application/wasm"
)

// Annotations push writes on the module's manifest; the signature covers
// them with the manifest.
const (
	AnnotationTitle      = "org.opencontainers.image.title"
	AnnotationVersion    = "org.opencontainers.image.version"
	AnnotationModule     = "dev.wasmcsi.module.name"
	AnnotationABI        = "dev.wasmcsi.module.abi"
	AnnotationHostCalls  = "dev.wasmcsi.module.hostcalls"
	AnnotationParameters = "dev.wasmcsi.module.parameters"
)

// Ref is a parsed oci:// reference: a tag or a digest in a repository.
type Ref struct {
	registry.Reference
}

// IsRef tells an oci:// source from a path.
func IsRef(s string) bool { return strings.HasPrefix(s, Scheme) }

// ParseRef parses oci://REGISTRY/REPO:TAG or oci://REGISTRY/REPO@sha256:HEX.
func ParseRef(s string) (Ref, error) {
	if !IsRef(s) {
		return Ref{}, fmt.Errorf("%q does not start with %s", s, Scheme)
	}
	r, err := registry.ParseReference(strings.TrimPrefix(s, Scheme))
	if err != nil {
		return Ref{}, fmt.Errorf("%q: %w", s, err)
	}
	if r.Reference == "" {
		return Ref{}, fmt.Errorf("%q names no tag or digest", s)
	}
	if _, err := r.Digest(); err == nil && !strings.HasPrefix(r.Reference, "sha256:") {
		return Ref{}, errors.New("only sha256 digests are accepted")
	}
	return Ref{r}, nil
}

// Repo is registry/repository, the identity a signature names.
func (r Ref) Repo() string { return r.Registry + "/" + r.Repository }

// IsDigest tells a digest reference from a tag.
func (r Ref) IsDigest() bool {
	_, err := r.Digest()
	return err == nil
}

func (r Ref) String() string { return Scheme + r.Reference.String() }
