;; bigtable: declares a table of 1,048,577 entries, one more than
;; MaxTableEntries (8 MiB of Go heap per instance, outside the memory limit).
(module
  (table 1048577 funcref)
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0)))
