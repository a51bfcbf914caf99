;; badversion: speaks ABI version 2.
(module
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 2))
  (func (export "backend_info") (result i32) (i32.const 0)))
