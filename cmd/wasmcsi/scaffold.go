package main

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/spf13/pflag"
)

//go:embed scaffold/*.tmpl
var scaffold embed.FS

// moduleNameRE is what the daemon accepts as a module's name (its file
// name without .wasm).
var moduleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// modulesNew writes a new module's folder: wasmcsi modules new NAME.
func modulesNew(args []string, out io.Writer) error {
	flags := pflag.NewFlagSet("wasmcsi modules new", pflag.ContinueOnError)
	flags.SetOutput(out)
	sdk := flags.String("sdk", "../wasmcsi", "the wasmcsi source tree go.mod's replace lines point at (relative to the new folder, or absolute)")
	module := flags.String("module", "", "the Go module path (default example.com/NAME)")
	flags.Usage = func() {
		fmt.Fprint(out, "Usage: wasmcsi modules new NAME [flags]\n\nwrites the folder NAME: a backend module that builds and passes its tests as written\n\n")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if flags.NArg() != 1 {
		flags.Usage()
		return errors.New("modules new: want one NAME")
	}
	name := flags.Arg(0)
	if !moduleNameRE.MatchString(name) {
		return fmt.Errorf("modules new: name %q must match %s (it is the module's file name and the StorageClass's backend)", name, moduleNameRE)
	}
	if *module == "" {
		*module = "example.com/" + name
	}
	data := struct{ Name, Module, SDK string }{name, *module, filepath.ToSlash(*sdk)}
	files := map[string][]byte{}
	tmpls, err := fs.Glob(scaffold, "scaffold/*.tmpl")
	if err != nil {
		return err
	}
	for _, t := range tmpls {
		src, err := scaffold.ReadFile(t)
		if err != nil {
			return err
		}
		tmpl, err := template.New(t).Parse(string(src))
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := tmpl.Execute(&b, data); err != nil {
			return err
		}
		files[strings.TrimSuffix(filepath.Base(t), ".tmpl")] = b.Bytes()
	}
	if err := os.Mkdir(name, 0o755); err != nil {
		return fmt.Errorf("modules new: %w", err)
	}
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(name, f), b, 0o644); err != nil {
			return fmt.Errorf("modules new: %w", err)
		}
	}
	fmt.Fprintf(out, "wrote %s/: go.mod (wasmcsi from %s), main.go, main_test.go, module_test.go, config.yaml, Makefile, README.md\nnext: cd %s && go mod tidy && make build test\n", name, data.SDK, name)
	return nil
}
