// Command opgen writes everything that follows from the operations a module
// may export, so that an operation is declared once: its name is an Op
// constant of abi/names.go (the declaration order is abi.AllOps' order),
// and its request and response are the signature of the method of the same
// name (create_volume: CreateVolume; backend_info: Info) in one of the
// interfaces of sdk/sdk.go. A method with no argument takes Empty; one
// returning only an error answers Empty.
//
// It writes abi/ops_gen.go (AllOps), sdk/ops_gen.go (Implements and the
// per-operation dispatch behind sdk.Dispatch) and sdk/guest/exports_wasip1.go
// (one export per operation). It runs from go generate in abi:
//
//	//go:generate go run ./internal/opgen . ../sdk
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: opgen abi-dir sdk-dir")
		os.Exit(2)
	}
	files, err := Generate(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "opgen:", err)
		os.Exit(1)
	}
	for path, src := range files {
		if old, err := os.ReadFile(path); err == nil && string(old) == string(src) {
			continue
		}
		if err := os.WriteFile(path, src, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "opgen:", err)
			os.Exit(1)
		}
	}
}

// Generate returns the generated files by path.
func Generate(abiDir, sdkDir string) (map[string][]byte, error) {
	ops, err := Load(abiDir, sdkDir)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for name, emit := range map[string]func([]*Op) ([]byte, error){
		filepath.Join(abiDir, "ops_gen.go"):                 emitAllOps,
		filepath.Join(sdkDir, "ops_gen.go"):                 emitSDK,
		filepath.Join(sdkDir, "guest", "exports_wasip1.go"): emitExports,
	} {
		src, err := emit(ops)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = src
	}
	return out, nil
}
