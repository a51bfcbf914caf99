package oci

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// PushOptions configure Push.
type PushOptions struct {
	// Key signs the pushed manifest; nil pushes it unsigned.
	Key *ecdsa.PrivateKey
	// Annotations go on the manifest (AnnotationModule, ...).
	Annotations map[string]string
	// PlainHTTP reaches the registry over plain HTTP.
	PlainHTTP bool
	// AuthFile is a Docker config.json with credentials; "" is anonymous,
	// unless DockerAuth is set.
	AuthFile string
	// DockerAuth uses the credentials of `docker login` when AuthFile is "".
	DockerAuth bool
	// Transport is the HTTP transport (nil: http.DefaultTransport).
	Transport http.RoundTripper
}

// wasmConfig is the artifact's config in the CNCF wasm layout.
type wasmConfig struct {
	Architecture string   `json:"architecture"`
	OS           string   `json:"os"`
	LayerDigests []string `json:"layerDigests"`
}

// Push publishes a module at ref (oci://REGISTRY/REPO:TAG) in the CNCF
// wasm artifact layout and, with a key, signs it in the cosign format. It
// returns the manifest's digest.
func Push(ctx context.Context, ref string, module []byte, opt PushOptions) (digest.Digest, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return "", err
	}
	if r.IsDigest() {
		return "", errors.New("push to a tag, not a digest")
	}
	if _, err := RequestedFamilies(module); err != nil {
		return "", err
	}
	repo, err := opt.repository(r)
	if err != nil {
		return "", err
	}
	layer := content.NewDescriptorFromBytes(MediaTypeWasmLayer, module)
	cfg, _ := json.Marshal(wasmConfig{Architecture: "wasm", OS: "wasip1", LayerDigests: []string{layer.Digest.String()}})
	cfgDesc := content.NewDescriptorFromBytes(MediaTypeWasmConfig, cfg)
	for _, b := range []struct {
		d    ocispec.Descriptor
		data []byte
	}{{layer, module}, {cfgDesc, cfg}} {
		if err := pushBlob(ctx, repo, b.d, b.data); err != nil {
			return "", err
		}
	}
	man, _ := json.Marshal(ocispec.Manifest{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		MediaType:   ocispec.MediaTypeImageManifest,
		Config:      cfgDesc,
		Layers:      []ocispec.Descriptor{layer},
		Annotations: opt.Annotations,
	})
	desc := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, man)
	if err := repo.PushReference(ctx, desc, bytes.NewReader(man), r.Reference.Reference); err != nil {
		return "", fmt.Errorf("push manifest: %w", err)
	}
	if opt.Key == nil {
		return desc.Digest, nil
	}
	sig, err := Sign(opt.Key, NewPayload(r.Repo(), desc.Digest.String()))
	if err != nil {
		return "", err
	}
	if err := pushSignature(ctx, repo, desc.Digest, NewPayload(r.Repo(), desc.Digest.String()), sig); err != nil {
		return "", err
	}
	return desc.Digest, nil
}

func (o PushOptions) repository(r Ref) (*remote.Repository, error) {
	tr := o.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	c := &auth.Client{Client: &http.Client{Transport: tr}, Cache: auth.NewCache()}
	c.SetUserAgent("wasmcsi")
	var store credentials.Store
	var err error
	switch {
	case o.AuthFile != "":
		store, err = credentials.NewStore(o.AuthFile, credentials.StoreOptions{})
	case o.DockerAuth:
		store, err = credentials.NewStoreFromDocker(credentials.StoreOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	if store != nil {
		c.Credential = credentials.Credential(store)
	}
	return &remote.Repository{Client: c, Reference: r.Reference, PlainHTTP: o.PlainHTTP}, nil
}

func pushBlob(ctx context.Context, repo *remote.Repository, d ocispec.Descriptor, data []byte) error {
	if ok, err := repo.Exists(ctx, d); err == nil && ok {
		return nil
	}
	if err := repo.Push(ctx, d, bytes.NewReader(data)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		return fmt.Errorf("push %s: %w", d.MediaType, err)
	}
	return nil
}

// pushSignature adds a signature layer (payload, sig) to the signature
// manifest of subject at cosign's tag, keeping the signatures it holds.
func pushSignature(ctx context.Context, repo *remote.Repository, subject digest.Digest, payload []byte, sig string) error {
	layer := content.NewDescriptorFromBytes(MediaTypeSimpleSigning, payload)
	layer.Annotations = map[string]string{AnnotationSignature: sig}
	layers := []ocispec.Descriptor{}
	tag := SignatureTag(subject)
	if d, err := repo.Resolve(ctx, tag); err == nil {
		raw, err := fetch(ctx, repo, d)
		if err != nil {
			return fmt.Errorf("signature manifest: %w", err)
		}
		var m ocispec.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("signature manifest: %w", err)
		}
		layers = m.Layers
	} else if !errors.Is(err, errdef.ErrNotFound) {
		return fmt.Errorf("signature tag: %w", err)
	}
	if slices.ContainsFunc(layers, func(l ocispec.Descriptor) bool {
		return l.Digest == layer.Digest && l.Annotations[AnnotationSignature] == sig
	}) {
		return nil
	}
	layers = append(layers, layer)
	if err := pushBlob(ctx, repo, layer, payload); err != nil {
		return err
	}
	diffIDs := make([]string, len(layers))
	for i, l := range layers {
		diffIDs[i] = l.Digest.String()
	}
	// An image config as cosign writes one, so registries and tools that
	// expect an image accept the signature manifest.
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "", "os": "", "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	cfgDesc := content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cfg)
	if err := pushBlob(ctx, repo, cfgDesc, cfg); err != nil {
		return err
	}
	man, _ := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    cfgDesc,
		Layers:    layers,
	})
	desc := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, man)
	if err := repo.PushReference(ctx, desc, bytes.NewReader(man), tag); err != nil {
		return fmt.Errorf("push signature: %w", err)
	}
	return nil
}
