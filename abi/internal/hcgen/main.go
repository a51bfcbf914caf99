// Command hcgen writes everything that follows from the host calls declared
// in package abi, so that a host call is declared once. Each HostCall*
// constant of an abi/hc_<family>.go file is one host call:
//
//	// HostCallLoopFind answers the device a file is attached to, if any.
//	HostCallLoopFind = "loop_find" // LoopFileRequest{file} -> LoopFindResponse
//
// The trailing comment is the declaration: request -> response, both
// messages of package abi (Empty for none). It also shapes the SDK wrapper:
//
//   - Req: the wrapper takes req *abi.Req; Empty: it takes nothing;
//     Req{a, b}: it takes Req's fields, in order, as parameters a and b.
//   - Resp: it answers *abi.Resp; Empty: only an error; Resp.Field: the
//     value of that field.
//
// From those it writes abi/hostcalls_gen.go (the table abi.HostCalls) and,
// in sdk/hostcall, calls_gen.go (the wrappers, named after the constant
// without HostCall and documented by its doc comment), imports_wasip1.go
// (one import per call) and imports_native.go (their native stand-ins).
// It runs from go generate in abi:
//
//	//go:generate go run ./internal/hcgen . ../sdk/hostcall
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: hcgen abi-dir sdk-hostcall-dir")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "hcgen:", err)
		os.Exit(1)
	}
}

func run(abiDir, sdkDir string) error {
	files, err := Generate(abiDir, sdkDir)
	if err != nil {
		return err
	}
	for path, src := range files {
		if old, err := os.ReadFile(path); err == nil && string(old) == string(src) {
			continue
		}
		if err := os.WriteFile(path, src, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Generate returns the generated files by path (joined to the two dirs).
func Generate(abiDir, sdkDir string) (map[string][]byte, error) {
	calls, err := Load(abiDir)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for name, emit := range map[string]func([]*HostCall) ([]byte, error){
		filepath.Join(abiDir, "hostcalls_gen.go"):  emitTable,
		filepath.Join(sdkDir, "calls_gen.go"):      emitWrappers,
		filepath.Join(sdkDir, "imports_wasip1.go"): emitImports,
		filepath.Join(sdkDir, "imports_native.go"): emitNative,
	} {
		src, err := emit(calls)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = src
	}
	return out, nil
}
