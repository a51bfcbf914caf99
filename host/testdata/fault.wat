;; fault: a backend whose create_volume misbehaves on demand, for the
;; daemon's robustness tests. The first letter of the volume name picks:
;;   t...  writes "fault: trap on purpose" to stderr, then traps (unreachable)
;;   l...  loops forever
;;   f...  grows memory a page at a time until the host refuses, then traps
;;   w...  passes its request to the test_wait host call, which blocks until
;;         the test lets it go, then succeeds
;;   other succeeds: the volume's local ID is its name
;; delete_volume always succeeds.
;;
;; The request starts with field 1 (the name): 0x0a, a one-byte length (names
;; under 128 bytes) and the name; those same bytes are a CreateVolumeResponse
;; whose local ID is the name, so success echoes them.
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))
  (import "wasmcsi" "test_wait" (func $test_wait (param i32 i32 i32 i32) (result i64)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))

  ;; [0, 1024) constants, [1024, 5120) request
  (memory (export "memory") 1)
  ;; BackendInfo{Name: "fault", Version: "1.0.0", Description: "misbehaves on demand", Mount: true}
  (data (i32.const 0) "\0a\05fault\12\051.0.0\1a\14misbehaves on demand0\01")
  (data (i32.const 256) "\10\01\00\00\17\00\00\00") ;; iovec {buf 272, len 23}
  (data (i32.const 272) "fault: trap on purpose\n")
  (data (i32.const 320) "name must be under 128 bytes")
  (data (i32.const 352) "test_wait failed")

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))

  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 38))
    (i32.const 0))

  (func (export "create_volume") (result i32)
    (local $n i32) (local $r i64)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 4096)))
    (if (i32.or (i32.gt_u (local.get $n) (i32.const 4096))
                (i32.or (i32.ne (i32.load8_u (i32.const 1024)) (i32.const 0x0a))
                        (i32.ge_u (i32.load8_u (i32.const 1025)) (i32.const 128))))
      (then
        (call $response_write (i32.const 320) (i32.const 28))
        (return (i32.const 3))))
    (block $ok
      (block $wait
        (block $flood
          (block $loop
            (block $trap
              (br_table $trap $loop $flood $wait $ok
                (call $mode (i32.load8_u (i32.const 1026)))))
            ;; t: trap
            (drop (call $fd_write (i32.const 2) (i32.const 256) (i32.const 1) (i32.const 264)))
            (unreachable))
          ;; l: loop
          (loop $forever (br $forever)))
        ;; f: flood
        (loop $grow
          (br_if $grow (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
        (unreachable))
      ;; w: wait, then succeed
      (local.set $r (call $test_wait (i32.const 1024) (local.get $n) (i32.const 0) (i32.const 0)))
      (if (i64.ne (i64.shr_u (local.get $r) (i64.const 32)) (i64.const 0))
        (then
          (call $response_write (i32.const 352) (i32.const 16))
          (return (i32.wrap_i64 (i64.shr_u (local.get $r) (i64.const 32)))))))
    ;; ok: echo the name field as the local ID
    (call $response_write (i32.const 1024) (i32.add (i32.const 2) (i32.load8_u (i32.const 1025))))
    (i32.const 0))

  ;; $mode maps the first letter of the name to a branch of create_volume:
  ;; t 0, l 1, f 2, w 3, anything else 4.
  (func $mode (param $c i32) (result i32)
    (if (i32.eq (local.get $c) (i32.const 0x74)) (then (return (i32.const 0))))
    (if (i32.eq (local.get $c) (i32.const 0x6c)) (then (return (i32.const 1))))
    (if (i32.eq (local.get $c) (i32.const 0x66)) (then (return (i32.const 2))))
    (if (i32.eq (local.get $c) (i32.const 0x77)) (then (return (i32.const 3))))
    (i32.const 4))

  (func (export "delete_volume") (result i32) (i32.const 0)))
