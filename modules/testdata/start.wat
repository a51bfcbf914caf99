;; start: a start function (the module's start section, which instantiation
;; runs) that loops $n times, n taken from the data segment at byte 0:
;; 1000 in start.wasm. create_volume answers 0 once the loop is done.
(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\e8\03\00\00")
  (global $done (mut i32) (i32.const 0))
  (func $init (local $i i32)
    (loop $l
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.load (i32.const 0)))))
    (global.set $done (i32.const 1)))
  (start $init)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (result i32)
    (i32.sub (i32.const 1) (global.get $done))))
