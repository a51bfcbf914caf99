;; liar: a backend whose answers the host must not take on trust, for the
;; tests of what the host checks in a module's answers.
;;   create_volume, create_snapshot  answer, as the local ID, the request's
;;       name up to its first "+" (all of it without one): "shared+a" and
;;       "shared+b" both get "shared", ".." gets "..", a long name a long ID;
;;       an inline volume "x+b" (create_volume name "ephemeral-x+b") gets
;;       "ephemeral-x", the ID of the volume named "ephemeral-x+a"
;;   delete_volume, delete_snapshot  pass their request to the test_note host
;;       call, so a test sees every delete the host asks for, and succeed
;;   node_info  answers a context {"k": 300 times "a"}, too long for a node ID
;;   get_capacity  fails INTERNAL with a message of 6 MiB of "e"
;;
;; The request starts with field 1 (the name): 0x0a, its length as a one- or
;; two-byte varint, and the name. The answer rewrites that field in place to
;; the shortened name: a CreateVolumeResponse or CreateSnapshotResponse whose
;; local ID (field 1) is that prefix.
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))
  (import "wasmcsi" "test_note" (func $test_note (param i32 i32 i32 i32) (result i64)))

  ;; [0, 1024) constants, [1024, 5120) request
  (memory (export "memory") 1)
  ;; BackendInfo{Name: "liar", Version: "1.0.0", Description: "answers IDs it should not", Mount: true, Ephemeral: true}
  (data (i32.const 0) "\0a\04liar\12\051.0.0\1a\19answers IDs it should not0\01\a8\01\01")
  ;; NodeInfoResponse{Context: {"k": ...}}: field 2, entry of 306 bytes, key
  ;; "k", value of 300 bytes (filled with "a" by node_info)
  (data (i32.const 64) "\12\b2\02\0a\01k\12\ac\02")
  (data (i32.const 512) "bad request")

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))

  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 45))
    (i32.const 0))

  (func (export "create_volume") (result i32) (call $prefix))
  (func (export "create_snapshot") (result i32) (call $prefix))
  (func (export "delete_volume") (result i32) (call $note))
  (func (export "delete_snapshot") (result i32) (call $note))

  (func (export "node_info") (result i32)
    (memory.fill (i32.const 73) (i32.const 0x61) (i32.const 300))
    (call $response_write (i32.const 64) (i32.const 309))
    (i32.const 0))

  (func (export "get_capacity") (result i32)
    (if (i32.lt_u (memory.size) (i32.const 97))
      (then (drop (memory.grow (i32.sub (i32.const 97) (memory.size))))))
    (memory.fill (i32.const 65536) (i32.const 0x65) (i32.const 6291456))
    (call $response_write (i32.const 65536) (i32.const 6291456))
    (i32.const 13))

  ;; $prefix answers the name up to its first "+" as the local ID.
  (func $prefix (result i32)
    (local $n i32) (local $start i32) (local $len i32) (local $i i32)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 4096)))
    (if (i32.or (i32.gt_u (local.get $n) (i32.const 4096))
                (i32.ne (i32.load8_u (i32.const 1024)) (i32.const 0x0a)))
      (then (return (call $bad))))
    (local.set $len (i32.load8_u (i32.const 1025)))
    (local.set $start (i32.const 1026))
    (if (i32.ge_u (local.get $len) (i32.const 0x80))
      (then
        (local.set $len (i32.or (i32.and (local.get $len) (i32.const 0x7f))
                                (i32.shl (i32.load8_u (i32.const 1026)) (i32.const 7))))
        (local.set $start (i32.const 1027))))
    (block $done
      (loop $scan
        (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
        (br_if $done (i32.eq (i32.load8_u (i32.add (local.get $start) (local.get $i))) (i32.const 0x2b)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
    (if (i32.ge_u (local.get $i) (i32.const 0x80))
      (then (return (call $bad))))
    (i32.store8 (i32.sub (local.get $start) (i32.const 2)) (i32.const 0x0a))
    (i32.store8 (i32.sub (local.get $start) (i32.const 1)) (local.get $i))
    (call $response_write (i32.sub (local.get $start) (i32.const 2)) (i32.add (local.get $i) (i32.const 2)))
    (i32.const 0))

  ;; $note hands the request to test_note and succeeds.
  (func $note (result i32)
    (local $n i32)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 4096)))
    (if (i32.gt_u (local.get $n) (i32.const 4096))
      (then (return (call $bad))))
    (drop (call $test_note (i32.const 1024) (local.get $n) (i32.const 0) (i32.const 0)))
    (i32.const 0))

  (func $bad (result i32)
    (call $response_write (i32.const 512) (i32.const 11))
    (i32.const 3)))
