package abi

// The codec of every message in this package is generated into *_wire.go
// next to the file that declares it; see CODEC.md.
//go:generate go run ./internal/wiregen .
