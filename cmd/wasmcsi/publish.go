package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules/oci"
)

// modulesPush publishes a built module to a registry and signs it:
// wasmcsi modules push FILE oci://REGISTRY/REPO:TAG --key wasmcsi.key.
func modulesPush(ctx context.Context, args []string, out, errOut io.Writer) error {
	flags := pflag.NewFlagSet("wasmcsi modules push", pflag.ContinueOnError)
	flags.SetOutput(errOut)
	keyFile := flags.String("key", "", "PEM ECDSA P-256 private key that signs the module (wasmcsi modules keygen)")
	unsigned := flags.Bool("unsigned", false, "push without a signature (a daemon refuses such a module)")
	plainHTTP := flags.Bool("plain-http", false, "reach the registry without TLS")
	authFile := flags.String("auth-file", "", "Docker config.json with registry credentials (default: docker login's)")
	flags.Usage = func() {
		fmt.Fprint(errOut, `Usage: wasmcsi modules push FILE oci://REGISTRY/REPO:TAG --key wasmcsi.key

publishes a built module as an OCI artifact in the CNCF wasm layout (config
application/vnd.wasm.config.v0+json, one application/wasm layer), its
description (as wasmcsi modules inspect prints it) in the manifest's
annotations, and signs the manifest in the cosign simple signing format:
a daemon configured with the public key accepts it, and so does cosign
verify --key wasmcsi.pub --insecure-ignore-tlog=true (no transparency log).

`)
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if flags.NArg() != 2 {
		flags.Usage()
		return errors.New("modules push: want FILE and REF")
	}
	file, ref := flags.Arg(0), flags.Arg(1)
	if (*keyFile == "") == !*unsigned {
		return errors.New("modules push: name the signing key with --key (or push --unsigned)")
	}
	opt := oci.PushOptions{PlainHTTP: *plainHTTP, AuthFile: *authFile, DockerAuth: *authFile == ""}
	if *keyFile != "" {
		pem, err := os.ReadFile(*keyFile)
		if err != nil {
			return fmt.Errorf("modules push: %w", err)
		}
		if opt.Key, err = oci.ParsePrivateKey(pem); err != nil {
			return fmt.Errorf("modules push: %s: %w", *keyFile, err)
		}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("modules push: %w", err)
	}
	desc, found, err := readDescription(data)
	if err != nil {
		return fmt.Errorf("modules push %s: %w", file, err)
	}
	if !found {
		if desc, err = describe(ctx, file, data, nil, errOut); err != nil {
			return fmt.Errorf("modules push %s: %w", file, err)
		}
	}
	if opt.Annotations, err = annotations(desc); err != nil {
		return err
	}
	d, err := oci.Push(ctx, ref, data, opt)
	if err != nil {
		return fmt.Errorf("modules push: %w", err)
	}
	signed := "unsigned"
	if opt.Key != nil {
		signed = "signed by key " + oci.KeyID(&opt.Key.PublicKey)
	}
	r, _ := oci.ParseRef(ref)
	fmt.Fprintf(out, "pushed %s %s as %s@%s, %s\n", desc.Name, desc.Version, oci.Scheme+r.Repo(), d, signed)
	return nil
}

// annotations are a module's description as manifest annotations.
func annotations(d *abi.ModuleDescription) (map[string]string, error) {
	a := map[string]string{
		oci.AnnotationTitle:     d.Name,
		oci.AnnotationModule:    d.Name,
		oci.AnnotationVersion:   d.Version,
		oci.AnnotationABI:       strconv.FormatInt(d.ABIVersion, 10),
		oci.AnnotationHostCalls: strings.Join(d.HostCallFamilies, ","),
	}
	if d.Description != "" {
		a["org.opencontainers.image.description"] = d.Description
	}
	if d.DeclaresParameters {
		b, err := json.Marshal(d.Parameters)
		if err != nil {
			return nil, err
		}
		a[oci.AnnotationParameters] = string(b)
	}
	return a, nil
}

// modulesKeygen writes a signing key pair: wasmcsi modules keygen [PREFIX].
func modulesKeygen(args []string, out, errOut io.Writer) error {
	flags := pflag.NewFlagSet("wasmcsi modules keygen", pflag.ContinueOnError)
	flags.SetOutput(errOut)
	flags.Usage = func() {
		fmt.Fprint(errOut, `Usage: wasmcsi modules keygen [PREFIX]

writes PREFIX.key (the private ECDSA P-256 key, PEM PKCS #8, mode 0600) and
PREFIX.pub (its public key, PEM, as cosign.pub) for wasmcsi modules push
--key and the daemon's oci.key. PREFIX defaults to "wasmcsi". Existing files
are never replaced.

`)
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	prefix := "wasmcsi"
	switch flags.NArg() {
	case 0:
	case 1:
		prefix = flags.Arg(0)
	default:
		flags.Usage()
		return errors.New("modules keygen: at most one PREFIX")
	}
	priv, pub, err := oci.GenerateKey()
	if err != nil {
		return err
	}
	if err := writeNew(prefix+".key", priv, 0o600); err != nil {
		return fmt.Errorf("modules keygen: %w", err)
	}
	if err := writeNew(prefix+".pub", pub, 0o644); err != nil {
		os.Remove(prefix + ".key")
		return fmt.Errorf("modules keygen: %w", err)
	}
	k, _ := oci.ParsePublicKey(pub)
	fmt.Fprintf(out, "wrote %s.key (keep it secret) and %s.pub (key %s)\n", prefix, prefix, oci.KeyID(k))
	return nil
}

// writeNew creates path with data, failing if it exists.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
