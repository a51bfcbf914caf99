package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"github.com/tetratelabs/wazero"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules"
	"github.com/wasmcsi/wasmcsi/sdk"
)

// modulesInspect prints what a built module is and asks for:
// wasmcsi modules inspect [--write] FILE.
func modulesInspect(ctx context.Context, args []string, out, errOut io.Writer) error {
	flags := pflag.NewFlagSet("wasmcsi modules inspect", pflag.ContinueOnError)
	flags.SetOutput(errOut)
	write := flags.Bool("write", false, "run the module and write its description into FILE as the custom section "+abi.DescriptionSection+" (replacing one it has)")
	config := flags.StringToString("config", nil, "the module's configuration for configure, key=value,... (backend_info may depend on it)")
	flags.Usage = func() {
		fmt.Fprintf(errOut, `Usage: wasmcsi modules inspect [--write] FILE

prints a built module's name, version, ABI version, the host-call families
it needs granted and its StorageClass parameters (a Markdown table): from
its %s section when it has one, otherwise by loading it against a fake
host and asking backend_info.

`, abi.DescriptionSection)
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if flags.NArg() != 1 {
		flags.Usage()
		return errors.New("modules inspect: want one FILE")
	}
	file := flags.Arg(0)
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("modules inspect: %w", err)
	}
	source := "its " + abi.DescriptionSection + " section"
	desc, found, err := readDescription(data)
	if err != nil {
		return fmt.Errorf("modules inspect %s: %w", file, err)
	}
	if !found || *write {
		if desc, err = describe(ctx, file, data, *config, errOut); err != nil {
			return fmt.Errorf("modules inspect %s: %w", file, err)
		}
		source = "backend_info and its imports"
	}
	if *write {
		sealed, err := writeDescription(data, desc)
		if err != nil {
			return fmt.Errorf("modules inspect %s: %w", file, err)
		}
		tmp := file + ".inspect.tmp"
		if err := os.WriteFile(tmp, sealed, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, file); err != nil {
			os.Remove(tmp)
			return err
		}
		source += ", written to " + filepath.Base(file)
	}
	families := strings.Join(desc.HostCallFamilies, ", ")
	if families == "" {
		families = "none"
	}
	fmt.Fprintf(out, "module:    %s %s\nabi:       %d\nhostcalls: %s\nfrom:      %s\n", desc.Name, desc.Version, desc.ABIVersion, families, source)
	if desc.Description != "" {
		fmt.Fprintf(out, "about:     %s\n", desc.Description)
	}
	fmt.Fprintln(out, "\nStorageClass parameters:")
	if !desc.DeclaresParameters {
		fmt.Fprintln(out, "not declared: the module checks its parameters itself")
		return nil
	}
	_, err = fmt.Fprint(out, sdk.ParameterTable(desc.Parameters))
	return err
}

// describe loads the module against a fake host and builds its
// description from backend_info and its imports.
func describe(ctx context.Context, file string, data []byte, config map[string]string, errOut io.Writer) (*abi.ModuleDescription, error) {
	families, err := importFamilies(ctx, data)
	if err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(file), modules.TinyGoSuffix), ".wasm")
	grant := modules.Grant{HostCalls: families, Roots: []string{"/pool"}, Config: config}
	rt, m, err := loadOne(ctx, file, name, grant, fakeHost(io.Discard), "wasmcsi-inspect", errOut, true)
	if err != nil {
		return nil, err
	}
	defer rt.Close(context.Background())
	var info abi.BackendInfo
	out, err := m.Call(ctx, abi.OpInfo, nil)
	if err != nil {
		return nil, fmt.Errorf("backend_info: %w", err)
	}
	if err := info.UnmarshalWire(out); err != nil {
		return nil, fmt.Errorf("backend_info: %w", err)
	}
	return &abi.ModuleDescription{
		Name: info.Name, Version: info.Version, Description: info.Description,
		ABIVersion: abi.Version, HostCallFamilies: families,
		DeclaresParameters: info.DeclaresParameters, Parameters: info.Parameters,
	}, nil
}

// importFamilies lists the host-call families the module's imports need,
// sorted.
func importFamilies(ctx context.Context, data []byte) ([]string, error) {
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	cm, err := rt.CompileModule(ctx, data)
	if err != nil {
		return nil, err
	}
	family := map[string]string{}
	for _, d := range abi.HostCalls {
		family[d.Name] = d.Family
	}
	var out []string
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if fam, ok := family[name]; ok && mod == abi.HostModule && !slices.Contains(out, fam) {
			out = append(out, fam)
		}
	}
	slices.Sort(out)
	return out, nil
}

var wasmHeader = []byte("\x00asm\x01\x00\x00\x00")

// sections splits a module into its top-level sections (id, the whole
// section's bytes), after checking the header.
func sections(data []byte) ([][]byte, error) {
	if !bytes.HasPrefix(data, wasmHeader) {
		return nil, errors.New("not a WebAssembly module (version 1)")
	}
	var out [][]byte
	for rest := data[len(wasmHeader):]; len(rest) > 0; {
		size, n := binary.Uvarint(rest[1:])
		if n <= 0 || uint64(len(rest)-1-n) < size {
			return nil, errors.New("a section runs past the end of the module")
		}
		end := 1 + n + int(size)
		out = append(out, rest[:end])
		rest = rest[end:]
	}
	return out, nil
}

// customName returns a custom section's name and payload.
func customName(sec []byte) (name string, payload []byte, ok bool) {
	if sec[0] != 0 {
		return "", nil, false
	}
	_, n := binary.Uvarint(sec[1:])
	body := sec[1+n:]
	l, m := binary.Uvarint(body)
	if m <= 0 || uint64(len(body)-m) < l {
		return "", nil, false
	}
	return string(body[m : m+int(l)]), body[m+int(l):], true
}

// readDescription decodes the module's description section, if it has one.
func readDescription(data []byte) (*abi.ModuleDescription, bool, error) {
	secs, err := sections(data)
	if err != nil {
		return nil, false, err
	}
	for _, s := range secs {
		if name, payload, ok := customName(s); ok && name == abi.DescriptionSection {
			d := &abi.ModuleDescription{}
			if err := d.UnmarshalWire(payload); err != nil {
				return nil, false, fmt.Errorf("section %s: %w", abi.DescriptionSection, err)
			}
			return d, true, nil
		}
	}
	return nil, false, nil
}

// writeDescription returns data with its description sections replaced by
// one holding d, at the end.
func writeDescription(data []byte, d *abi.ModuleDescription) ([]byte, error) {
	secs, err := sections(data)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(wasmHeader)
	for _, s := range secs {
		if name, _, ok := customName(s); ok && name == abi.DescriptionSection {
			continue
		}
		out = append(out, s...)
	}
	body := binary.AppendUvarint(nil, uint64(len(abi.DescriptionSection)))
	body = append(body, abi.DescriptionSection...)
	body = d.AppendWire(body)
	out = append(out, 0)
	out = binary.AppendUvarint(out, uint64(len(body)))
	return append(out, body...), nil
}
