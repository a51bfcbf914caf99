;; grow: floods its memory on request. The request is the number of 64 KiB
;; pages to reach (u32, little-endian).
;;   create_volume  grows its memory to that size, 1 MiB at a time, writing
;;                  every new page, and succeeds; when a grow fails it traps,
;;                  as a guest runtime aborts when it runs out of memory
;;   delete_volume  does the same, then waits in the test_echo host call
;;                  ("block") until the test lets it go, holding its memory
;;   volume_health  answers its memory size in pages (i32)
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))
  (import "wasmcsi" "test_echo" (func $test_echo (param i32 i32 i32 i32) (result i64)))

  ;; [0, 4) request, [8, 12) answer, [16, 21) "block"
  (memory (export "memory") 1)
  (data (i32.const 16) "block")

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))

  (func (export "create_volume") (result i32)
    (call $grow)
    (i32.const 0))

  (func (export "delete_volume") (result i32)
    (call $grow)
    (drop (call $test_echo (i32.const 16) (i32.const 5) (i32.const 0) (i32.const 0)))
    (i32.const 0))

  (func (export "volume_health") (result i32)
    (i32.store (i32.const 8) (memory.size))
    (call $response_write (i32.const 8) (i32.const 4))
    (i32.const 0))

  ;; $grow grows the memory to the requested pages and writes every new page.
  (func $grow
    (local $target i32) (local $old i32) (local $step i32)
    (i32.store (i32.const 0) (i32.const 0))
    (drop (call $request_read (i32.const 0) (i32.const 4)))
    (local.set $target (i32.load (i32.const 0)))
    (block $done
      (loop $more
        (local.set $old (memory.size))
        (br_if $done (i32.ge_u (local.get $old) (local.get $target)))
        (local.set $step (i32.sub (local.get $target) (local.get $old)))
        (if (i32.gt_u (local.get $step) (i32.const 16))
          (then (local.set $step (i32.const 16))))
        (if (i32.eq (memory.grow (local.get $step)) (i32.const -1))
          (then (unreachable)))
        (memory.fill
          (i32.shl (local.get $old) (i32.const 16))
          (i32.const 0xaa)
          (i32.shl (local.get $step) (i32.const 16)))
        (br $more)))))
