;; escape: a backend whose node_stage names storage outside its roots, for
;; the daemon's confinement tests. create_volume succeeds with the volume's
;; name as its local ID; delete_volume always succeeds. node_stage answers by
;; the first letter of the local ID:
;;   a...  the directory /etc
;;   s...  the directory "<staging path>-src" (the test makes it a real
;;         directory inside the roots, or a symlink that leaves them)
;;   d...  the device "<staging path>-src" (the test makes it a link to a
;;         device the grants do not explain)
;;
;; Requests are read at fixed offsets: the tests keep names and paths under
;; 128 bytes and send no volume or publish context, so a NodeStageRequest is
;; 0x0a L [0x0a len local-id] then 0x1a len staging-path.
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))

  ;; [0, 1024) constants, [1024, 5120) request, [8192, ...) answer
  (memory (export "memory") 1)
  ;; BackendInfo{Name: "escape", Version: "1.0.0", Description: "stages outside its roots", Mount: true}
  (data (i32.const 0) "\0a\06escape\12\051.0.0\1a\18stages outside its roots0\01")
  (data (i32.const 256) "request not in the expected layout")
  (data (i32.const 320) "\12\04/etc") ;; NodeStageResponse{Directory: "/etc"}
  (data (i32.const 336) "-src")

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))

  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 43))
    (i32.const 0))

  (func $bad (result i32)
    (call $response_write (i32.const 256) (i32.const 34))
    (i32.const 3))

  (func (export "create_volume") (result i32)
    (local $n i32)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 4096)))
    (if (i32.or (i32.gt_u (local.get $n) (i32.const 4096))
                (i32.or (i32.ne (i32.load8_u (i32.const 1024)) (i32.const 0x0a))
                        (i32.ge_u (i32.load8_u (i32.const 1025)) (i32.const 128))))
      (then (return (call $bad))))
    ;; the name field is a CreateVolumeResponse whose local ID is the name
    (call $response_write (i32.const 1024) (i32.add (i32.const 2) (i32.load8_u (i32.const 1025))))
    (i32.const 0))

  (func (export "delete_volume") (result i32) (i32.const 0))

  (func (export "node_stage") (result i32)
    (local $n i32) (local $off i32) (local $len i32) (local $c i32)
    (local.set $n (call $request_read (i32.const 1024) (i32.const 4096)))
    (if (i32.or (i32.gt_u (local.get $n) (i32.const 4096))
                (i32.or (i32.ne (i32.load8_u (i32.const 1024)) (i32.const 0x0a))
                        (i32.or (i32.ge_u (i32.load8_u (i32.const 1025)) (i32.const 128))
                                (i32.ne (i32.load8_u (i32.const 1026)) (i32.const 0x0a)))))
      (then (return (call $bad))))
    ;; the staging path follows the volume
    (local.set $off (i32.add (i32.const 1026) (i32.load8_u (i32.const 1025))))
    (local.set $len (i32.load8_u (i32.add (local.get $off) (i32.const 1))))
    (if (i32.or (i32.ne (i32.load8_u (local.get $off)) (i32.const 0x1a))
                (i32.ge_u (local.get $len) (i32.const 124)))
      (then (return (call $bad))))
    (local.set $c (i32.load8_u (i32.const 1028)))
    (if (i32.eq (local.get $c) (i32.const 0x61)) ;; a
      (then
        (call $response_write (i32.const 320) (i32.const 6))
        (return (i32.const 0))))
    (if (i32.eq (local.get $c) (i32.const 0x73)) ;; s: field 2, directory
      (then (return (call $beside (i32.const 0x12) (local.get $off) (local.get $len)))))
    (if (i32.eq (local.get $c) (i32.const 0x64)) ;; d: field 1, device
      (then (return (call $beside (i32.const 0x0a) (local.get $off) (local.get $len)))))
    (call $bad))

  ;; $beside answers a NodeStageResponse whose field $tag is the staging
  ;; path (len bytes at off+2) followed by "-src".
  (func $beside (param $tag i32) (param $off i32) (param $len i32) (result i32)
    (i32.store8 (i32.const 8192) (local.get $tag))
    (i32.store8 (i32.const 8193) (i32.add (local.get $len) (i32.const 4)))
    (memory.copy (i32.const 8194) (i32.add (local.get $off) (i32.const 2)) (local.get $len))
    (memory.copy (i32.add (i32.const 8194) (local.get $len)) (i32.const 336) (i32.const 4))
    (call $response_write (i32.const 8192) (i32.add (local.get $len) (i32.const 6)))
    (i32.const 0)))
