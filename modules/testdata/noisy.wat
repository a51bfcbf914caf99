;; noisy: floods its output.
;;   create_volume  writes 1 MiB of newlines to stderr, a 64 KiB line without
;;                  a newline to stdout and 1000 lines "spam" through the log
;;                  import, then succeeds
;;   delete_volume  logs one line "quiet" and succeeds
(module
  (import "wasmcsi" "log" (func $log (param i32 i32 i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))

  ;; [0, 64) iovecs and scratch, [65536, +1 MiB) newlines, then 64 KiB of "x"
  (memory (export "memory") 20)
  (data (i32.const 0) "\00\00\01\00\00\00\10\00")  ;; iovec {buf 65536, len 1048576}
  (data (i32.const 8) "\00\00\11\00\00\00\01\00")  ;; iovec {buf 1114112, len 65536}
  (data (i32.const 32) "spam")
  (data (i32.const 40) "quiet")

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))

  (func (export "create_volume") (result i32)
    (local $i i32)
    (memory.fill (i32.const 65536) (i32.const 0x0a) (i32.const 1048576))
    (memory.fill (i32.const 1114112) (i32.const 0x78) (i32.const 65536))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 16)))
    (drop (call $fd_write (i32.const 1) (i32.const 8) (i32.const 1) (i32.const 16)))
    (loop $spam
      (call $log (i32.const 0) (i32.const 32) (i32.const 4))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $spam (i32.lt_u (local.get $i) (i32.const 1000))))
    (i32.const 0))

  (func (export "delete_volume") (result i32)
    (call $log (i32.const 0) (i32.const 40) (i32.const 5))
    (i32.const 0)))
