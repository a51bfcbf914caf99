;; bigmin: needs 100 pages (6.25 MiB) of memory from the start.
(module
  (memory (export "memory") 100)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0)))
