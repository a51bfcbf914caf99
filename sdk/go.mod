module github.com/wasmcsi/wasmcsi/sdk

go 1.26.0

require github.com/wasmcsi/wasmcsi/abi v0.0.0-00010101000000-000000000000

replace github.com/wasmcsi/wasmcsi/abi => ../abi
