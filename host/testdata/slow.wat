;; slow: a backend whose create_snapshot never ends (until the call's
;; deadline stops it) while the operator's configuration of the module
;; holds the word "hang", for tests that kill the daemon in the middle of a
;; group snapshot. Otherwise create_snapshot answers at once, ready, with
;; the part of the snapshot's name before its first "/" as the local ID (a
;; group snapshot's member is named "<group>/<volume ID>"). create_volume
;; echoes the name as the local ID; delete_volume and delete_snapshot
;; always succeed.
;;
;; Requests start with field 1 (the name): 0x0a, a one-byte length (names
;; under 128 bytes) and the name; a response whose field 1 is the local ID
;; starts the same way.
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))

  ;; [0, 1024) constants, [1024, 5120) request
  (memory (export "memory") 1)
  ;; BackendInfo{Name: "slow", Version: "1.0.0", Description: "hangs on demand", Mount: true}
  (data (i32.const 0) "\0a\04slow\12\051.0.0\1a\0fhangs on demand0\01")
  (data (i32.const 320) "name must be under 128 bytes")

  ;; $hang is set by configure when the configuration holds "hang".
  (global $hang (mut i32) (i32.const 0))

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))

  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 32))
    (i32.const 0))

  ;; configure looks for the bytes "hang" anywhere in its request.
  (func (export "configure") (result i32)
    (local $n i32) (local $i i32)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 4096)))
    (if (i32.gt_u (local.get $n) (i32.const 4096))
      (then (return (i32.const 3))))
    (block $done
      (loop $scan
        (br_if $done (i32.gt_u (i32.add (local.get $i) (i32.const 4)) (local.get $n)))
        ;; "hang" read as a little-endian i32
        (if (i32.eq (i32.load (i32.add (i32.const 1024) (local.get $i))) (i32.const 0x676e6168))
          (then
            (global.set $hang (i32.const 1))
            (br $done)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
    (i32.const 0))

  ;; $read reads a request that starts with a short name field; it answers
  ;; 0, or the code to return for a request it cannot take.
  (func $read (result i32)
    (local $n i32)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 4096)))
    (if (i32.or (i32.gt_u (local.get $n) (i32.const 4096))
                (i32.or (i32.ne (i32.load8_u (i32.const 1024)) (i32.const 0x0a))
                        (i32.ge_u (i32.load8_u (i32.const 1025)) (i32.const 128))))
      (then
        (call $response_write (i32.const 320) (i32.const 28))
        (return (i32.const 3))))
    (i32.const 0))

  (func (export "create_volume") (result i32)
    (local $code i32)
    (local.set $code (call $read))
    (if (local.get $code) (then (return (local.get $code))))
    (call $response_write (i32.const 1024) (i32.add (i32.const 2) (i32.load8_u (i32.const 1025))))
    (i32.const 0))

  (func (export "delete_volume") (result i32) (i32.const 0))

  (func (export "create_snapshot") (result i32)
    (local $code i32) (local $len i32) (local $k i32)
    (local.set $code (call $read))
    (if (local.get $code) (then (return (local.get $code))))
    (if (global.get $hang)
      (then (loop $forever (br $forever))))
    ;; $k: the length of the name up to its first "/"
    (local.set $len (i32.load8_u (i32.const 1025)))
    (block $found
      (loop $find
        (br_if $found (i32.ge_u (local.get $k) (local.get $len)))
        (br_if $found (i32.eq (i32.load8_u (i32.add (i32.const 1026) (local.get $k))) (i32.const 0x2f)))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $find)))
    ;; field 1 cut to $k bytes, then field 4 (ReadyToUse) true: 0x20 0x01
    (i32.store8 (i32.const 1025) (local.get $k))
    (i32.store8 (i32.add (i32.const 1026) (local.get $k)) (i32.const 0x20))
    (i32.store8 (i32.add (i32.const 1027) (local.get $k)) (i32.const 0x01))
    (call $response_write (i32.const 1024) (i32.add (local.get $k) (i32.const 4)))
    (i32.const 0))

  (func (export "delete_snapshot") (result i32) (i32.const 0)))
