;; iovecs: create_volume writes to stdout in one fd_write of 350,000 iovecs,
;; each the same 1 MiB of memory: hours of the host's time in one call.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 64)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (result i32)
    (local $i i32) (local $p i32)
    (local.set $p (i32.const 0x100000))
    (loop $l
      (i32.store (local.get $p) (i32.const 0))
      (i32.store offset=4 (local.get $p) (i32.const 0x100000))
      (local.set $p (i32.add (local.get $p) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 350000))))
    (drop (call $fd_write (i32.const 1) (i32.const 0x100000) (i32.const 350000) (i32.const 0)))
    (i32.const 0)))
