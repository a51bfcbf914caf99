;; startloop: a start function (the module's start section, which
;; instantiation runs) that never returns.
(module
  (memory (export "memory") 1)
  (func $init (loop $forever (br $forever)))
  (start $init)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0)))
