;; v2: a minimal module whose backend_info answers "v2", to tell versions apart.
(module
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "v2")
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 2))
    (i32.const 0)))
