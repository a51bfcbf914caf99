;; unknownimport: imports from a module the host does not offer, a host call
;; the daemon does not have, and the function the daemon's loop counter
;; adds (only the daemon may add it).
(module
  (import "env" "abort" (func $abort (param i32)))
  (import "wasmcsi" "frobnicate" (func $frob (param i32 i32 i32 i32) (result i64)))
  (import "wasmcsi_meter" "refuel" (func $refuel (result i32)))
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0)))
