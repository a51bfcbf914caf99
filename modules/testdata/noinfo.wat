;; noinfo: lacks the required backend_info export.
(module
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "create_volume") (result i32) (i32.const 0)))
