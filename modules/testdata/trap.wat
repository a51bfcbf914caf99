;; trap: create_volume writes a line to stderr, then hits unreachable.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "\10\00\00\00\13\00\00\00") ;; iovec {buf 16, len 19}
  (data (i32.const 16) "boom: disk on fire\n")
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (result i32)
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    (unreachable)))
