module github.com/wasmcsi/wasmcsi/abi

go 1.26.0

require (
	github.com/tetratelabs/wazero v1.12.0
	google.golang.org/protobuf v1.36.12
)

require golang.org/x/sys v0.44.0 // indirect
