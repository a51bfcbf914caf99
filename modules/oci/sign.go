package oci

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
)

// The cosign "simple signing" format (github.com/sigstore/cosign,
// specs/SIGNATURE_SPEC.md): a signature is a layer of the signature
// manifest whose blob is the payload below and whose annotation holds the
// base64 ASN.1 ECDSA signature of the payload's SHA-256.
const (
	// MediaTypeSimpleSigning is the signature layer's media type.
	MediaTypeSimpleSigning = "application/vnd.dev.cosign.simplesigning.v1+json"
	// AnnotationSignature holds the base64 signature on that layer.
	AnnotationSignature = "dev.cosignproject.cosign/signature"
	// ArtifactTypeSignature is a signature manifest's artifact type when it
	// is found through the OCI 1.1 referrers API.
	ArtifactTypeSignature = "application/vnd.dev.cosign.artifact.sig.v1+json"
	// signatureType is the payload's critical.type.
	signatureType = "cosign container image signature"
)

// Payload is the simple signing payload.
type Payload struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional map[string]any `json:"optional"`
}

// NewPayload returns the payload signing manifest digest (sha256:...) of
// the repository repo (registry/name, without tag).
func NewPayload(repo, digest string) []byte {
	var p Payload
	p.Critical.Identity.DockerReference = repo
	p.Critical.Image.DockerManifestDigest = digest
	p.Critical.Type = signatureType
	b, _ := json.Marshal(p) // cannot fail: strings and a nil map
	return b
}

// Sign returns the base64 signature of payload, as cosign writes it.
func Sign(key *ecdsa.PrivateKey, payload []byte) (string, error) {
	sum := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}

// errWrongKey is a signature that does not verify with the key.
var errWrongKey = errors.New("signature does not verify with the configured key")

// verifyPayload checks sig (base64) over payload with key and returns the
// manifest digest the payload signs.
func verifyPayload(key *ecdsa.PublicKey, payload []byte, sig string) (string, error) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(sig))
	if err != nil {
		return "", fmt.Errorf("signature annotation is not base64: %w", err)
	}
	sum := sha256.Sum256(payload)
	if !ecdsa.VerifyASN1(key, sum[:], raw) {
		return "", errWrongKey
	}
	var p Payload
	if err := json.Unmarshal(payload, &p); err != nil {
		return "", fmt.Errorf("signed payload: %w", err)
	}
	if p.Critical.Type != signatureType {
		return "", fmt.Errorf("signed payload has type %q, want %q", p.Critical.Type, signatureType)
	}
	return p.Critical.Image.DockerManifestDigest, nil
}

// GenerateKey returns a new ECDSA P-256 key pair as PEM: the private key
// as PKCS #8 ("PRIVATE KEY"), the public key as PKIX ("PUBLIC KEY"), the
// form cosign reads with --key.
func GenerateKey() (private, public []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), nil
}

// ParsePublicKey reads a PEM "PUBLIC KEY" (PKIX) ECDSA P-256 key, as
// cosign generate-key-pair writes cosign.pub.
func ParsePublicKey(data []byte) (*ecdsa.PublicKey, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM PUBLIC KEY")
	}
	k, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PublicKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, errors.New("not an ECDSA P-256 public key")
	}
	return ek, nil
}

// ReadPublicKey reads ParsePublicKey's form from a file.
func ReadPublicKey(path string) (*ecdsa.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := ParsePublicKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// ParsePrivateKey reads a PEM ECDSA P-256 private key: PKCS #8 ("PRIVATE
// KEY", what GenerateKey writes) or SEC 1 ("EC PRIVATE KEY"). cosign's
// password-encrypted cosign.key is not read: `cosign import-key-pair` makes
// one from this form, so one key serves both tools.
func ParsePrivateKey(data []byte) (*ecdsa.PrivateKey, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, errors.New("not a PEM private key")
	}
	var k any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(b.Bytes)
	case "ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY":
		return nil, errors.New("a password-encrypted cosign key: sign with a PEM key from `wasmcsi modules keygen` (cosign import-key-pair turns it into a cosign key)")
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key", b.Type)
	}
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, errors.New("not an ECDSA P-256 private key")
	}
	return ek, nil
}

// KeyID names a public key in logs and cache records: the hex SHA-256 of
// its PKIX encoding, first 16 characters.
func KeyID(k *ecdsa.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return "invalid"
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:8])
}
