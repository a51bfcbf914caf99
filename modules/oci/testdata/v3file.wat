;; v3file: answers "v3" and imports file_create: it needs the "file" grant.
(module
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))
  (import "wasmcsi" "file_create" (func $file_create (param i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "v3")
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 2))
    (i32.const 0)))
