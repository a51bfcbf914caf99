;; flood: create_volume grows memory one page at a time until the host refuses,
;; then aborts the way a guest runtime does when it runs out of memory.
(module
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (result i32)
    (loop $grow
      (br_if $grow (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
    (unreachable)))
