;; good: a well-behaved module for the runtime's tests and benchmarks.
;;   backend_info    answers "good" and logs one line
;;   create_volume   echoes its request
;;   delete_volume   passes its request to the test_echo host call and answers
;;                   with that call's result and code (result_read when the
;;                   result does not fit the 16-byte out buffer)
;;   get_capacity    fails with NOT_FOUND "no such pool"
;;   node_info       answers the WASI errno of fd_prestat_get(3): 8 (EBADF)
;;                   because no directory is preopened
;;   volume_health   answers how often _initialize ran on this instance, as i32
;;   storage_health  answers 8 bytes of WASI random_get and the WASI realtime
;;                   clock (i64 ns), to show both are the host's fakes
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))
  (import "wasmcsi" "result_read" (func $result_read (param i32 i32) (result i32)))
  (import "wasmcsi" "log" (func $log (param i32 i32 i32)))
  (import "wasmcsi" "test_echo" (func $test_echo (param i32 i32 i32 i32) (result i64)))
  (import "wasi_snapshot_preview1" "fd_prestat_get" (func $fd_prestat_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock_time_get (param i32 i64 i32) (result i32)))

  ;; [0, 1024) constants and scratch, [1024, 65536) request, [65536, 131072) host-call result
  (memory (export "memory") 2)
  (data (i32.const 0) "good")
  (data (i32.const 16) "hello from good")
  (data (i32.const 32) "request too large")
  (data (i32.const 64) "no such pool")
  (global $inits (mut i32) (i32.const 0))

  (func (export "_initialize")
    (global.set $inits (i32.add (global.get $inits) (i32.const 1))))

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))

  (func (export "backend_info") (result i32)
    (call $log (i32.const 0) (i32.const 16) (i32.const 15))
    (call $response_write (i32.const 0) (i32.const 4))
    (i32.const 0))

  ;; $read pulls the request to 1024 and returns its length, or -1 when it does not fit.
  (func $read (result i32)
    (local $n i32)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 64512)))
    (if (i32.gt_u (local.get $n) (i32.const 64512))
      (then (return (i32.const -1))))
    (local.get $n))

  (func (export "create_volume") (result i32)
    (local $n i32)
    (local.set $n (call $read))
    (if (i32.lt_s (local.get $n) (i32.const 0))
      (then
        (call $response_write (i32.const 32) (i32.const 17))
        (return (i32.const 8))))
    (call $response_write (i32.const 1024) (local.get $n))
    (i32.const 0))

  (func (export "delete_volume") (result i32)
    (local $n i32) (local $r i64) (local $len i32)
    (local.set $n (call $read))
    (if (i32.lt_s (local.get $n) (i32.const 0))
      (then
        (call $response_write (i32.const 32) (i32.const 17))
        (return (i32.const 8))))
    (local.set $r (call $test_echo (i32.const 1024) (local.get $n) (i32.const 65536) (i32.const 16)))
    (local.set $len (i32.wrap_i64 (local.get $r)))
    (if (i32.gt_u (local.get $len) (i32.const 16))
      (then (drop (call $result_read (i32.const 65536) (i32.const 65536)))))
    (call $response_write (i32.const 65536) (local.get $len))
    (i32.wrap_i64 (i64.shr_u (local.get $r) (i64.const 32))))

  (func (export "get_capacity") (result i32)
    (call $response_write (i32.const 64) (i32.const 12))
    (i32.const 5))

  (func (export "node_info") (result i32)
    (i32.store (i32.const 128) (call $fd_prestat_get (i32.const 3) (i32.const 136)))
    (call $response_write (i32.const 128) (i32.const 4))
    (i32.const 0))

  (func (export "volume_health") (result i32)
    (i32.store (i32.const 128) (global.get $inits))
    (call $response_write (i32.const 128) (i32.const 4))
    (i32.const 0))

  (func (export "storage_health") (result i32)
    (drop (call $random_get (i32.const 256) (i32.const 8)))
    (drop (call $clock_time_get (i32.const 0) (i64.const 1) (i32.const 264)))
    (call $response_write (i32.const 256) (i32.const 16))
    (i32.const 0)))
