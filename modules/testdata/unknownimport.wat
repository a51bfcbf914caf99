;; unknownimport: imports from a module the host does not offer, and a host
;; call the daemon does not have.
(module
  (import "env" "abort" (func $abort (param i32)))
  (import "wasmcsi" "frobnicate" (func $frob (param i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0)))
