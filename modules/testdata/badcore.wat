;; badcore: imports request_read with the wrong signature.
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0)))
