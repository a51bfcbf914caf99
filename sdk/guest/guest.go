// Package guest turns an sdk.Backend into a wasmcsi backend module. A
// module's main package registers its backend in init and has an empty main:
//
//	func init() { guest.Serve(mybackend.New()) }
//	func main() {}
//
// built as a wasip1 reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o my.wasm ./cmd/my
//	tinygo build -target=wasip1 -buildmode=c-shared -scheduler=none -o my.wasm ./cmd/my
//
// The package exports wasmcsi_abi_version and every operation of ABI v1;
// an operation the backend does not implement answers UNIMPLEMENTED and is
// left out of backend_info's Ops, so the host never routes to it. Outside
// wasip1 the package only records the backend (for native tests).
package guest

import "github.com/wasmcsi/wasmcsi/sdk"

var backend sdk.Backend

// Serve registers the module's backend. Call it once, from init.
func Serve(b sdk.Backend) {
	if backend != nil {
		panic("guest.Serve called twice")
	}
	backend = b
}

// Backend returns the registered backend (nil before Serve).
func Backend() sdk.Backend { return backend }
