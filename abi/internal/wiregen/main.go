// Command wiregen writes the wire codec of a package's messages: for each
// source file X.go that declares structs with `wire:"N"` field tags it
// writes X_wire.go with an AppendWire and an UnmarshalWire method per
// struct, built on package abi/wire. It runs from go generate:
//
//	//go:generate go run ./internal/wiregen .
//
// With -utf8 it also writes a ValidUTF8 method per struct (host/state's
// records use it).
//
// It reads source with go/parser and go/ast only; the code it writes uses no
// reflection. It must never write anything but *_wire.go files carrying its
// own header, and never remove a file it did not generate.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "wiregen:", err)
		os.Exit(1)
	}
}

// run parses the command line, generates and writes the files.
func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("wiregen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wireImport := fs.String("wire", DefaultWireImport, "import path of the wire codec package")
	checkUTF8 := fs.Bool("utf8", false, "also write ValidUTF8 methods, for writers that must refuse invalid strings")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: wiregen [-wire importpath] [-utf8] [dir]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir := "."
	switch fs.NArg() {
	case 0:
	case 1:
		dir = fs.Arg(0)
	default:
		fs.Usage()
		return fmt.Errorf("want at most one directory, got %d arguments", fs.NArg())
	}
	out, err := Generate(dir, Options{WireImport: *wireImport, CheckUTF8: *checkUTF8})
	if err != nil {
		return err
	}
	return out.Write(dir)
}
