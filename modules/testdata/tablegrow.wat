;; tablegrow: a table of one entry without a maximum, as standard Go
;; declares it. create_volume grows it by 1,048,576 entries, one past
;; MaxTableEntries, and answers OK only when the grow fails; delete_volume
;; grows it by 1,048,575, to exactly MaxTableEntries, and answers OK only
;; when that succeeds. Unbounded, wazero would grow such a table to four
;; billion entries (32 GiB of Go heap).
(module
  (table $t 1 funcref)
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (result i32)
    (if (i32.ne (table.grow $t (ref.null func) (i32.const 1048576)) (i32.const -1))
      (then (unreachable)))
    (i32.const 0))
  (func (export "delete_volume") (result i32)
    (if (i32.eq (table.grow $t (ref.null func) (i32.const 1048575)) (i32.const -1))
      (then (unreachable)))
    (i32.const 0)))
